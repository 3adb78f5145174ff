/* Training phases. The current phase is process-wide: the autograd engine
 * allocates on its own threads while the main thread waits in backward(),
 * and those allocations belong to the phase the main thread set.
 *
 * The current phase and its occurrence number ("epoch") are packed in one
 * atomic word, so an allocation reads both consistently without a lock. */
#ifndef TA_PHASE_H
#define TA_PHASE_H

#include <stdatomic.h>

#include "common.h"
#include "torchalloc.h"

#define TA_MAX_PHASES TORCHALLOC_MAX_PHASES /* distinct names per process; 0 is "default" */
#define TA_PHASE_DEFAULT 0

ta_internal extern _Atomic uint64_t ta_phase_word; /* epoch << 16 | id */
/* Epoch of the open occurrence of each phase; 0 while the phase is closed. */
ta_internal extern _Atomic uint32_t ta_phase_open_epoch[TA_MAX_PHASES];

typedef struct ta_phase_now {
  int id;
  uint32_t epoch;
} ta_phase_now;

static inline ta_phase_now ta_phase_read(void) {
  uint64_t w = atomic_load_explicit(&ta_phase_word, memory_order_relaxed);
  return (ta_phase_now){(int)(w & 0xffff), (uint32_t)(w >> 16)};
}

static inline int ta_phase_current(void) { return ta_phase_read().id; }

/* Per-device accounting of one phase (lives in the heap). */
typedef struct ta_phase_acct {
  torchalloc_phase_stats pub;
  uint32_t epoch;     /* occurrence the occ_* counters belong to */
  int64_t occ_alloc;  /* bytes allocated in that occurrence */
  int64_t occ_freed;  /* of those, bytes freed while it was open */
} ta_phase_acct;

/* Tell every heap that occurrence `epoch` of `phase` ended (entry.c). */
ta_internal void ta_heaps_phase_ended(int phase, uint32_t epoch);

/* Times `phase` has ended in this process. */
ta_internal int64_t ta_phase_occurrences(int phase);

/* Forget every phase name and the stack (torchalloc_init). */
ta_internal void ta_phase_reset(void);

#endif
