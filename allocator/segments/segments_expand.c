/* Expandable segments (policy.h, segments.h): one address range reserved
 * once, backed by device memory granule by granule.
 *
 * Why: an ordinary segment is one device allocation of a fixed size, so a
 * request that no free block fits needs a new segment even when the free
 * bytes are there, split across segments; and a segment with one live block
 * left cannot be given back. An expandable segment turns the free block at
 * its end into as much room as the device has, and any free granule, at its
 * end or between live blocks, can be unmapped (its memory given back) and
 * mapped again when a block needs it: what is reserved follows what lives.
 *
 * Each granule is its own physical allocation, so any one can be unmapped.
 * The log sees every run of granules mapped as a SEGMENT_ALLOC and every run
 * unmapped as a SEGMENT_FREE, flagged TA_LOG_SEGMENT_EXPANDABLE (PyTorch's
 * memory viewer calls them segment_map / segment_unmap). */
#include <stdlib.h>
#include <string.h>

#include "segments/segments.h"
#include "accounting/stats.h"

#define TA_EXPANDABLE_MAX_RESERVE ((size_t)1 << 40)

size_t ta_segments_granule(const ta_segments *s) { return s->granule; }

int ta_segments_would_raise_peak(const ta_segments *s, size_t bytes) {
  return !s->no_sync && ta_stat_total(s->stats->reserved_bytes) + (int64_t)bytes > s->high_water;
}


static int reserve_handles(ta_expansion *x, size_t granules) {
  if (granules <= x->cap_handles) return 0;
  size_t cap = x->cap_handles ? x->cap_handles : 16;
  while (cap < granules) cap *= 2;
  uint64_t *h = realloc(x->handles, cap * sizeof *h);
  if (!h) return -1;
  memset(h + x->cap_handles, 0, (cap - x->cap_handles) * sizeof *h);
  x->handles = h;
  x->cap_handles = cap;
  return 0;
}

/* Map granules [first, first + n), all unmapped; stats and log included. */
static int map_run(ta_segments *s, ta_segment *seg, size_t first, size_t n) {
  ta_expansion *x = seg->expansion;
  size_t bytes = n * x->granule;
  if (s->limit && (size_t)ta_stat_total(s->stats->reserved_bytes) + bytes > s->limit) return TA_ENOMEM;
  uintptr_t addr = seg->addr + first * x->granule;
  if (s->backend->ops->map(s->backend, s->device, addr, bytes, x->handles + first) != TA_OK) return TA_ENOMEM;
  ta_segments_account(s, seg, addr, bytes, +1);
  return TA_OK;
}

static void unmap_run(ta_segments *s, ta_segment *seg, size_t first, size_t n, int account) {
  ta_expansion *x = seg->expansion;
  size_t bytes = n * x->granule;
  uintptr_t addr = seg->addr + first * x->granule;
  if (account) ta_segments_account(s, seg, addr, bytes, -1);
  s->backend->ops->unmap(s->backend, s->device, addr, bytes, x->handles + first);
  memset(x->handles + first, 0, n * sizeof *x->handles);
}

ta_segment *ta_segments_alloc_expandable(ta_segments *s, size_t size, cudaStream_t stream, int pool, void *owner,
                                         ta_policy *policy, int *status) {
  *status = TA_ENOSPACE;
  if (!s->granule) return NULL;
  size_t free_b = 0, total = 0;
  if (s->backend->ops->mem_info(s->backend, s->device, &free_b, &total) != TA_OK || total == 0) return NULL;
  /* As many addresses as the device has bytes (the segment can then grow to
   * anything the device could give it), but at most 1 TiB: a simulated
   * device of replay's unlimited capacity must still hold many of them. */
  size_t reserved = ta_align_up(total < TA_EXPANDABLE_MAX_RESERVE ? total : TA_EXPANDABLE_MAX_RESERVE, s->granule);
  size = ta_align_up(size, s->granule);
  if (size > reserved) return NULL;
  *status = TA_ENOMEM;
  ta_segment *seg = calloc(1, sizeof *seg);
  ta_expansion *x = calloc(1, sizeof *x);
  ta_block *b = ta_segments_block_new(s);
  uintptr_t addr = 0;
  if (!seg || !x || !b || reserve_handles(x, size / s->granule)) goto fail;
  if (s->backend->ops->reserve(s->backend, s->device, reserved, &addr) != TA_OK) {
    *status = TA_ENOSPACE;
    goto fail;
  }
  x->reserved = reserved;
  x->granule = s->granule;
  *seg = (ta_segment){.addr = addr, .size = size, .stream = stream, .first = b, .last = b, .expansion = x,
                      .owner = owner, .policy_instance = policy, .pool = (uint8_t)pool, .policy = policy->id};
  if (ta_segments_register(s, seg)) {
    s->backend->ops->unreserve(s->backend, s->device, addr, reserved);
    goto fail;
  }
  if (map_run(s, seg, 0, size / s->granule) != TA_OK) {
    ta_segments_unregister(s, seg);
    s->backend->ops->unreserve(s->backend, s->device, addr, reserved);
    goto fail;
  }
  *b = (ta_block){.addr = addr, .size = size, .segment = seg, .stream = stream, .owner = owner, .policy = policy->id,
                  .state = TA_BLOCK_FREE};
  ta_stats_add(s->stats->segment, pool, 1);
  return seg;
fail:
  if (x) free(x->handles);
  free(seg);
  free(x);
  if (b) ta_segments_block_delete(s, b);
  return NULL;
}

int ta_segments_grow(ta_segments *s, ta_segment *seg, size_t bytes) {
  ta_expansion *x = seg->expansion;
  ta_assert(x && bytes % x->granule == 0);
  if (bytes > x->reserved - seg->size) return TA_ENOSPACE;
  size_t first = seg->size / x->granule, n = bytes / x->granule;
  if (reserve_handles(x, first + n)) return TA_ENOMEM;
  int rc = map_run(s, seg, first, n);
  if (rc == TA_OK) seg->size += bytes;
  return rc;
}

/* Granules of `seg` that [addr, addr + len) touches (`whole` 0) or holds
 * wholly (`whole` 1): [*first, *end). */
static void granules_of(const ta_segment *seg, uintptr_t addr, size_t len, int whole, size_t *first, size_t *end) {
  size_t granule = seg->expansion->granule, lo = addr - seg->addr, hi = lo + len;
  *first = (whole ? ta_align_up(lo, granule) : lo) / granule;
  *end = (whole ? hi : ta_align_up(hi, granule)) / granule;
}

/* The first run [*run, *stop) of granules in [from, end) that are mapped
 * (`mapped` 1) or unmapped (0); 0 when there is none. */
static int next_run(const ta_expansion *x, size_t from, size_t end, int mapped, size_t *run, size_t *stop) {
  size_t g = from;
  while (g < end && (x->handles[g] != 0) != mapped) g++;
  if (g >= end) return 0; /* also when a block holds no whole granule: from > end */
  *run = g;
  while (g < end && (x->handles[g] != 0) == mapped) g++;
  *stop = g;
  return 1;
}

size_t ta_segments_unmapped_in(const ta_segment *seg, uintptr_t addr, size_t len) {
  size_t first, end, run, stop, n = 0;
  granules_of(seg, addr, len, 0, &first, &end);
  for (size_t g = first; next_run(seg->expansion, g, end, 0, &run, &stop); g = stop) n += stop - run;
  return n * seg->expansion->granule;
}

int ta_segments_map(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  size_t first, end, run, stop;
  granules_of(seg, addr, len, 0, &first, &end);
  for (size_t g = first; next_run(seg->expansion, g, end, 0, &run, &stop); g = stop) {
    /* On failure the runs mapped so far stay mapped, counted as reserved,
     * inside what is still a free block: a consistent state. */
    if (map_run(s, seg, run, stop - run) != TA_OK) return TA_ENOMEM;
    seg->unmapped -= (stop - run) * seg->expansion->granule;
  }
  return TA_OK;
}

size_t ta_segments_unmap(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  size_t first, end, run, stop, released = 0;
  granules_of(seg, addr, len, 1, &first, &end);
  for (size_t g = first; next_run(seg->expansion, g, end, 1, &run, &stop); g = stop) {
    unmap_run(s, seg, run, stop - run, 1);
    released += (stop - run) * seg->expansion->granule;
  }
  seg->unmapped += released;
  return released;
}

void ta_segments_shrink(ta_segments *s, ta_segment *seg, size_t new_size) {
  ta_assert(seg->expansion && new_size > 0 && new_size < seg->size && new_size % seg->expansion->granule == 0);
  size_t tail = seg->size - new_size;
  ta_segments_unmap(s, seg, seg->addr + new_size, tail);
  seg->unmapped -= tail; /* past the end now: neither mapped nor part of the segment */
  seg->size = new_size;
}

/* Unmap everything and give the addresses back; `account`: in the stats
 * and the log (not at teardown). */
static void expansion_release(ta_segments *s, ta_segment *seg, int account) {
  ta_expansion *x = seg->expansion;
  size_t run, stop;
  for (size_t g = 0; next_run(x, g, seg->size / x->granule, 1, &run, &stop); g = stop)
    unmap_run(s, seg, run, stop - run, account);
  s->backend->ops->unreserve(s->backend, s->device, seg->addr, x->reserved);
  free(x->handles);
  free(x);
  seg->expansion = NULL;
}

void ta_segments_release_expandable(ta_segments *s, ta_segment *seg) {
  ta_assert(seg->expansion && seg->first->state == TA_BLOCK_FREE && !seg->first->next);
  expansion_release(s, seg, 1);
  ta_segments_unregister(s, seg);
  ta_stats_sub(s->stats->segment, seg->pool, 1);
  ta_segments_block_delete(s, seg->first);
  free(seg);
}

void ta_segments_expandable_teardown(ta_segments *s) {
  for (size_t i = s->registry.count; i-- > 0;) {
    ta_segment *seg = s->registry.items[i];
    if (!seg->expansion) continue;
    expansion_release(s, seg, 0);
    ta_segments_unregister(s, seg);
    free(seg); /* its blocks' descriptors belong to the slab, freed with it */
  }
}

/* 1 when the free block `b` holds a mapped granule wholly. */
static int holds_mapped_granule(const ta_segment *seg, const ta_block *b) {
  size_t first, end, run, stop;
  granules_of(seg, b->addr, b->size, 1, &first, &end);
  return next_run(seg->expansion, first, end, 1, &run, &stop);
}

size_t ta_segments_unmap_free(ta_segments *s, size_t want, const ta_block *keep) {
  size_t released = 0;
  int synced = 0;
  for (size_t i = 0; i < s->registry.count && released < want; i++) {
    ta_segment *seg = s->registry.items[i];
    if (!seg->expansion) continue;
    for (ta_block *b = seg->first; b && released < want; b = b->next) {
      if (b->state != TA_BLOCK_FREE || b == keep || !holds_mapped_granule(seg, b)) continue;
      if (!synced) { /* queued kernels may still use memory freed on their stream */
        s->backend->ops->synchronize(s->backend, s->device);
        synced = 1;
      }
      released += ta_segments_unmap(s, seg, b->addr, b->size);
    }
  }
  return released;
}
