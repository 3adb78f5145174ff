/* One heap per device: the lock, the policies, the pointer map of live
 * blocks, the segment layer, the stats and the per-phase accounting.
 *
 * The heap is the layer that calls the policies (through policy.h and the
 * registry) and is called by the runtime and the public API; it writes log
 * records but the log never calls it. It names no policy: it asks the
 * registry by name or id and calls whatever optional operations a policy
 * provides. Split by job: heap.c (malloc, free, control), heap_streams.c
 * (record_stream and the frees it defers), heap_check.c (the invariant
 * checker). */
#ifndef TA_HEAP_H
#define TA_HEAP_H

#include "config.h"
#include "lock.h"
#include "phase.h"
#include "policy.h"
#include "ptrmap.h"
#include "segments.h"
#include "stats.h"

/* A block freed by the caller while work on other streams may still use it
 * (record_stream): reused once every event has completed. */
typedef struct ta_pending_free {
  ta_block *block;
  int nevents;
  void **events;
} ta_pending_free;

/* Per-device accounting of one phase (the reserved growth and release of a
 * phase are counted by the segment layer, which makes them). */
typedef struct ta_phase_acct {
  torchalloc_phase_stats pub;
  uint32_t epoch;     /* occurrence the occ_* counters belong to */
  int64_t occ_alloc;  /* bytes allocated in that occurrence */
  int64_t occ_freed;  /* of those, bytes freed while it was open */
} ta_phase_acct;

#define TA_RECENT_FREES 64

typedef struct ta_heap {
  ta_lock lock;
  int device;
  const ta_config *conf;
  torchalloc_stats stats; /* hot-path layout, see stats.h; read it through ta_heap_get_stats */
  ta_pending_stats pending_stats;
  ta_ptrmap live;
  ta_segments seg;
  ta_policy *policies[TA_MAX_POLICIES]; /* created on first use */
  ta_policy *current;
  ta_pending_free *pending;
  size_t npending, cap_pending;
  /* The last addresses freed: tells a double free from a wild pointer after
   * the segment is gone (error path only; one store per free). */
  uintptr_t recent_frees[TA_RECENT_FREES];
  unsigned recent_pos;
  ta_phase_acct phases[TA_MAX_PHASES];
} ta_heap;

/* A heap for `device` of `backend`, its current policy named by the config.
 * NULL with a message in err when it cannot be made. `logged`: write the
 * process event log (the runtime's heaps; not replay's private one). */
ta_internal ta_heap *ta_heap_create(ta_backend *backend, int device, const ta_config *conf, int logged, char *err,
                                    size_t errlen);
ta_internal void ta_heap_destroy(ta_heap *h);

ta_internal void *ta_heap_malloc(ta_heap *h, size_t size, cudaStream_t stream);
ta_internal void ta_heap_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream);
/* The same with the phase given, not read from the process-wide stack
 * (replay drives a private heap through a recorded trace's phases). */
ta_internal void *ta_heap_malloc_in_phase(ta_heap *h, size_t size, cudaStream_t stream, int phase, uint32_t epoch);
ta_internal void ta_heap_free_in_phase(ta_heap *h, void *ptr, size_t size, cudaStream_t stream, int phase);
ta_internal int ta_heap_set_policy(ta_heap *h, const char *name);
/* 1 when `ptr` is a live block of this heap (and the use was recorded). */
ta_internal int ta_heap_record_stream(ta_heap *h, void *ptr, cudaStream_t stream);
ta_internal void ta_heap_set_limit(ta_heap *h, size_t limit);
ta_internal size_t ta_heap_release_cached(ta_heap *h);
/* Blocks the caller holds (freed blocks waiting for streams are not). */
ta_internal size_t ta_heap_live_blocks(ta_heap *h);
ta_internal void ta_heap_report_bad_record_stream(ta_heap *h, void *ptr);
ta_internal void ta_heap_get_stats(ta_heap *h, torchalloc_stats *out);
ta_internal void ta_heap_reset_peak_stats(ta_heap *h);
ta_internal void ta_heap_reset_accumulated_stats(ta_heap *h);
ta_internal void ta_heap_get_phase_stats(ta_heap *h, int phase, torchalloc_phase_stats *out);
/* Close occurrence `epoch` of `phase`: persistent vs transient bytes. */
ta_internal void ta_heap_phase_ended(ta_heap *h, int phase, uint32_t epoch);
/* Per-phase arenas of the policies that have them (-1: all phases):
 * reserved bytes / releasing their cached segments. */
ta_internal int64_t ta_heap_arena_reserved(ta_heap *h, int phase);
ta_internal int64_t ta_heap_arena_release(ta_heap *h, int phase);
/* 0, or -1 with a description in err. */
ta_internal int ta_heap_check(ta_heap *h, char *err, size_t errlen);

/* --- between the heap's files (caller holds h->lock) --- */

/* The block leaves the pointer map and goes back to the policy that made it. */
static inline void ta_heap_release_block(ta_heap *h, ta_block *b) {
  ta_ptrmap_take(&h->live, b->addr);
  ta_policy *p = h->policies[b->policy];
  p->ops->free(p, b);
}
/* Record events on the streams that used `b` (record_stream); it is reused
 * when they complete. */
ta_internal void ta_heap_defer_free(ta_heap *h, ta_block *b);
/* Hand back every pending block whose events have all completed. */
ta_internal void ta_heap_process_pending(ta_heap *h);

#endif
