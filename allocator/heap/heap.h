/* One heap per device: the lock, the policies, the pointer map of live
 * blocks, the segment layer, the stats and the per-phase accounting.
 *
 * The heap is the layer that calls the policies (through policy.h and the
 * registry) and is called by the runtime and the public API; it writes log
 * records but the log never calls it. It names no policy: it asks the
 * registry by name or id and calls whatever optional operations a policy
 * provides. Split by job, all in allocator/heap/: heap.c (malloc, free,
 * control), heap_streams.c (record_stream and the frees it defers),
 * heap_pools.c (private pools: CUDA graphs, MemPool), heap_oom.c (the
 * out-of-memory account and its verdict), heap_inspect.c (snapshots of
 * segments and blocks for stats and the bridge) and heap_check.c (the
 * invariant checker). */
#ifndef TA_HEAP_H
#define TA_HEAP_H

#include "context/config.h"
#include "base/lock.h"
#include "context/phase.h"
#include "policy/policy.h"
#include "block/ptrmap.h"
#include "segments/segments.h"
#include "accounting/stats.h"

/* A block freed by the caller while work on other streams may still use it
 * (record_stream): reused once every event has completed. Freed while
 * allocations are routed to a private pool (a CUDA graph capture may be
 * underway), its events cannot be recorded yet: nevents is -1 and b->uses
 * keeps the streams until routing ends. */
typedef struct ta_pending_free {
  ta_block *block;
  int nevents;
  void **events;
} ta_pending_free;

/* A private pool (heap_pools.c): the memory of a CUDA graph, or of a
 * torch.cuda.MemPool. Its blocks are carved only from its own segments and
 * go back only to it; its segments return to the device only once nobody
 * uses the pool (a captured graph replays into those addresses). */
typedef struct ta_private_pool {
  uint64_t id[2];     /* PyTorch's MempoolId_t */
  int use_count;      /* create/retain add one, release takes one; 0: freeable */
  ta_policy *policy;  /* its own policy object */
} ta_private_pool;

/* Per-device accounting of one phase (the reserved growth and release of a
 * phase are counted by the segment layer, which makes them). */
typedef struct ta_phase_acct {
  torchalloc_phase_stats pub;
  uint32_t epoch;     /* occurrence the occ_* counters belong to */
  int64_t occ_alloc;  /* bytes allocated in that occurrence */
  int64_t occ_freed;  /* of those, bytes freed while it was open */
} ta_phase_acct;

#define TA_RECENT_FREES 64

/* The last request this heap could not serve, as it stood at the failure
 * (filled under the lock by heap_oom.c; read by torchalloc_last_oom, the
 * summary in the bridge's OutOfMemoryError, the report file). */
typedef struct ta_oom_info {
  int64_t count;            /* failures so far; 0: none yet */
  torchalloc_oom_facts facts;
  torchalloc_oom_detail detail; /* the segments' free and live memory: what the advice rests on */
  int verdict;              /* TORCHALLOC_OOM_* */
  uintptr_t stream;
  int64_t pending;          /* freed bytes still waiting for other streams */
  size_t largest_free;      /* largest free block in the heap's segments, any stream */
  int phase;
  int routing;              /* a capture or MemPool context was open */
  uint8_t policy;           /* registry id of the policy that failed */
  char report_path[1024];   /* where the full report went ("" until written, or when it could not be) */
} ta_oom_info;

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
  ta_private_pool *pools;
  size_t npools, cap_pools;
  /* Open beginAllocateToPool contexts (a graph capture or use_mem_pool):
   * while any is open nothing may synchronize, query or record an event
   * (illegal during stream capture), so cached memory is not released and
   * record_stream frees wait (PyTorch's allocator does the same). */
  int routing;
  uint32_t alloc_seq; /* allocations made so far (wraps): blocks keep theirs as their age */
  ta_oom_info oom;
  char *oom_report;   /* the full text of the last failure's report (heap_oom.c) */
  double fraction; /* the memory fraction last set; 0: none */
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
/* The caller's free: a size or stream other than the block's is misuse,
 * counted and reported, and the block stays allocated. */
ta_internal void ta_heap_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream);
/* The same with the phase given, not read from the process-wide stack, and
 * the stream not checked (replay drives a private heap through a recorded
 * trace's phases; a trace may free on another stream than it allocated). */
ta_internal void *ta_heap_malloc_in_phase(ta_heap *h, size_t size, cudaStream_t stream, int phase, uint32_t epoch);
ta_internal void ta_heap_free_in_phase(ta_heap *h, void *ptr, size_t size, cudaStream_t stream, int phase);
/* Free `ptr` by itself (size and stream from its block) when it is a live
 * block of this heap; 0 when it is not (nothing happens then). */
ta_internal int ta_heap_free_if_live(ta_heap *h, void *ptr);
/* The last failure (a copy taken under the lock). */
ta_internal void ta_heap_last_oom(ta_heap *h, ta_oom_info *out);

/* --- inspection (heap_inspect.c) --- */

/* Segments and blocks in address order (torchalloc_snapshot's contract). */
ta_internal int ta_heap_snapshot(ta_heap *h, torchalloc_segment_info *segments, size_t segments_cap,
                                 torchalloc_block_info *blocks, size_t blocks_cap, size_t *nsegments,
                                 size_t *nblocks);
/* The segment holding `addr`: 1 with its base and size, 0 when none does. */
ta_internal int ta_heap_segment_of(ta_heap *h, uintptr_t addr, uintptr_t *base, size_t *size);
ta_internal size_t ta_heap_largest_free(ta_heap *h);

/* --- out of memory (heap_oom.c) --- */

/* Fill h->oom and build the report at a failure (lock held). */
ta_internal void ta_heap_note_oom(ta_heap *h, ta_policy *policy, size_t size, cudaStream_t stream, int phase);
/* The summary of a failure, one paragraph starting "CUDA out of memory."
 * and its advice, one line each. Returns the length it needed (snprintf's
 * convention); TA_OOM_SUMMARY_MAX holds any (a report path of 1 KiB, the
 * advice's four lines). */
#define TA_OOM_SUMMARY_MAX 6144
ta_internal int ta_heap_format_oom(const ta_oom_info *o, int device, char *buf, size_t len);
/* The summary on stderr (lock held). */
ta_internal void ta_heap_print_oom(ta_heap *h);
/* A copy of the last report's text (malloc'ed, the caller frees), NULL when none. */
ta_internal char *ta_heap_oom_report_copy(ta_heap *h);
/* Write the last report to `path` (outside the lock: file I/O) and remember where. */
ta_internal void ta_heap_write_oom_report(ta_heap *h, const char *path);
/* Count and report a request larger than TA_MAX_REQUEST (no device has it). */
ta_internal void ta_heap_report_bad_size(ta_heap *h, size_t size);
/* Count and report a free of an address that is not a live block. */
ta_internal void ta_heap_report_bad_free(ta_heap *h, uintptr_t addr);
ta_internal int ta_heap_set_policy(ta_heap *h, const char *name);
/* 1 when `ptr` is a live block of this heap (and the use was recorded). */
ta_internal int ta_heap_record_stream(ta_heap *h, void *ptr, cudaStream_t stream);
/* The memory fraction: `limit` bytes of reserve at most (0: none). */
ta_internal void ta_heap_set_limit(ta_heap *h, size_t limit, double fraction);
ta_internal double ta_heap_fraction(ta_heap *h);
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

/* --- private pools and routing (heap_pools.c) --- */

/* Create the pool, or add a user. The new use count, or -1 (host memory). */
ta_internal int ta_heap_pool_retain(ta_heap *h, const uint64_t id[2]);
/* Drop a user: at 0 the pool is freeable, its cached segments go back to
 * the device at the next release of cached memory. New count, or -1 when
 * there is no such pool. */
ta_internal int ta_heap_pool_release(ta_heap *h, const uint64_t id[2]);
/* Users of the pool, or -1 when there is none. */
ta_internal int ta_heap_pool_use_count(ta_heap *h, const uint64_t id[2]);
/* An allocation from the pool (created if needed), in the current phase. */
ta_internal void *ta_heap_pool_malloc(ta_heap *h, size_t size, cudaStream_t stream, const uint64_t id[2]);
/* The pool's live blocks' addresses (up to cap); returns how many there are, -1: no pool. */
ta_internal int64_t ta_heap_pool_live(ta_heap *h, const uint64_t id[2], uint64_t *addrs, size_t cap);
/* Release the free segments of a freeable pool (-1 for no such pool). */
ta_internal int64_t ta_heap_pool_empty(ta_heap *h, const uint64_t id[2]);
/* Make the pool's live blocks exactly `live` (addr, size, requested of
 * each): every block it hands out now is freed (their addresses go to
 * `freed`, at most freed_cap, *nfreed the count), then each of `live` is
 * carved again at its address (they must lie in the pool's free segments).
 * 0, or -1 with the reason in err. (heap.c) */
ta_internal int ta_heap_pool_restore(ta_heap *h, const uint64_t id[2], const torchalloc_block_info *live, size_t n,
                                     uint64_t *freed, size_t freed_cap, size_t *nfreed, char *err, size_t errlen);
/* Routing contexts open and close (beginAllocateToPool / endAllocateToPool). */
ta_internal void ta_heap_routing_begin(ta_heap *h);
ta_internal int ta_heap_routing_end(ta_heap *h);
/* Release the free segments of every freeable pool; delete the empty ones.
 * Caller holds the lock, synchronized, and routing is 0. */
ta_internal size_t ta_heap_release_freeable_pools(ta_heap *h);
/* Free the pool objects (teardown). */
ta_internal void ta_heap_pools_destroy(ta_heap *h);

/* --- between the heap's files (caller holds h->lock) --- */

/* A request in flight holds pool `id` (delta +1, then -1): a freeable pool
 * is not drained while it allocates. */
ta_internal void ta_heap_pool_hold(ta_heap *h, const uint64_t id[2], int delta);

/* The block leaves the pointer map and goes back to the policy object that
 * made it (a private pool's, or the heap's instance of its policy). */
static inline void ta_heap_release_block(ta_heap *h, ta_block *b) {
  ta_ptrmap_take(&h->live, b->addr);
  ta_policy *p = b->segment->policy_instance;
  p->ops->free(p, b);
}
/* Record events on the streams that used `b` (record_stream); it is reused
 * when they complete. */
ta_internal void ta_heap_defer_free(ta_heap *h, ta_block *b);
/* Hand back every pending block whose events have all completed. Not while
 * routing: querying events during a capture would invalidate it. */
ta_internal void ta_heap_process_pending(ta_heap *h);
/* Routing ended: record the events of the frees that had to wait for it. */
ta_internal void ta_heap_record_deferred_events(ta_heap *h);
/* The policy object of pool `id`, creating the pool (use count 1) when it
 * does not exist; NULL when host memory runs out. Lock held. */
ta_internal ta_policy *ta_heap_pool_policy(ta_heap *h, const uint64_t id[2]);

#endif
