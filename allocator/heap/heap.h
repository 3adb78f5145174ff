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
 * segments and blocks for stats and the bridge), heap_share.c (peer access
 * and CUDA IPC) and heap_check.c (the invariant checker). The state they share is heap_state.h; heap_pools.h
 * and heap_streams.h declare what those two files give. */
#ifndef TA_HEAP_H
#define TA_HEAP_H

#include "heap/heap_state.h"
#include "heap/heap_pools.h"
#include "heap/heap_streams.h"
#include "heap/heap_share.h"

/* How a heap is made, besides its configuration. */
typedef struct ta_heap_options {
  int logged;             /* write the process event log (the runtime's heaps; not replay's private one) */
  ta_free_census *census; /* told of every free block by every policy of the heap from its start (replay's
                           * figures at new peaks); NULL: none */
} ta_heap_options;

/* A heap for `device` of `backend`, its current policy named by the config.
 * NULL with a message in err when it cannot be made. */
ta_internal ta_heap *ta_heap_create(ta_backend *backend, int device, const ta_config *conf,
                                    const ta_heap_options *options, char *err, size_t errlen);
ta_internal void ta_heap_destroy(ta_heap *h);

ta_internal void *ta_heap_malloc(ta_heap *h, size_t size, cudaStream_t stream) TA_EXCLUDES(h->lock);
/* time_calls:1: `ns` of host time spent in one malloc or free entry point
 * (counted without the heap lock: the caller's clock spans the wait for it). */
ta_internal void ta_heap_count_host_time(ta_heap *h, uint64_t ns);
/* The caller's free: a size or stream other than the block's is misuse,
 * counted and reported, and the block stays allocated. */
ta_internal void ta_heap_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) TA_EXCLUDES(h->lock);
/* The same with the phase given, not read from the process-wide stack, and
 * the stream not checked (replay drives a private heap through a recorded
 * trace's phases; a trace may free on another stream than it allocated). */
ta_internal void *ta_heap_malloc_in_phase(ta_heap *h, size_t size, cudaStream_t stream, int phase, uint32_t epoch)
    TA_EXCLUDES(h->lock);
ta_internal void ta_heap_free_in_phase(ta_heap *h, void *ptr, size_t size, cudaStream_t stream, int phase)
    TA_EXCLUDES(h->lock);
/* Free `ptr` by itself (size and stream from its block) when it is a live
 * block of this heap; 0 when it is not (nothing happens then). */
ta_internal int ta_heap_free_if_live(ta_heap *h, void *ptr) TA_EXCLUDES(h->lock);
/* The last failure (a copy taken under the lock). */
ta_internal void ta_heap_last_oom(ta_heap *h, ta_oom_info *out) TA_EXCLUDES(h->lock);

/* --- inspection (heap_inspect.c) --- */

/* Segments and blocks in address order (torchalloc_snapshot's contract). */
ta_internal int ta_heap_snapshot(ta_heap *h, torchalloc_segment_info *segments, size_t segments_cap,
                                 torchalloc_block_info *blocks, size_t blocks_cap, size_t *nsegments,
                                 size_t *nblocks) TA_EXCLUDES(h->lock);
/* The segment holding `addr`: 1 with its base and size, 0 when none does. */
ta_internal int ta_heap_segment_of(ta_heap *h, uintptr_t addr, uintptr_t *base, size_t *size) TA_EXCLUDES(h->lock);
ta_internal size_t ta_heap_largest_free(ta_heap *h) TA_EXCLUDES(h->lock);

/* --- out of memory (heap_oom.c) --- */

/* Fill h->oom and build the report at a failure (lock held). */
ta_internal void ta_heap_note_oom(ta_heap *h, ta_policy *policy, size_t size, cudaStream_t stream, int phase)
    TA_REQUIRES(h->lock);
/* The summary of a failure, one paragraph starting "CUDA out of memory."
 * and its advice, one line each. Returns the length it needed (snprintf's
 * convention); TA_OOM_SUMMARY_MAX holds any (a report path of 1 KiB, the
 * advice's four lines). */
#define TA_OOM_SUMMARY_MAX 6144
ta_internal int ta_heap_format_oom(const ta_oom_info *o, int device, char *buf, size_t len);
/* The summary on stderr (lock held). */
ta_internal void ta_heap_print_oom(ta_heap *h) TA_REQUIRES(h->lock);
/* A copy of the last report's text (malloc'ed, the caller frees), NULL when none. */
ta_internal char *ta_heap_oom_report_copy(ta_heap *h) TA_EXCLUDES(h->lock);
/* Write the last report to a new file at `path` (outside the lock: file I/O)
 * and remember where; a path ending in XXXXXX.txt gets a unique name. */
ta_internal void ta_heap_write_oom_report(ta_heap *h, const char *path) TA_EXCLUDES(h->lock);
/* Count and report a request larger than TA_MAX_REQUEST (no device has it). */
ta_internal void ta_heap_report_bad_size(ta_heap *h, size_t size) TA_EXCLUDES(h->lock);
/* Count and report a free of an address that is not a live block. */
ta_internal void ta_heap_report_bad_free(ta_heap *h, uintptr_t addr) TA_EXCLUDES(h->lock);
ta_internal int ta_heap_set_policy(ta_heap *h, const char *name) TA_EXCLUDES(h->lock);
/* roundup_power2_divisions and graph_capture_record_stream_reuse from now on. */
ta_internal void ta_heap_set_pytorch_settings(ta_heap *h, const ta_roundup *r, int capture_reuse)
    TA_EXCLUDES(h->lock);
/* The memory fraction: `limit` bytes of reserve at most (0: none). */
ta_internal void ta_heap_set_limit(ta_heap *h, size_t limit, double fraction) TA_EXCLUDES(h->lock);
/* The fraction last set, or -1 when none was. */
ta_internal double ta_heap_fraction(ta_heap *h) TA_EXCLUDES(h->lock);
ta_internal size_t ta_heap_release_cached(ta_heap *h) TA_EXCLUDES(h->lock);
/* Blocks the caller holds (freed blocks waiting for streams are not). */
ta_internal size_t ta_heap_live_blocks(ta_heap *h) TA_EXCLUDES(h->lock);
ta_internal void ta_heap_get_stats(ta_heap *h, torchalloc_stats *out) TA_EXCLUDES(h->lock);
ta_internal void ta_heap_reset_peak_stats(ta_heap *h) TA_EXCLUDES(h->lock);
ta_internal void ta_heap_reset_accumulated_stats(ta_heap *h) TA_EXCLUDES(h->lock);
ta_internal void ta_heap_get_phase_stats(ta_heap *h, int phase, torchalloc_phase_stats *out) TA_EXCLUDES(h->lock);
/* Close occurrence `epoch` of `phase`: persistent vs transient bytes. */
ta_internal void ta_heap_phase_ended(ta_heap *h, int phase, uint32_t epoch) TA_EXCLUDES(h->lock);
/* Per-phase arenas of the policies that have them (-1: all phases):
 * reserved bytes / releasing their cached segments. */
ta_internal int64_t ta_heap_arena_reserved(ta_heap *h, int phase) TA_EXCLUDES(h->lock);
ta_internal int64_t ta_heap_arena_release(ta_heap *h, int phase) TA_EXCLUDES(h->lock);
/* 0, or -1 with a description in err. */
ta_internal int ta_heap_check(ta_heap *h, char *err, size_t errlen) TA_EXCLUDES(h->lock);

/* --- private pools (heap.c) --- */

/* An allocation from the pool (created if needed), in the current phase. */
ta_internal void *ta_heap_pool_malloc(ta_heap *h, size_t size, cudaStream_t stream, const uint64_t id[2])
    TA_EXCLUDES(h->lock);
/* Make the pool's live blocks exactly `live` (addr, size, requested of
 * each): every block it hands out now is freed (their addresses go to
 * `freed`, at most freed_cap, *nfreed the count), then each of `live` is
 * carved again at its address (they must lie in the pool's free segments).
 * 0, or -1 with the reason in err. (heap.c) */
ta_internal int ta_heap_pool_restore(ta_heap *h, const uint64_t id[2], const torchalloc_block_info *live, size_t n,
                                     uint64_t *freed, size_t freed_cap, size_t *nfreed, char *err, size_t errlen)
    TA_EXCLUDES(h->lock);

#endif
