/* Training phases. The current phase is process-wide: the autograd engine
 * allocates on its own threads while the main thread waits in backward(),
 * and those allocations belong to the phase the main thread set. */
#ifndef TA_PHASE_H
#define TA_PHASE_H

#include <stdatomic.h>

#include "common.h"

#define TA_MAX_PHASES 256 /* distinct names per process; 0 is "default" */
#define TA_PHASE_DEFAULT 0

ta_internal extern _Atomic int ta_current_phase;

static inline int ta_phase_current(void) { return atomic_load_explicit(&ta_current_phase, memory_order_relaxed); }

#endif
