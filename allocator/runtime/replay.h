/* Replay: a trace through one policy on a private simulated device
 * (replay.c). The public functions (torchalloc_replay.h's
 * torchalloc_replay_*, in api/replay_api.c) are these, whose arguments and
 * messages they share; the last two are inner workings that tests look at. */
#ifndef TA_REPLAY_H
#define TA_REPLAY_H

#include "base/common.h"
#include "torchalloc_replay.h"

/* torchalloc_replay_begin / _feed / _end (torchalloc_replay.h says what
 * each does and returns). */
ta_internal torchalloc_replay_run *ta_replay_begin(const char *policy, uint64_t capacity, size_t n_total,
                                                   int64_t *reserved_series, size_t series_len);
ta_internal int ta_replay_feed(torchalloc_replay_run *run, const torchalloc_replay_event *events, size_t n);
ta_internal int ta_replay_end(torchalloc_replay_run *run, torchalloc_replay_result *out);

/* Blocks walked so far to get the free bytes and largest free block at new
 * peaks of reserved memory: 0 while the census of free blocks holds. */
ta_internal int64_t ta_replay_blocks_walked(const torchalloc_replay_run *run);
/* 1 when the census's free bytes and largest free block are what a walk
 * over every block finds now. */
ta_internal int ta_replay_census_agrees(const torchalloc_replay_run *run);

#endif
