#include "stats.h"

/* torchalloc_stats is a version field, nine per-pool arrays, then counters;
 * walk the arrays as one flat run of torchalloc_stat. */
#define STAT_ARRAYS 9

static torchalloc_stat *first_stat(torchalloc_stats *s) { return s->allocation; }

void ta_stats_reset_peak(torchalloc_stats *s) {
  torchalloc_stat *st = first_stat(s);
  for (int i = 0; i < STAT_ARRAYS * TORCHALLOC_NPOOLS; i++) st[i].peak = st[i].current;
}

void ta_stats_reset_accumulated(torchalloc_stats *s) {
  torchalloc_stat *st = first_stat(s);
  for (int i = 0; i < STAT_ARRAYS * TORCHALLOC_NPOOLS; i++) st[i].allocated = st[i].freed = 0;
  s->num_alloc_retries = s->num_ooms = 0;
  s->num_device_alloc = s->num_device_free = 0;
}
