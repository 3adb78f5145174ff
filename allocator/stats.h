/* Stat updates with torch's semantics: `allocated`/`freed` accumulate every
 * increase/decrease, `peak` is the highest `current` since the last reset.
 * Each update touches the "all" entry and the block's pool entry. */
#ifndef TA_STATS_H
#define TA_STATS_H

#include "common.h"
#include "torchalloc.h"

static inline void ta_stat_inc(torchalloc_stat *s, int64_t n) {
  s->current += n;
  s->allocated += n;
  if (s->current > s->peak) s->peak = s->current;
}

static inline void ta_stat_dec(torchalloc_stat *s, int64_t n) {
  s->current -= n;
  s->freed += n;
}

/* stat[] is one of the per-pool arrays of torchalloc_stats. */
static inline void ta_stats_add(torchalloc_stat *stat, int pool, int64_t n) {
  ta_stat_inc(&stat[TORCHALLOC_POOL_ALL], n);
  ta_stat_inc(&stat[pool], n);
}

static inline void ta_stats_sub(torchalloc_stat *stat, int pool, int64_t n) {
  ta_stat_dec(&stat[TORCHALLOC_POOL_ALL], n);
  ta_stat_dec(&stat[pool], n);
}

ta_internal void ta_stats_reset_peak(torchalloc_stats *s);
ta_internal void ta_stats_reset_accumulated(torchalloc_stats *s);

#endif
