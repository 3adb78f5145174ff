/* Private pools and routing (heap_pools.c): the memory of CUDA graphs and
 * torch.cuda.MemPool, and the contexts that send allocations to them. */
#ifndef TA_HEAP_POOLS_H
#define TA_HEAP_POOLS_H

#include "heap/heap_state.h"

/* Create the pool, or add a user. The new use count, or -1 (host memory). */
ta_internal int ta_heap_pool_retain(ta_heap *h, const uint64_t id[2]) TA_EXCLUDES(h->lock);
/* The same for a pool whose segments come from `source` (NULL: the
 * device); -2 when the pool exists already and `source` is not NULL. */
ta_internal int ta_heap_pool_create(ta_heap *h, const uint64_t id[2], const torchalloc_pool_source *source)
    TA_EXCLUDES(h->lock);
/* Turn TORCHALLOC_POOL_* flags of `set` on, then `clear` off: the pool's
 * flags now, or -1 when there is no such pool. */
ta_internal int ta_heap_pool_flags(ta_heap *h, const uint64_t id[2], unsigned set, unsigned clear)
    TA_EXCLUDES(h->lock);
/* Drop a user: at 0 the pool is freeable, its cached segments go back to
 * the device at the next release of cached memory. New count, or -1 when
 * there is no such pool. */
ta_internal int ta_heap_pool_release(ta_heap *h, const uint64_t id[2]) TA_EXCLUDES(h->lock);
/* Users of the pool, or -1 when there is none. */
ta_internal int ta_heap_pool_use_count(ta_heap *h, const uint64_t id[2]) TA_EXCLUDES(h->lock);
/* The pool's live blocks' addresses (up to cap); returns how many there are, -1: no pool. */
ta_internal int64_t ta_heap_pool_live(ta_heap *h, const uint64_t id[2], uint64_t *addrs, size_t cap)
    TA_EXCLUDES(h->lock);
/* Release the free segments of a freeable pool (-1 for no such pool). */
ta_internal int64_t ta_heap_pool_empty(ta_heap *h, const uint64_t id[2]) TA_EXCLUDES(h->lock);
/* Routing contexts open and close (beginAllocateToPool / endAllocateToPool). */
ta_internal void ta_heap_routing_begin(ta_heap *h) TA_EXCLUDES(h->lock);
ta_internal int ta_heap_routing_end(ta_heap *h) TA_EXCLUDES(h->lock);
/* Release the free segments of every freeable pool; delete the empty ones.
 * Caller holds the lock, synchronized, and routing is 0. */
ta_internal size_t ta_heap_release_freeable_pools(ta_heap *h) TA_REQUIRES(h->lock);
/* Free the pool objects (teardown). */
ta_internal void ta_heap_pools_destroy(ta_heap *h);

/* --- between the heap's files (caller holds h->lock) --- */

/* A request in flight holds pool `id` (delta +1, then -1): a freeable pool
 * is not drained while it allocates. */
ta_internal void ta_heap_pool_hold(ta_heap *h, const uint64_t id[2], int delta) TA_REQUIRES(h->lock);
/* A request outside any pool that the device refused: a free cached block
 * of a use_on_oom pool with users, or NULL. No new segment is made. */
ta_internal ta_block *ta_heap_pools_serve_oom(ta_heap *h, size_t size, cudaStream_t stream, int phase)
    TA_REQUIRES(h->lock);
/* The policy object of pool `id`, creating the pool (use count 1) when it
 * does not exist; NULL when host memory runs out. Lock held. */
ta_internal ta_policy *ta_heap_pool_policy(ta_heap *h, const uint64_t id[2]) TA_REQUIRES(h->lock);

#endif
