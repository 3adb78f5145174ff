/* Stat updates with torch's semantics: `allocated`/`freed` accumulate every
 * increase/decrease, `peak` is the highest `current` since the last reset.
 *
 * Hot-path layout: of each per-pool array only the pool entries (small,
 * large) are kept up to date, and of the "all" entry only its peak; the rest
 * of "all" is their sum, filled in by ta_stats_export. `active` is not
 * stored at all: it is allocation plus blocks waiting for record_stream
 * events (ta_pending_stats). Both save work on every malloc and free. */
#ifndef TA_STATS_H
#define TA_STATS_H

#include "base/common.h"
#include "torchalloc.h"

/* The other pool's current is read before anything is stored and the new
 * value kept in a register: no load waits on a store just made (stat fields
 * are int64_t like the block's sizes, so the compiler must assume they alias
 * and would reload each one). */
static inline void ta_stats_add(torchalloc_stat *stat, int pool, int64_t n) {
  torchalloc_stat *p = &stat[pool];
  int64_t other = stat[TORCHALLOC_POOL_SMALL + TORCHALLOC_POOL_LARGE - pool].current;
  int64_t current = p->current + n;
  p->current = current;
  p->allocated += n;
  if (current > p->peak) p->peak = current;
  if (current + other > stat[TORCHALLOC_POOL_ALL].peak) stat[TORCHALLOC_POOL_ALL].peak = current + other;
}

static inline void ta_stats_sub(torchalloc_stat *stat, int pool, int64_t n) {
  stat[pool].current -= n;
  stat[pool].freed += n;
}

/* Current value over all pools. */
static inline int64_t ta_stat_total(const torchalloc_stat *stat) {
  return stat[TORCHALLOC_POOL_SMALL].current + stat[TORCHALLOC_POOL_LARGE].current;
}

/* Blocks freed by the caller but still in use by other streams. */
typedef struct ta_pending_stats {
  torchalloc_stat count[TORCHALLOC_NPOOLS];
  torchalloc_stat bytes[TORCHALLOC_NPOOLS];
  /* Highest allocation + pending seen while something was pending. */
  int64_t active_peak[TORCHALLOC_NPOOLS];
  int64_t active_bytes_peak[TORCHALLOC_NPOOLS];
} ta_pending_stats;

/* After an allocation made while blocks are pending: track active's peak. */
ta_internal void ta_stats_note_active_peak(const torchalloc_stats *s, ta_pending_stats *p);
/* The full torch view: "all" entries and `active` filled in. */
ta_internal void ta_stats_export(const torchalloc_stats *s, const ta_pending_stats *p, torchalloc_stats *out);
ta_internal void ta_stats_reset_peak(torchalloc_stats *s, ta_pending_stats *p);
ta_internal void ta_stats_reset_accumulated(torchalloc_stats *s, ta_pending_stats *p);

#endif
