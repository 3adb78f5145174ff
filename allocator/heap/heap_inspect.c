/* Reading the heap's memory as it is now (heap.h): the snapshot PyTorch's
 * memory_snapshot() shows, the segment around a pointer, the largest cached
 * block. Never on the hot path. */
#include "heap/heap.h"

/* Which private pool owns `s`: its id, {0, 0} for the default pool. */
static void pool_of(const ta_heap *h, const ta_segment *s, uint64_t id[2]) {
  id[0] = id[1] = 0;
  for (size_t i = 0; i < h->npools; i++)
    if (h->pools[i].policy == s->policy_instance) {
      id[0] = h->pools[i].id[0];
      id[1] = h->pools[i].id[1];
      return;
    }
}

int ta_heap_snapshot(ta_heap *h, torchalloc_segment_info *segments, size_t segments_cap,
                     torchalloc_block_info *blocks, size_t blocks_cap, size_t *nsegments, size_t *nblocks) {
  ta_lock_acquire(&h->lock);
  const ta_segment_registry *r = &h->seg.registry;
  size_t nb = 0;
  for (size_t i = 0; i < r->count; i++) {
    const ta_segment *s = r->items[i];
    torchalloc_segment_info info = {.addr = s->addr, .size = s->size, .stream = (uintptr_t)s->stream,
                                    .first_block = nb, .pool = s->pool, .policy = s->policy};
    pool_of(h, s, info.pool_id);
    for (const ta_block *b = s->first; b; b = b->next, nb++, info.nblocks++) {
      if (nb >= blocks_cap) continue;
      blocks[nb] = (torchalloc_block_info){
          .addr = b->addr,
          .size = b->size,
          .requested = b->state == TA_BLOCK_FREE ? 0 : b->requested,
          .stack = b->state == TA_BLOCK_FREE ? 0 : b->stack_id,
          .phase = b->state == TA_BLOCK_FREE ? 0 : b->phase,
          .state = b->state == TA_BLOCK_LIVE      ? TORCHALLOC_BLOCK_LIVE
                   : b->state == TA_BLOCK_PENDING ? TORCHALLOC_BLOCK_PENDING
                                                  : TORCHALLOC_BLOCK_FREE,
      };
    }
    if (i < segments_cap) segments[i] = info;
  }
  *nsegments = r->count;
  *nblocks = nb;
  ta_lock_release(&h->lock);
  return r->count <= segments_cap && nb <= blocks_cap ? 0 : 1;
}

int ta_heap_segment_of(ta_heap *h, uintptr_t addr, uintptr_t *base, size_t *size) {
  ta_lock_acquire(&h->lock);
  const ta_segment *s = ta_segments_find(&h->seg, addr);
  if (s) {
    *base = s->addr;
    *size = s->size;
  }
  ta_lock_release(&h->lock);
  return s != NULL;
}

size_t ta_heap_largest_free(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  size_t largest = 0;
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; i < r->count; i++)
    for (const ta_block *b = r->items[i]->first; b; b = b->next)
      if (b->state == TA_BLOCK_FREE && b->size > largest) largest = b->size;
  ta_lock_release(&h->lock);
  return largest;
}
