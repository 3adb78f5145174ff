/* Private pools and routing (heap.h): the memory of CUDA graphs and of
 * torch.cuda.MemPool, as PyTorch's allocator keeps it.
 *
 * A pool is its own policy object (the registry's choice for private
 * pools, one that caches), so its blocks are carved only from its segments
 * and a freed block goes back only to it, whatever pool or policy is
 * current at free time. Which requests go to which pool is decided above
 * the core (the C++ bridge evaluates PyTorch's per-pool filters); the core
 * is told only that routing is on, because then no call may synchronize or
 * touch an event: during stream capture those would invalidate the graph.
 *
 * Lifetime, as in PyTorch: retain (createOrIncrefPool, beginAllocateToPool)
 * adds a user, release (releasePool) takes one; at zero the pool is
 * freeable, and its free segments go back to the device at the next
 * release of cached memory (empty_cache, the OOM retry, pool_empty). A pool
 * whose segments are all gone is deleted.
 *
 * A pool may have its own allocator (MemPool(allocator=...)): its policy's
 * segments then come from there (ta_segment_source), and a pool marked
 * use_on_oom lends its free cached blocks to requests the device refused,
 * as PyTorch's does. */
#include <stdlib.h>
#include <string.h>

#include "heap/heap_pools.h"
#include "heap/heap_streams.h"
#include "log/log.h"

static ta_private_pool *find(ta_heap *h, const uint64_t id[2]) TA_REQUIRES(h->lock) {
  for (size_t i = 0; i < h->npools; i++)
    if (h->pools[i].id[0] == id[0] && h->pools[i].id[1] == id[1]) return &h->pools[i];
  return NULL;
}

static ta_private_pool *create(ta_heap *h, const uint64_t id[2], const torchalloc_pool_source *source)
    TA_REQUIRES(h->lock) {
  if (ta_grow(&h->pools, &h->cap_pools, h->npools + 1, 4)) return NULL;
  uint8_t id_policy = ta_policy_for_private_pools();
  ta_policy *policy = ta_policy_by_id(id_policy)->create(&h->seg, id_policy, 0); /* never expandable: see policy.h */
  if (!policy) return NULL;
  if (source && !(policy->source = ta_segment_source_new(source))) {
    policy->ops->destroy(policy);
    return NULL;
  }
  ta_private_pool *p = &h->pools[h->npools++];
  *p = (ta_private_pool){.id = {id[0], id[1]}, .use_count = 0, .policy = policy};
  return p;
}

/* The pool's policy and its reference to its source (each of its segments
 * still holds one). */
static void destroy_policy(ta_policy *policy) {
  ta_segment_source *src = policy->source;
  policy->ops->destroy(policy);
  ta_segment_source_drop(src);
}

/* Bytes of segments the pool's policy holds (its blocks are in them). */
static size_t pool_reserved(ta_heap *h, const ta_private_pool *p) TA_REQUIRES(h->lock) {
  size_t total = 0;
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; i < r->count; i++)
    if (r->items[i]->policy_instance == p->policy) total += r->items[i]->size;
  return total;
}

/* Release a freeable pool's free segments; delete it once it holds none. */
static size_t drain(ta_heap *h, size_t index) TA_REQUIRES(h->lock) {
  ta_private_pool *p = &h->pools[index];
  size_t released = p->policy->ops->release_cached(p->policy);
  if (pool_reserved(h, p) == 0) {
    destroy_policy(p->policy);
    h->pools[index] = h->pools[--h->npools];
  }
  return released;
}

size_t ta_heap_release_freeable_pools(ta_heap *h) {
  size_t released = 0;
  for (size_t i = h->npools; i-- > 0;)
    if (h->pools[i].use_count == 0) released += drain(h, i);
  return released;
}

void ta_heap_pools_destroy(ta_heap *h) {
  for (size_t i = 0; i < h->npools; i++) destroy_policy(h->pools[i].policy);
  free(h->pools);
  h->pools = NULL;
  h->npools = h->cap_pools = 0;
}

int ta_heap_pool_create(ta_heap *h, const uint64_t id[2], const torchalloc_pool_source *source) {
  ta_lock_acquire(&h->lock);
  ta_private_pool *p = find(h, id);
  int count = -2;
  if (!p || !source) {
    if (!p) p = create(h, id, source);
    count = p ? ++p->use_count : -1;
  }
  ta_lock_release(&h->lock);
  return count;
}

int ta_heap_pool_retain(ta_heap *h, const uint64_t id[2]) { return ta_heap_pool_create(h, id, NULL); }

int ta_heap_pool_flags(ta_heap *h, const uint64_t id[2], unsigned set, unsigned clear) {
  ta_lock_acquire(&h->lock);
  ta_private_pool *p = find(h, id);
  if (p) {
    p->flags = (p->flags | set) & ~clear;
    p->policy->flags &= ~TA_POLICY_NO_SPLIT; /* requests from now on: blocks split before stay so */
    if (p->flags & TORCHALLOC_POOL_NO_SPLIT) p->policy->flags |= TA_POLICY_NO_SPLIT;
  }
  int flags = p ? (int)p->flags : -1;
  ta_lock_release(&h->lock);
  return flags;
}

ta_block *ta_heap_pools_serve_oom(ta_heap *h, size_t size, cudaStream_t stream, int phase) {
  ta_block *b = NULL;
  h->seg.no_new_segments = 1; /* PyTorch's use_on_oom takes cached blocks only */
  for (size_t i = 0; !b && i < h->npools; i++) {
    ta_private_pool *p = &h->pools[i];
    if ((p->flags & TORCHALLOC_POOL_USE_ON_OOM) && p->use_count > 0)
      b = p->policy->ops->malloc(p->policy, size, stream, phase);
  }
  h->seg.no_new_segments = 0;
  return b;
}

int ta_heap_pool_release(ta_heap *h, const uint64_t id[2]) {
  ta_lock_acquire(&h->lock);
  ta_private_pool *p = find(h, id);
  int count = -1;
  if (p && p->use_count > 0) count = --p->use_count;
  ta_lock_release(&h->lock);
  return count;
}

int ta_heap_pool_use_count(ta_heap *h, const uint64_t id[2]) {
  ta_lock_acquire(&h->lock);
  ta_private_pool *p = find(h, id);
  int count = p ? p->use_count : -1;
  ta_lock_release(&h->lock);
  return count;
}

ta_policy *ta_heap_pool_policy(ta_heap *h, const uint64_t id[2]) {
  ta_private_pool *p = find(h, id);
  if (!p && (p = create(h, id, NULL)) != NULL) p->use_count = 1; /* as beginAllocateToPool would have made it */
  return p ? p->policy : NULL;
}

void ta_heap_pool_hold(ta_heap *h, const uint64_t id[2], int delta) {
  ta_private_pool *p = find(h, id);
  if (p) p->use_count += delta;
}

int64_t ta_heap_pool_live(ta_heap *h, const uint64_t id[2], uint64_t *addrs, size_t cap) {
  ta_lock_acquire(&h->lock);
  ta_private_pool *p = find(h, id);
  int64_t n = p ? 0 : -1;
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; p && i < r->count; i++) {
    if (r->items[i]->policy_instance != p->policy) continue;
    for (const ta_block *b = r->items[i]->first; b; b = b->next) {
      if (b->state != TA_BLOCK_LIVE) continue;
      if ((size_t)n < cap) addrs[n] = b->addr;
      n++;
    }
  }
  ta_lock_release(&h->lock);
  return n;
}

int64_t ta_heap_pool_empty(ta_heap *h, const uint64_t id[2]) {
  int phase = ta_phase_current();
  ta_lock_acquire(&h->lock);
  int64_t released = -1;
  for (size_t i = 0; i < h->npools; i++) {
    if (h->pools[i].id[0] != id[0] || h->pools[i].id[1] != id[1]) continue;
    released = 0;
    if (h->pools[i].use_count == 0 && !h->routing) {
      h->seg.phase = phase;
      ta_segments_synchronize(&h->seg); /* the graph's last replay may still run */
      released = (int64_t)drain(h, i);
      if (ta_log_on() && h->seg.logged) ta_log_trim(h->device, (size_t)released, phase, TA_LOG_TRIM_EMPTY_CACHE);
    }
    break;
  }
  ta_lock_release(&h->lock);
  return released;
}

void ta_heap_routing_begin(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  h->routing++;
  h->seg.no_sync = 1; /* expandable segments must not synchronize, query events, unmap or remap during a capture */
  ta_lock_release(&h->lock);
}

int ta_heap_routing_end(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  int ok = h->routing > 0;
  if (ok) h->seg.no_sync = h->routing > 1;
  if (ok && --h->routing == 0 && h->npending) {
    ta_heap_record_deferred_events(h);
    ta_heap_process_pending(h); /* frees that waited only for routing go back now */
  }
  ta_lock_release(&h->lock);
  return ok ? 0 : -1;
}
