/* The granules of an expandable segment (segments.h, ta_expansion): which
 * ones an address range covers, the state each is in, and the stretches of
 * one state, as segments_expand.c and segments_reclaim.c walk them. */
#ifndef TA_SEGMENT_GRANULES_H
#define TA_SEGMENT_GRANULES_H

#include "segments/segments.h"

/* Granules of `seg` that [addr, addr + len) touches (`whole` 0) or holds
 * wholly (`whole` 1): [*first, *end). */
static inline void ta_granules_of(const ta_segment *seg, uintptr_t addr, size_t len, int whole, size_t *first,
                                  size_t *end) {
  size_t granule = seg->expansion->granule, lo = addr - seg->addr, hi = lo + len;
  *first = (whole ? ta_align_up(lo, granule) : lo) / granule;
  *end = (whole ? hi : ta_align_up(hi, granule)) / granule;
}

/* A granule's state, as a bit: TA_GRANULE_OWNED is a handle of its own, TA_GRANULE_RUN a granule
 * of a run (segments_runs.c) mapped here; lent granules, runs too, are TA_GRANULE_LENT. */
enum { TA_GRANULE_UNMAPPED = 1, TA_GRANULE_OWNED = 2, TA_GRANULE_LENT = 4, TA_GRANULE_SPLIT = 8, TA_GRANULE_RUN = 16 };

static inline int ta_granule_state(const ta_expansion *x, size_t g) {
  return x->handles[g] == 0                 ? TA_GRANULE_UNMAPPED
         : x->handles[g] == TA_HANDLE_SPLIT ? TA_GRANULE_SPLIT
         : x->lent[g]                       ? TA_GRANULE_LENT
         : x->run[g]                        ? TA_GRANULE_RUN
                                            : TA_GRANULE_OWNED;
}

/* The first stretch [*run, *stop) of granules in [from, end) in a state of
 * `states`; 0 when there is none. */
static inline int ta_granules_next(const ta_expansion *x, size_t from, size_t end, int states, size_t *run,
                                   size_t *stop) {
  size_t g = from;
  while (g < end && !(ta_granule_state(x, g) & states)) g++;
  if (g >= end) return 0; /* also when a block holds no whole granule: from > end */
  *run = g;
  while (g < end && ta_granule_state(x, g) & states) g++;
  *stop = g;
  return 1;
}

/* The first stretch [*run, *stop) in [from, end) of whole handles mapped
 * here and not lent (single granules, and runs lying wholly in [from,
 * end)); 0 when there is none. */
static inline int ta_granules_next_whole(const ta_expansion *x, size_t from, size_t end, size_t *run, size_t *stop) {
  size_t g = from;
  for (;;) {
    if (!ta_granules_next(x, g, end, TA_GRANULE_OWNED | TA_GRANULE_RUN, run, stop)) return 0;
    g = *run;
    /* a run begun before `from` or ending past `end` is not whole here: skip its granules */
    while (g < *stop && x->run[g] && (ta_run_start(x, g) < from || ta_run_start(x, g) + ta_run_length(x, g) > end))
      g++;
    if (g == *stop) continue;
    *run = g;
    size_t h = g;
    while (h < *stop) {
      size_t len = ta_run_length(x, h);
      if (x->run[h] && (ta_run_start(x, h) != h || h + len > end)) break;
      h += len;
    }
    *stop = h;
    return 1;
  }
}

/* The first granule mapped in pieces (segments_split.c) in [g, end); end when none. */
static inline size_t ta_granules_next_split(const ta_expansion *x, size_t g, size_t end) {
  while (g < end && x->handles[g] != TA_HANDLE_SPLIT) g++;
  return g;
}

#endif
