/* Out of memory (heap.h): what the heap looked like when a request failed,
 * the verdict, and the two texts every route shows: the summary (the
 * bridge's OutOfMemoryError, the plain route's last words, stderr) and the
 * full report (a file, torchalloc.last_oom()).
 *
 * Built under the heap lock at the failure, when the segments still look as
 * they did; the report walks every block once, and so does the detail the
 * advice rests on (note_detail: whole free granules, the phases of the
 * blocks that pin fragmented segments), with no allocation. The advice
 * itself is oom_advice.c's rule. The file is written later, outside the
 * lock (ta_heap_write_oom_report). */
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "heap/heap.h"
#include "log/log_intern.h"
#include "log/log_path.h"
#include "accounting/oom_advice.h"
#include "accounting/oom_verdict.h"
#include "base/file_limit.h"
#include "base/text.h"

#define MAP_WIDTH 48          /* characters of a segment's occupancy bar */
#define MAP_SEGMENTS 12       /* segments drawn */
#define PINNED_SEGMENTS 6     /* segments whose live blocks are listed */
#define PINNED_BLOCKS 24      /* blocks listed in all */
#define STREAMS 16            /* streams told apart in the free-memory table */
#define FRAMES_SHOWN 3        /* frames of a block's allocation stack */
#define NOMINAL_GRANULE ((size_t)2 << 20) /* the granule of the figures where the device maps none */

#define SZ(x) ta_format_size((uint64_t)(x)).text

/* ------------------------------------------------------------------------
 * Per-segment numbers
 * ---------------------------------------------------------------------- */

typedef struct segment_view {
  const ta_segment *s;
  size_t free, largest_hole, live, pending;
  int holes, live_blocks;
} segment_view;

static segment_view view_of(const ta_segment *s) {
  segment_view v = {.s = s};
  for (const ta_block *b = s->first; b; b = b->next) {
    if (b->state == TA_BLOCK_FREE) {
      v.free += b->size;
      v.holes++;
      if (b->size > v.largest_hole) v.largest_hole = b->size;
    } else if (b->state == TA_BLOCK_LIVE) {
      v.live += b->size;
      v.live_blocks++;
    } else {
      v.pending += b->size;
    }
  }
  return v;
}

/* Most free bytes first: the segments whose holes could have served the
 * request together, had live blocks not stood between them. */
static int by_free_then_address(const void *a, const void *b) {
  const segment_view *x = a, *y = b;
  if (x->free != y->free) return x->free < y->free ? 1 : -1;
  return x->s->addr < y->s->addr ? -1 : x->s->addr > y->s->addr;
}

/* "####....~~##": live, free, waiting (for other streams, or retiring under reclaim), scaled to MAP_WIDTH. */
static void draw(const ta_segment *s, char out[MAP_WIDTH + 1]) {
  for (int i = 0; i < MAP_WIDTH; i++) {
    uintptr_t lo = s->addr + (uintptr_t)((double)s->size * i / MAP_WIDTH);
    uintptr_t hi = s->addr + (uintptr_t)((double)s->size * (i + 1) / MAP_WIDTH);
    size_t live = 0, free_b = 0;
    for (const ta_block *b = s->first; b; b = b->next) {
      uintptr_t a = b->addr > lo ? b->addr : lo, z = b->addr + b->size < hi ? b->addr + b->size : hi;
      if (z <= a) continue;
      if (b->state == TA_BLOCK_FREE) free_b += z - a;
      else live += z - a; /* pending and retiring blocks are drawn as waiting below */
    }
    out[i] = free_b > live ? '.' : '#';
    if (free_b <= live) {
      for (const ta_block *b = s->first; b; b = b->next)
        if (b->state != TA_BLOCK_FREE && b->state != TA_BLOCK_LIVE && b->addr < hi && b->addr + b->size > lo)
          out[i] = '~';
    }
  }
  out[MAP_WIDTH] = '\0';
}

/* ------------------------------------------------------------------------
 * The report
 * ---------------------------------------------------------------------- */

typedef struct frame_writer {
  ta_text *t;
  int n;
} frame_writer;

static void write_frame(void *ctx, const char *file, const char *func, uint32_t line) {
  frame_writer *w = ctx;
  if (w->n++ >= FRAMES_SHOWN) return;
  const char *base = strrchr(file, '/');
  ta_text_printf(w->t, "%s%s:%u:%s", w->n > 1 ? " <- " : "", base ? base + 1 : file, (unsigned)line, func);
}

static void block_line(ta_text *t, const ta_heap *h, const ta_block *b) TA_REQUIRES(h->lock) {
  const char *phase = ta_phase_name(b->phase);
  ta_text_printf(t, "    %#" PRIxPTR "  %10s  phase %s", b->addr, SZ(b->size), phase ? phase : "?");
  if (b->phase_epoch) ta_text_printf(t, " #%u", (unsigned)b->phase_epoch);
  ta_text_printf(t, ", allocated %u requests before the failure", (unsigned)(h->alloc_seq - b->alloc_seq));
  if (b->stack_id) {
    ta_text_printf(t, "\n      at ");
    frame_writer w = {t, 0};
    if (!ta_log_intern_visit_stack(b->stack_id, write_frame, &w)) ta_text_printf(t, "(stack forgotten: log closed)");
  }
  ta_text_printf(t, "\n");
}

typedef struct stream_free {
  uintptr_t stream;
  size_t free, largest;
  int blocks;
} stream_free;

static void report_streams(ta_text *t, const ta_heap *h) TA_REQUIRES(h->lock) {
  stream_free per[STREAMS];
  int n = 0, others = 0;
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; i < r->count; i++)
    for (const ta_block *b = r->items[i]->first; b; b = b->next) {
      if (b->state != TA_BLOCK_FREE) continue;
      int k = 0;
      while (k < n && per[k].stream != (uintptr_t)b->stream) k++;
      if (k == n) {
        if (n == STREAMS) {
          others++;
          continue;
        }
        per[n++] = (stream_free){(uintptr_t)b->stream, 0, 0, 0};
      }
      per[k].free += b->size;
      per[k].blocks++;
      if (b->size > per[k].largest) per[k].largest = b->size;
    }
  ta_text_printf(t, "\nFree cached memory by stream (a stream reuses only its own):\n");
  if (!n) ta_text_printf(t, "  none\n");
  for (int k = 0; k < n; k++)
    ta_text_printf(t, "  stream %#" PRIxPTR "%s: %s free in %d blocks, the largest %s\n", per[k].stream,
                   per[k].stream == h->oom.stream ? " (the request's)" : "", SZ(per[k].free), per[k].blocks,
                   SZ(per[k].largest));
  if (others) ta_text_printf(t, "  ... and %d free blocks on more streams\n", others);
}


/* The live block after `prev` (NULL: the first) in the order largest first,
 * then lowest address, among the blocks of `segments[0..n)`. Listing blocks
 * by repeated selection needs no sort buffer while the heap is failing, and
 * the lists it serves are a few entries long. */
static const ta_block *next_largest_live(const ta_segment *const *segments, size_t n, const ta_block *prev) {
  const ta_block *best = NULL;
  for (size_t i = 0; i < n; i++)
    for (const ta_block *b = segments[i]->first; b; b = b->next) {
      if (b->state != TA_BLOCK_LIVE) continue;
      int after_prev = !prev || b->size < prev->size || (b->size == prev->size && b->addr > prev->addr);
      if (after_prev && (!best || b->size > best->size || (b->size == best->size && b->addr < best->addr)))
        best = b;
    }
  return best;
}

static void report_segments(ta_text *t, const ta_heap *h) TA_REQUIRES(h->lock) {
  const ta_segment_registry *r = &h->seg.registry;
  segment_view *views = r->count ? malloc(r->count * sizeof *views) : NULL;
  if (r->count && !views) return;
  for (size_t i = 0; i < r->count; i++) views[i] = view_of(r->items[i]);
  if (r->count) qsort(views, r->count, sizeof *views, by_free_then_address); /* qsort(NULL, 0) is undefined */
  size_t shown = r->count < MAP_SEGMENTS ? r->count : MAP_SEGMENTS;
  ta_text_printf(t, "\nSegments, most free first (# live, ~ freed but used by other streams, . free; %zu in all):\n",
                 r->count);
  for (size_t i = 0; i < shown; i++) {
    char bar[MAP_WIDTH + 1];
    draw(views[i].s, bar);
    ta_text_printf(t, "  %#" PRIxPTR " %10s %-5s stream %#" PRIxPTR " [%s] %s free in %d hole%s, largest %s\n",
                   views[i].s->addr, SZ(views[i].s->size), views[i].s->pool == TA_POOL_SMALL ? "small" : "large",
                   (uintptr_t)views[i].s->stream, bar, SZ(views[i].free), views[i].holes,
                   views[i].holes == 1 ? "" : "s", SZ(views[i].largest_hole));
  }
  size_t rest_free = 0;
  for (size_t i = shown; i < r->count; i++) rest_free += views[i].free;
  if (r->count > shown) ta_text_printf(t, "  ... %zu more segments, %s free in them\n", r->count - shown, SZ(rest_free));

  /* The blocks that keep the most fragmented segments from being one hole. */
  ta_text_printf(t, "\nLive blocks pinning the segments with the most free memory (largest first):\n");
  int listed = 0;
  for (size_t i = 0; i < r->count && i < PINNED_SEGMENTS && listed < PINNED_BLOCKS; i++) {
    if (!views[i].free || !views[i].live_blocks) continue;
    ta_text_printf(t, "  in segment %#" PRIxPTR " (%s free, largest hole %s):\n", views[i].s->addr,
                   SZ(views[i].free), SZ(views[i].largest_hole));
    const ta_block *best = NULL;
    for (int k = 0; k < views[i].live_blocks && listed < PINNED_BLOCKS; k++) {
      best = next_largest_live(&views[i].s, 1, best);
      if (!best) break;
      block_line(t, h, best);
      listed++;
    }
  }
  if (!listed) ta_text_printf(t, "  none: no segment holds both free memory and live blocks\n");
  free(views);
}

/* The largest live blocks of the device: what to shrink when live tensors
 * alone are too many (capacity), or what torchalloc holds when others hold
 * the rest (held elsewhere). */
static void report_largest(ta_text *t, const ta_heap *h) TA_REQUIRES(h->lock) {
  ta_text_printf(t, "\nThe largest live blocks:\n");
  const ta_segment_registry *r = &h->seg.registry;
  const ta_block *best = NULL;
  int listed = 0;
  for (; listed < PINNED_BLOCKS; listed++) {
    best = next_largest_live((const ta_segment *const *)r->items, r->count, best);
    if (!best) break;
    block_line(t, h, best);
  }
  if (!listed) ta_text_printf(t, "  none\n");
}

/* The figures the advice rests on, each on its line. */
static void report_basis(ta_text *t, const ta_oom_info *o) {
  const torchalloc_oom_detail *d = &o->detail;
  char g[32];
  snprintf(g, sizeof g, "%s", SZ(d->granule ? d->granule : NOMINAL_GRANULE));
  const char *request_phase = ta_phase_name(d->phase) ? ta_phase_name(d->phase) : "?";
  ta_text_printf(t,
                 "\nWhat the advice rests on (the default pool's segments at the failure):\n"
                 "  whole free granules %s free in whole %s granules of segments that hold live blocks%s\n"
                 "  free segments       %s in segments with no live block\n"
                 "  expandable segments %s\n"
                 "  pinned segments     %u hold free memory (%s) and live blocks (%s)\n"
                 "  pinning phases      %s of those live blocks were allocated in phases other than the "
                 "request's ('%s')",
                 SZ(d->free_granules), g, d->granule ? "" : " (nominal: this device maps no granules)",
                 SZ(d->free_segments),
                 !d->granule ? "not available on this device"
                 : d->expandable ? "on (expandable:N gives free granules back before a request fails)"
                                 : "off",
                 (unsigned)d->pinned_segments, SZ(d->pinned_free), SZ(d->pinning), SZ(d->pinning_other),
                 request_phase);
  for (int k = 0; k < TORCHALLOC_OOM_OTHER_PHASES && d->other_bytes[k]; k++) {
    const char *name = ta_phase_name(d->other_phases[k]);
    ta_text_printf(t, "%s'%s' %s", k ? ", " : ": ", name ? name : "?", SZ(d->other_bytes[k]));
  }
  ta_text_printf(t, "\n");
  if (o->verdict == TORCHALLOC_OOM_FRAGMENTATION && d->pinned_segments && !d->pinning_other)
    ta_text_printf(t, "  (arenas per phase would not keep them apart: every block pinning those segments was "
                      "allocated in the request's phase)\n");
}

/* ", rank R of W" under a distributed launcher ($RANK, $WORLD_SIZE): in a
 * job's interleaved output and its many report files, which rank failed. */
typedef struct rank_words {
  char text[48];
} rank_words;

/* "rank R of W" between `before` and `after`; "" without a launcher. */
static rank_words rank_text(const char *before, const char *after) {
  rank_words w = {""};
  int rank = ta_log_rank(), world = ta_log_world_size();
  if (rank >= 0 && world > 0) snprintf(w.text, sizeof w.text, "%srank %d of %d%s", before, rank, world, after);
  else if (rank >= 0) snprintf(w.text, sizeof w.text, "%srank %d%s", before, rank, after);
  return w;
}

static void build_report(ta_heap *h) TA_REQUIRES(h->lock) {
  const ta_oom_info *o = &h->oom;
  const torchalloc_oom_facts *f = &o->facts;
  ta_text t = {0};
  char summary[TA_OOM_SUMMARY_MAX];
  ta_heap_format_oom(o, h->device, summary, sizeof summary);
  time_t now = time(NULL);
  char when[64] = "";
  struct tm tm;
  if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  ta_text_printf(&t, "torchalloc out-of-memory report: device %d%s, pid %ld, %s, failure #%" PRId64 "\n\n%s\n",
                 h->device, rank_text(", ", "").text, (long)getpid(), when, o->count, summary);
  uint64_t free_in_reserved = f->reserved > f->allocated + (uint64_t)o->pending
                                  ? f->reserved - f->allocated - (uint64_t)o->pending
                                  : 0;
  uint64_t held = f->device_total > f->device_free + f->reserved ? f->device_total - f->device_free - f->reserved : 0;
  double frag = free_in_reserved ? (double)(free_in_reserved - (o->largest_free < free_in_reserved ? o->largest_free
                                                                                                    : free_in_reserved)) /
                                        (double)free_in_reserved
                                 : 0.0;
  ta_text_printf(&t,
                 "\nMemory at the failure:\n"
                 "  requested           %s on stream %#" PRIxPTR " (phase %s)\n"
                 "  device              %s in total, %s free, %s held outside torchalloc\n"
                 "  memory fraction     %s\n"
                 "  reserved            %s by torchalloc\n"
                 "  allocated           %s in live blocks\n"
                 "  waiting for streams %s freed but still used by other streams\n"
                 "  free in reserved    %s, the largest block %s (%s on the request's stream)\n"
                 "  fragmentation       %.2f (share of the free cached memory outside its largest block)\n",
                 SZ(f->requested), o->stream, ta_phase_name(o->phase) ? ta_phase_name(o->phase) : "?",
                 SZ(f->device_total), SZ(f->device_free), SZ(held),
                 f->limit ? SZ(f->limit) : "none", SZ(f->reserved), SZ(f->allocated), SZ((uint64_t)o->pending),
                 SZ(free_in_reserved), SZ(o->largest_free), SZ(f->largest_free), frag);
  report_basis(&t, o);
  report_streams(&t, h);
  report_segments(&t, h);
  if (o->verdict != TORCHALLOC_OOM_FRAGMENTATION) report_largest(&t, h);
  ta_text_printf(&t,
                 "\nWith a log open (TORCHALLOC_CONF log:PATH), `torchalloc report PATH` explains every block and "
                 "replays the run up to this failure under each policy to check the advice.\n");
  free(h->oom_report);
  h->oom_report = t.data ? t.data : NULL; /* taken over: freed at the next failure or with the heap */
}

/* ------------------------------------------------------------------------
 * What the advice rests on (oom_advice.c)
 * ---------------------------------------------------------------------- */

/* Bytes of the granules lying wholly inside free block `b` that are backed
 * by device memory now (an expandable segment may have given some back). */
static size_t whole_free_granules(const ta_segment *s, const ta_block *b, size_t g) {
  uintptr_t lo = ta_align_up(b->addr, g), hi = (b->addr + b->size) / g * g;
  if (hi <= lo) return 0;
  size_t unmapped = s->expansion ? ta_segments_unmapped_in(s, lo, hi - lo) : 0;
  return unmapped < hi - lo ? hi - lo - unmapped : 0;
}

/* One pass over the default pool's segments (private pools serve no other
 * request), no allocation: the per-phase tally lives on the stack. */
static void note_detail(ta_heap *h, const ta_policy *policy, size_t size, int phase) TA_REQUIRES(h->lock) {
  torchalloc_oom_detail *d = &h->oom.detail;
  /* The granule expandable segments would give back for the request: the
   * device's, where large handles can be replaced on this path. */
  *d = (torchalloc_oom_detail){.struct_size = sizeof *d,
                               .granule = ta_segments_oom_granule(&h->seg, policy->ops->pool_for(policy, size)),
                               .phase = (uint16_t)phase,
                               .expandable = (uint8_t)h->conf->expandable};
  int private_pool = h->policies[policy->id] != policy;
  if (policy->ops->arena_reserved) d->flags |= TORCHALLOC_OOM_PHASE_ARENAS;
  if (policy->ops->frees_to_device) d->flags |= TORCHALLOC_OOM_FREES_TO_DEVICE;
  if (h->routing || private_pool) d->flags |= TORCHALLOC_OOM_ROUTING;
  size_t g = d->granule ? d->granule : NOMINAL_GRANULE;
  uint64_t other[TA_MAX_PHASES] = {0};
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; i < r->count; i++) {
    const ta_segment *s = r->items[i];
    if (h->policies[s->policy] != s->policy_instance) continue; /* a private pool's */
    size_t free_b = 0, granules = 0, live = 0, live_other = 0;
    int pending = 0;
    for (const ta_block *b = s->first; b; b = b->next) {
      if (b->state == TA_BLOCK_FREE) { /* only what is mapped: an expandable segment's gaps are not reserved */
        size_t unmapped = s->expansion ? ta_segments_unmapped_in(s, b->addr, b->size) : 0;
        free_b += b->size - (unmapped < b->size ? unmapped : b->size);
        granules += whole_free_granules(s, b, g);
      } else if (b->state != TA_BLOCK_LIVE) { /* pending, or retiring under reclaim: no caller holds it */
        pending = 1;
      } else {
        live += b->size;
        if (b->phase != phase) live_other += b->size;
      }
    }
    if (!live && !pending) {
      d->free_segments += s->size - s->unmapped;
      continue;
    }
    d->free_granules += granules;
    if (!live || !free_b) continue;
    d->pinned_segments++;
    d->pinned_free += free_b;
    d->pinning += live;
    d->pinning_other += live_other;
    if (live_other)
      for (const ta_block *b = s->first; b; b = b->next)
        if (b->state == TA_BLOCK_LIVE && b->phase != phase) other[b->phase] += b->size;
  }
  for (int k = 0; k < TORCHALLOC_OOM_OTHER_PHASES; k++) { /* the phases pinning the most, by selection */
    int best = -1;
    for (int p = 0; p < TA_MAX_PHASES; p++)
      if (other[p] && (best < 0 || other[p] > other[best])) best = p;
    if (best < 0) break;
    d->other_phases[k] = (uint16_t)best;
    d->other_bytes[k] = other[best];
    other[best] = 0;
  }
}

/* The longest stretch of free block `b` backed by device memory: what it
 * could serve without mapping more. An expandable segment's free block may
 * span granules given back to the device; counting those would make "the
 * largest free cached block" larger than the cached memory beside it. */
static size_t mapped_stretch(const ta_segment *s, const ta_block *b) {
  if (!s->expansion || !s->unmapped) return b->size;
  size_t g = ta_segments_granule_of(s), best = 0;
  uintptr_t end = b->addr + b->size, run = b->addr;
  for (uintptr_t lo = b->addr; lo < end;) { /* granule by granule: the out-of-memory path only */
    uintptr_t next = s->addr + ((lo - s->addr) / g + 1) * g;
    if (next > end) next = end;
    if (ta_segments_unmapped_in(s, lo, next - lo)) {
      if (lo - run > best) best = lo - run;
      run = next;
    }
    lo = next;
  }
  return end - run > best ? end - run : best;
}

static const char *phase_namer(void *ctx, int phase) {
  (void)ctx;
  return ta_phase_name(phase);
}

void ta_heap_note_oom(ta_heap *h, ta_policy *policy, size_t size, cudaStream_t stream, int phase) {
  ta_oom_info *o = &h->oom;
  ta_backend *backend = h->seg.backend;
  o->count++;
  o->stream = (uintptr_t)stream;
  o->phase = phase;
  o->routing = h->routing;
  o->policy = policy->id;
  o->pending = ta_stat_total(h->pending_stats.bytes);
  size_t device_free = 0, device_total = 0;
  backend->ops->mem_info(backend, h->device, &device_free, &device_total);
  o->facts = (torchalloc_oom_facts){.requested = size,
                                    .allocated = (uint64_t)ta_stat_total(h->stats.allocated_bytes),
                                    .reserved = (uint64_t)ta_stat_total(h->stats.reserved_bytes),
                                    .device_total = device_total,
                                    .device_free = device_free,
                                    .limit = h->seg.limit};
  o->largest_free = 0;
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; i < r->count; i++)
    for (const ta_block *b = r->items[i]->first; b; b = b->next) {
      if (b->state != TA_BLOCK_FREE) continue;
      size_t usable = mapped_stretch(r->items[i], b);
      if (usable > o->largest_free) o->largest_free = usable;
      if (b->stream == stream && usable > o->facts.largest_free) o->facts.largest_free = usable;
    }
  o->verdict = ta_oom_verdict(&o->facts);
  note_detail(h, policy, size, phase);
  o->report_path[0] = '\0';
  build_report(h);
}

int ta_heap_format_oom(const ta_oom_info *o, int device, char *buf, size_t len) {
  const torchalloc_oom_facts *f = &o->facts;
  int64_t cached = (int64_t)f->reserved - (int64_t)f->allocated;
  char limit[96] = "";
  if (f->limit)
    snprintf(limit, sizeof limit, " The memory fraction caps torchalloc at %s.", ta_format_size(f->limit).text);
  char advice[TA_OOM_SUMMARY_MAX - 1200];
  ta_oom_advice_write(f, &o->detail, phase_namer, NULL, "  ", advice, sizeof advice);
  size_t n = strlen(advice);
  if (n && advice[n - 1] == '\n' && !o->report_path[0]) advice[n - 1] = '\0'; /* nothing follows */
  char where[1100] = "";
  if (o->report_path[0]) snprintf(where, sizeof where, "Full report: %s", o->report_path);
  return snprintf(buf, len,
                  /* PyTorch's first sentences, which its users and tests match, then torchalloc's account */
                  "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is "
                  "free.%s torchalloc (%sstream %#" PRIxPTR ", policy %s) "
                  "reserves %s: %s allocated to tensors and %s cached but free; the largest free cached block is "
                  "%s (%s on this stream).%s Verdict: %s: %s. Advice, from the numbers at this failure (try the "
                  "first line first):\n%s%s",
                  SZ(f->requested), device, SZ(f->device_total), SZ(f->device_free), limit,
                  rank_text("", ", ").text, o->stream, ta_policy_by_id(o->policy)->name, SZ(f->reserved), SZ(f->allocated), SZ(cached > 0 ? cached : 0),
                  SZ(o->largest_free), SZ(f->largest_free),
                  o->routing ? " A CUDA graph capture or MemPool context was open, so cached memory could not be "
                               "released and retried."
                             : "",
                  ta_oom_verdict_name(o->verdict), ta_oom_verdict_meaning(o->verdict), advice, where);
}

void ta_heap_print_oom(ta_heap *h) {
  char text[TA_OOM_SUMMARY_MAX];
  ta_heap_format_oom(&h->oom, h->device, text, sizeof text);
  fprintf(stderr, "torchalloc: %s\n", text);
}

char *ta_heap_oom_report_copy(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  char *copy = h->oom_report ? strdup(h->oom_report) : NULL;
  ta_lock_release(&h->lock);
  return copy;
}

/* `text` into a file this call creates (mkstemps: O_EXCL, so never an
 * existing file or a link someone planted). `path` ending in XXXXXX.txt is
 * a template: the file keeps the unique name. Else the file is made beside
 * `path` and renamed onto it, which replaces a link rather than writing
 * through it. The name written in `written`; 0, or -1. */
static int write_new_file(const char *text, const char *path, char *written, size_t len) {
  static const char unique[] = "XXXXXX.txt";
  size_t n = strlen(path), tail = sizeof unique - 1;
  int templated = n >= tail && strcmp(path + n - tail, unique) == 0;
  if (snprintf(written, len, templated ? "%s" : "%s.XXXXXX", path) >= (int)len) return -1;
  int fd = templated ? mkstemps(written, 4) : mkstemp(written);
  if (fd < 0) return -1;
  int ok = fchmod(fd, 0644) == 0; /* a report is no secret: the user's other tools read it */
  /* Past a file-size limit (ulimit -f) the write fails, where SIGXFSZ would
   * kill a C or C++ host; the file is then removed below. */
  ok = ok && ta_write_within_limit(fd, text, strlen(text)) == 0;
  ok = close(fd) == 0 && ok;
  if (ok && !templated) {
    ok = rename(written, path) == 0;
    if (!ok) unlink(written);
    else snprintf(written, len, "%s", path);
  } else if (!ok) {
    unlink(written);
  }
  return ok ? 0 : -1;
}

void ta_heap_write_oom_report(ta_heap *h, const char *path) {
  char *text = ta_heap_oom_report_copy(h);
  if (!text) return;
  char written[sizeof h->oom.report_path];
  int ok = path[0] && write_new_file(text, path, written, sizeof written) == 0;
  free(text);
  ta_lock_acquire(&h->lock);
  snprintf(h->oom.report_path, sizeof h->oom.report_path, "%s", ok ? written : "");
  ta_lock_release(&h->lock);
}
