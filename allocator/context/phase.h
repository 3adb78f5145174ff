/* Training phases: the process-wide phase stack and the phase names.
 *
 * The current phase is process-wide: the autograd engine allocates on its
 * own threads while the main thread waits in backward(), and those
 * allocations belong to the phase the main thread set. With several
 * threads entering phases, the current one is the innermost open one,
 * whoever entered it; a phase left out of order (another thread entered
 * one meanwhile) is taken out of the middle of the stack (ta_phase_remove). The current phase
 * and its occurrence number ("epoch") are packed in one atomic word, so an
 * allocation reads both consistently without a lock.
 *
 * Per-device accounting lives in the heaps; the public API (phase_api.c)
 * ends a phase in three steps: pop it here, tell every heap, retire it
 * here. This file writes the PHASE_BEGIN / PHASE_END records (log.h) and
 * calls nothing above it. */
#ifndef TA_PHASE_H
#define TA_PHASE_H

#include <stdatomic.h>

#include "base/common.h"
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

/* Id of `name`, interning it; -1 (and ta_set_error) for a bad name or a full table. */
ta_internal int ta_phase_intern(const char *name);
/* Enter phase `name`: a new occurrence, logged, then made current. Its id,
 * or -1; *epoch (may be NULL) gets the occurrence's number. */
ta_internal int ta_phase_push(const char *name, uint32_t *epoch);

/* What ta_phase_pop / ta_phase_remove ended, for the heaps and ta_phase_retire. */
typedef struct ta_phase_ended {
  int id;
  uint32_t epoch;
  uint32_t reopen; /* the occurrence of the same phase still open further out (recursion), else 0 */
} ta_phase_ended;

/* Leave the innermost phase (`name`, may be NULL, must match it): logged,
 * the outer phase made current. 0, or -1 with ta_set_error. */
ta_internal int ta_phase_pop(const char *name, ta_phase_ended *ended);
/* Leave occurrence `epoch` of phase `id` wherever it is in the stack (a
 * phase entered on another thread may sit above it): logged, the innermost
 * of what remains made current. 0, or -1 with ta_set_error when that
 * occurrence is not open. */
ta_internal int ta_phase_remove(int id, uint32_t epoch, ta_phase_ended *ended);
/* After the heaps have closed the occurrence: mark the phase closed, or
 * back to its occurrence still open further out; unless a new occurrence
 * was entered meanwhile. */
ta_internal void ta_phase_retire(const ta_phase_ended *ended);

/* Open the log (log.h: ta_log_open) and write a PHASE_BEGIN for every
 * phase open now, outermost first, with the occurrence it is in: the log's
 * rule that a phase_begin precedes every record tagged with its occurrence
 * then holds for phases begun before the log. Under the phase lock, so no
 * phase begins or ends in between (none is logged twice or missed). The
 * caller keeps block records out until it returns (holds the heap locks,
 * or no heap exists yet). 0, or -1 with the reason in err. */
ta_internal int ta_phase_open_log(const char *pattern, size_t max_bytes, char *err, size_t errlen);

/* Times `phase` has ended in this process. */
ta_internal int64_t ta_phase_occurrences(int phase);
ta_internal int ta_phase_count(void);
/* Name of phase `id`, or NULL. */
ta_internal const char *ta_phase_name(int id);

/* fork(): hold the phase lock across it (runtime.c's fork handler); parent
 * and child both release it. */
ta_internal void ta_phase_fork_prepare(void);
ta_internal void ta_phase_fork_release(void);

/* Forget every phase name and the stack (torchalloc_init). */
ta_internal void ta_phase_reset(void);

#endif
