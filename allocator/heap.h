/* One heap per device: the lock, the policies, the pointer map of live
 * blocks, the registry of segments and the stats. Everything a policy needs
 * from the outside world goes through the functions below. */
#ifndef TA_HEAP_H
#define TA_HEAP_H

#include <pthread.h>

#include "../policies/policy.h"
#include "backend.h"
#include "config.h"
#include "lock.h"
#include "phase.h"
#include "ptrmap.h"
#include "stats.h"

/* Blocks are carved from slabs and recycled through a free list: the hot
 * path never calls malloc(3) once the heap is warm. */
typedef struct ta_block_slab {
  ta_block *free_list;
  void **chunks;
  size_t nchunks, cap_chunks;
} ta_block_slab;

/* Segments sorted by address: finds the segment around a bad pointer and
 * lets the checker and exporters walk memory in order. */
typedef struct ta_segment_registry {
  ta_segment **items;
  size_t count, cap;
} ta_segment_registry;

/* A block freed by the caller while work on other streams may still use it
 * (record_stream): reused once every event has completed. */
typedef struct ta_pending_free {
  ta_block *block;
  int nevents;
  void **events;
} ta_pending_free;

#define TA_RECENT_FREES 64

typedef struct ta_heap {
  ta_lock lock;
  int device;
  ta_backend *backend;
  const ta_config *conf;
  torchalloc_stats stats;   /* hot-path layout, see stats.h; read it through ta_heap_get_stats */
  ta_pending_stats pending_stats;
  ta_ptrmap live;
  ta_segment_registry segments;
  ta_block_slab slab;
  ta_policy *policies[TA_NPOLICIES]; /* created on first use */
  ta_policy *current;
  size_t limit; /* reserved-bytes ceiling from set_memory_fraction; 0 = none */
  ta_pending_free *pending;
  size_t npending, cap_pending;
  int request_phase;
  /* The last addresses freed: tells a double free from a wild pointer after
   * the segment is gone (error path only; one store per free). */
  uintptr_t recent_frees[TA_RECENT_FREES];
  unsigned recent_pos; /* phase of the call in flight: segment growth is charged to it */
  int logged;        /* writes the process event log (entry.c's heaps; not replay's private one) */
  ta_phase_acct phases[TA_MAX_PHASES];
} ta_heap;

/* Create/destroy a heap for `device` of `backend`; `policy` names the first
 * current policy. NULL with a message in err when it cannot be made. */
ta_internal ta_heap *ta_heap_create(ta_backend *backend, int device, const ta_config *conf, char *err, size_t errlen);
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
/* phase_arena's arena of `phase` (-1: all): reserved bytes / release cached. */
ta_internal int64_t ta_heap_arena_reserved(ta_heap *h, int phase);
ta_internal int64_t ta_heap_arena_release(ta_heap *h, int phase);
/* 0, or -1 with a description in err. */
ta_internal int ta_heap_check(ta_heap *h, char *err, size_t errlen);

/* --- services for policies (caller holds h->lock) --- */
ta_internal ta_block *ta_heap_block_new(ta_heap *h);
ta_internal void ta_heap_block_delete(ta_heap *h, ta_block *b);
/* A device allocation of `size` bytes as one segment holding one FREE block
 * (not yet in any free index). NULL when the device is out of memory. */
ta_internal ta_segment *ta_heap_segment_alloc(ta_heap *h, size_t size, cudaStream_t stream, int pool, void *owner,
                                             uint8_t policy);
/* Return a segment (whose only block is FREE and out of any index) to the device. */
ta_internal void ta_heap_segment_release(ta_heap *h, ta_segment *s);
/* Free blocks that are part of a split segment count as inactive_split. */
ta_internal void ta_heap_note_inactive_split(ta_heap *h, const ta_block *b, int sign);

#endif
