/* The fake segment layer (fake_segments.h): the services of
 * segments/services.h over bookkeeping, with the real layer's contracts
 * checked. */
#include "fake_segments.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"

/* Ranges start on 2 MiB, as the device's do, and a gap apart, so that no
 * two segments look adjacent. */
#define FAKE_BASE ((uintptr_t)1 << 44)
#define FAKE_ALIGN ((size_t)2 << 20)

static void misuse(ta_segments *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("  fake segments: misuse: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  s->misuse++;
}

ta_segments *fake_segments_new(void) {
  ta_segments *s = calloc(1, sizeof *s);
  if (s) s->next_addr = FAKE_BASE;
  return s;
}

static uintptr_t take_addresses(ta_segments *s, size_t bytes) {
  uintptr_t addr = s->next_addr;
  s->next_addr += ta_align_up(bytes, FAKE_ALIGN) + FAKE_ALIGN;
  return addr;
}

static int device_has(const ta_segments *s, size_t bytes) {
  return !s->device_limit || (s->device_bytes <= s->device_limit && bytes <= s->device_limit - s->device_bytes);
}

static int add_live(ta_segments *s, ta_segment *seg) {
  if (s->nlive == s->cap_live) {
    size_t cap = s->cap_live ? 2 * s->cap_live : 64;
    ta_segment **live = realloc(s->live, cap * sizeof *live);
    if (!live) return -1;
    s->live = live;
    s->cap_live = cap;
  }
  s->live[s->nlive++] = seg;
  return 0;
}

static void remove_live(ta_segments *s, ta_segment *seg) {
  for (size_t i = 0; i < s->nlive; i++)
    if (s->live[i] == seg) {
      s->live[i] = s->live[--s->nlive];
      break;
    }
  for (size_t i = 0; i < s->ndrained; i++)
    if (s->drained[i] == seg) s->drained[i--] = s->drained[--s->ndrained];
}

/* Both the descriptor and its segment go; the caller checked it is the only block. */
static void free_segment(ta_segments *s, ta_segment *seg) {
  remove_live(s, seg);
  ta_segments_block_delete(s, seg->first);
  if (seg->expansion) free(seg->expansion->mapped);
  free(seg->expansion);
  free(seg);
}

void fake_segments_destroy(ta_segments *s) {
  if (!s) return;
  while (s->nlive) {
    ta_segment *seg = s->live[s->nlive - 1];
    for (ta_block *b = seg->first, *next; b != seg->last; b = next) {
      next = b->next;
      ta_segments_block_delete(s, b);
    }
    seg->first = seg->last;
    free_segment(s, seg);
  }
  free(s->live);
  free(s);
}

/* ------------------------------------------------------------------------
 * Descriptors and ordinary segments
 * ---------------------------------------------------------------------- */

ta_block *ta_segments_block_new(ta_segments *s) {
  if (s->fail_block_new > 0 && --s->fail_block_new == 0) return NULL;
  ta_block *b = malloc(sizeof *b);
  if (!b) return NULL;
  memset(b, 0xA5, sizeof *b); /* uninitialised, as the slab's: a field the part forgets to set reads as junk */
  s->blocks++;
  return b;
}

void ta_segments_block_delete(ta_segments *s, ta_block *b) {
  s->blocks--;
  free(b);
}

static ta_segment *new_segment(ta_segments *s, size_t size, cudaStream_t stream, int pool, void *owner,
                               ta_policy *policy, ta_block **first) {
  ta_segment *seg = calloc(1, sizeof *seg);
  ta_block *b = ta_segments_block_new(s);
  if (!seg || !b || add_live(s, seg)) {
    free(seg);
    if (b) ta_segments_block_delete(s, b);
    return NULL;
  }
  *seg = (ta_segment){.size = size, .stream = stream, .first = b, .last = b, .owner = owner, .policy_instance = policy,
                      .pool = (uint8_t)pool, .policy = policy->id};
  *b = (ta_block){.size = size, .segment = seg, .stream = stream, .owner = owner, .policy = policy->id,
                  .state = TA_BLOCK_FREE};
  *first = b;
  return seg;
}

ta_segment *ta_segments_alloc(ta_segments *s, size_t size, cudaStream_t stream, int pool, void *owner,
                              ta_policy *policy) {
  if (size == 0 || size % 512) misuse(s, "alloc of %zu bytes", size);
  if (pool != TA_POOL_SMALL && pool != TA_POOL_LARGE) misuse(s, "alloc in pool %d", pool);
  if (!device_has(s, size)) return NULL;
  ta_block *b;
  ta_segment *seg = new_segment(s, size, stream, pool, owner, policy, &b);
  if (!seg) return NULL;
  seg->addr = b->addr = take_addresses(s, size);
  s->device_bytes += size;
  s->allocs++;
  return seg;
}

/* The real layer asserts these before giving a segment back. */
static int releasable(ta_segments *s, const ta_segment *seg, int expandable) {
  const ta_block *b = seg->first;
  if (!seg->expansion != !expandable)
    misuse(s, "release of %s segment through the other call", expandable ? "an ordinary" : "an expandable");
  else if (b != seg->last || b->next || b->prev) misuse(s, "release of a segment with more than one block");
  else if (b->state != TA_BLOCK_FREE) misuse(s, "release of a segment whose block is in state %d", b->state);
  else if (b->addr != seg->addr || b->size != seg->size) misuse(s, "release of a segment its block does not span");
  else return 1;
  return 0;
}

void ta_segments_release(ta_segments *s, ta_segment *seg) {
  if (!releasable(s, seg, 0)) return;
  s->device_bytes -= seg->size;
  s->releases++;
  free_segment(s, seg);
}

void ta_segments_note_inactive_split(ta_segments *s, const ta_block *b, int sign) {
  if (!ta_block_is_split(b)) misuse(s, "inactive_split note for a block that is its segment");
  if (sign != 1 && sign != -1) misuse(s, "inactive_split note of %d", sign);
  s->inactive_split += sign;
  s->inactive_split_bytes += sign * (int64_t)b->size;
}

/* ------------------------------------------------------------------------
 * Expandable segments: granules mapped or not
 * ---------------------------------------------------------------------- */

size_t ta_segments_granule(const ta_segments *s) { return s->granule; }

ta_free_census *ta_segments_census(const ta_segments *s) { return s->census; }

size_t ta_segments_handle_size(const ta_segments *s, int pool) {
  (void)pool;
  return s->granule;
}

size_t ta_segments_granule_of(const ta_segment *seg) { return seg->expansion->granule; }

size_t ta_segments_addresses_left(const ta_segment *seg) { return seg->expansion->reserved - seg->size; }

int fake_segments_mapped_at(const ta_segment *seg, uintptr_t addr) {
  return !seg->expansion || seg->expansion->mapped[(addr - seg->addr) / seg->expansion->granule];
}

/* Granules [*first, *end) that [addr, addr + len) touches (`whole` 0) or holds wholly (1). */
static void granules_of(const ta_segment *seg, uintptr_t addr, size_t len, int whole, size_t *first, size_t *end) {
  size_t g = seg->expansion->granule, lo = addr - seg->addr, hi = lo + len;
  *first = (whole ? ta_align_up(lo, g) : lo) / g;
  *end = (whole ? hi : ta_align_up(hi, g)) / g;
  if (*end < *first) *end = *first;
}

static int in_segment(ta_segments *s, const ta_segment *seg, uintptr_t addr, size_t len, const char *what) {
  if (!seg->expansion) misuse(s, "%s on an ordinary segment", what);
  else if (addr < seg->addr || len > seg->size || addr - seg->addr > seg->size - len)
    misuse(s, "%s past the segment", what);
  else return 1;
  return 0;
}

ta_segment *ta_segments_alloc_expandable(ta_segments *s, size_t size, cudaStream_t stream, int pool, void *owner,
                                         ta_policy *policy, int *status) {
  *status = TA_ENOSPACE;
  size_t g = s->granule, reserved = (s->reserve_granules ? s->reserve_granules : 64) * g;
  if (!g || s->no_addresses || size == 0 || ta_align_up(size, g) > reserved) return NULL;
  size = ta_align_up(size, g);
  *status = TA_ENOMEM;
  if (!device_has(s, size)) return NULL;
  ta_block *b;
  ta_expansion *x = calloc(1, sizeof *x);
  uint8_t *mapped = calloc(reserved / g, 1);
  ta_segment *seg = x && mapped ? new_segment(s, size, stream, pool, owner, policy, &b) : NULL;
  if (!seg) {
    free(mapped);
    free(x);
    return NULL;
  }
  *x = (ta_expansion){.granule = g, .reserved = reserved, .mapped = mapped};
  memset(mapped, 1, size / g);
  seg->expansion = x;
  seg->addr = b->addr = take_addresses(s, reserved);
  unsigned shift = 0;
  while (((size_t)1 << shift) < g) shift++;
  seg->granule_shift = shift;
  s->device_bytes += size;
  s->allocs++;
  *status = TA_OK;
  return seg;
}

void ta_segments_release_expandable(ta_segments *s, ta_segment *seg) {
  if (!releasable(s, seg, 1)) return;
  s->device_bytes -= seg->size - seg->unmapped;
  s->releases++;
  free_segment(s, seg);
}

int ta_segments_grow(ta_segments *s, ta_segment *seg, size_t bytes) {
  ta_expansion *x = seg->expansion;
  if (!x || bytes == 0 || bytes % x->granule) {
    misuse(s, "grow by %zu bytes", bytes);
    return TA_ENOMEM;
  }
  if (bytes > x->reserved - seg->size) return TA_ENOSPACE;
  if (!device_has(s, bytes)) return TA_ENOMEM;
  memset(x->mapped + seg->size / x->granule, 1, bytes / x->granule);
  seg->size += bytes;
  s->device_bytes += bytes;
  s->grows++;
  return TA_OK;
}

size_t ta_segments_unmapped_in(const ta_segment *seg, uintptr_t addr, size_t len) {
  size_t first, end, n = 0;
  granules_of(seg, addr, len, 0, &first, &end);
  for (size_t g = first; g < end; g++) n += !seg->expansion->mapped[g];
  return n * seg->expansion->granule;
}

int ta_segments_map(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  if (!in_segment(s, seg, addr, len, "map")) return TA_ENOMEM;
  size_t first, end, need = ta_segments_unmapped_in(seg, addr, len);
  if (!device_has(s, need)) return TA_ENOMEM; /* nothing new stays mapped */
  granules_of(seg, addr, len, 0, &first, &end);
  memset(seg->expansion->mapped + first, 1, end - first);
  seg->unmapped -= need;
  s->device_bytes += need;
  s->maps++;
  return TA_OK;
}

size_t ta_segments_unmap(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  if (!in_segment(s, seg, addr, len, "unmap")) return 0;
  size_t first, end, n = 0;
  granules_of(seg, addr, len, 1, &first, &end);
  for (size_t g = first; g < end; g++) {
    n += seg->expansion->mapped[g];
    seg->expansion->mapped[g] = 0;
  }
  size_t bytes = n * seg->expansion->granule;
  seg->unmapped += bytes;
  s->device_bytes -= bytes;
  s->unmaps += n > 0;
  return bytes;
}

void ta_segments_shrink(ta_segments *s, ta_segment *seg, size_t new_size) {
  if (!seg->expansion || new_size == 0 || new_size >= seg->size || new_size % seg->expansion->granule) {
    misuse(s, "shrink of a %zu-byte segment to %zu bytes", seg->size, new_size);
    return;
  }
  if (seg->last->addr + seg->last->size != seg->addr + new_size) misuse(s, "shrink past its last block");
  size_t tail = seg->size - new_size;
  ta_segments_unmap(s, seg, seg->addr + new_size, tail);
  seg->unmapped -= tail; /* past the end now: neither mapped nor part of the segment */
  seg->size = new_size;
  s->shrinks++;
}

int ta_segments_mapped_window(const ta_segment *seg, uintptr_t lo, uintptr_t hi, size_t len, uintptr_t *at) {
  size_t first, end, g = seg->expansion->granule;
  granules_of(seg, lo, hi - lo, 0, &first, &end);
  for (size_t run = first, stop; run < end; run = stop + 1) {
    while (run < end && !seg->expansion->mapped[run]) run++;
    for (stop = run; stop < end && seg->expansion->mapped[stop];) stop++;
    uintptr_t from = seg->addr + run * g, to = seg->addr + stop * g;
    if (from < lo) from = lo;
    if (to > hi) to = hi;
    if (run < end && to - from >= len) {
      *at = from;
      return 1;
    }
  }
  return 0;
}

size_t ta_segments_handle_edge(const ta_segment *seg, size_t offset) {
  (void)seg;
  return offset;
}

int ta_segments_mapped_run(const ta_segment *seg, uintptr_t lo, uintptr_t hi, size_t want, uintptr_t *run_lo,
                           uintptr_t *run_hi) {
  size_t first, end, run, stop, need = (want + seg->expansion->granule - 1) / seg->expansion->granule;
  granules_of(seg, lo, hi - lo, 1, &first, &end);
  for (run = first; run < end && !seg->expansion->mapped[run];) run++;
  if (run == end) return 0;
  for (stop = run; stop < end && stop - run < need && seg->expansion->mapped[stop];) stop++;
  *run_lo = seg->addr + run * seg->expansion->granule;
  *run_hi = seg->addr + stop * seg->expansion->granule;
  return 1;
}

int ta_segments_would_raise_peak(ta_segments *s, size_t bytes) {
  (void)bytes;
  return s->raise_peak;
}

int ta_segments_may_remap(const ta_segments *s) {
  (void)s;
  return 1;
}

/* As the real layer's: one free block and nothing mapped, queued once. */
static void note_if_drained(ta_segments *s, ta_segment *seg) {
  if (!ta_segments_nothing_mapped(seg) || seg->first != seg->last) return;
  for (size_t i = 0; i < s->ndrained; i++)
    if (s->drained[i] == seg) return;
  if (s->ndrained < sizeof s->drained / sizeof *s->drained) s->drained[s->ndrained++] = seg;
}

size_t ta_segments_unmap_free(ta_segments *s, size_t want, const ta_block *keep) {
  size_t released = 0;
  for (size_t i = 0; i < s->nlive && released < want; i++) {
    ta_segment *seg = s->live[i];
    if (!seg->expansion) continue;
    for (ta_block *b = seg->first; b && released < want; b = b->next)
      if (b->state == TA_BLOCK_FREE && b != keep) released += ta_segments_unmap(s, seg, b->addr, b->size);
    note_if_drained(s, seg);
  }
  return released;
}

ta_segment *ta_segments_next_drained(ta_segments *s) { return s->ndrained ? s->drained[--s->ndrained] : NULL; }

/* ------------------------------------------------------------------------
 * Reclaim (fake_segments.h): a device with nothing past; what only a
 * segment with markers reaches is a misuse here.
 * ---------------------------------------------------------------------- */

void ta_segments_marks_poll(ta_segments *s) { (void)s; }

void ta_segments_marks_record(ta_segments *s) { (void)s; }

void ta_segments_marks_progress(ta_segments *s, ta_stream_marks *m) {
  (void)m;
  misuse(s, "marks_progress: no fake segment has markers");
}

void ta_segments_marks_activate(ta_segments *s, ta_stream_marks *m) {
  (void)m;
  misuse(s, "marks_activate: no fake segment has markers");
}

int ta_segments_range_past(const ta_segment *seg, uintptr_t addr, size_t len) {
  (void)seg, (void)addr, (void)len;
  return 0;
}

size_t ta_segments_take_past(ta_segments *s, size_t want, size_t granule, const ta_block *keep) {
  (void)s, (void)want, (void)granule, (void)keep;
  return 0;
}

void ta_segments_lend(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  (void)seg, (void)addr, (void)len;
  misuse(s, "lend: no fake segment has markers");
}

void ta_segments_retire(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  (void)seg, (void)addr, (void)len;
  misuse(s, "retire: no fake segment has markers");
}

void ta_segments_donors_drop(ta_segments *s) { (void)s; }

int ta_segments_move_allowed(ta_segments *s, cudaStream_t stream, int must) {
  (void)s, (void)stream, (void)must;
  return 1;
}

uint64_t ta_segments_move_since(ta_segments *s) {
  (void)s;
  return 0;
}

void ta_segments_move_charge(ta_segments *s, uint64_t since) { (void)s, (void)since; }
