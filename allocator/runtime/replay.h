/* Replay's inner workings that tests look at (replay.c); its API is
 * torchalloc.h's torchalloc_replay_*. */
#ifndef TA_REPLAY_H
#define TA_REPLAY_H

#include "base/common.h"

/* Blocks walked so far to get the free bytes and largest free block at new
 * peaks of reserved memory: 0 while the census of free blocks holds. */
ta_internal int64_t ta_replay_blocks_walked(const torchalloc_replay_run *run);
/* 1 when the census's free bytes and largest free block are what a walk
 * over every block finds now. */
ta_internal int ta_replay_census_agrees(const torchalloc_replay_run *run);

#endif
