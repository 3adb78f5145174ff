/* Reading the heap's memory as it is now (heap.h): the snapshot PyTorch's
 * memory_snapshot() shows, the segment around a pointer, the largest cached
 * block. Never on the hot path. */
#include "heap/heap.h"

/* Which private pool owns `s`: its id, {0, 0} for the default pool. */
static void pool_of(const ta_heap *h, const ta_segment *s, uint64_t id[2]) TA_REQUIRES(h->lock) {
  id[0] = id[1] = 0;
  for (size_t i = 0; i < h->npools; i++)
    if (h->pools[i].policy == s->policy_instance) {
      id[0] = h->pools[i].id[0];
      id[1] = h->pools[i].id[1];
      return;
    }
}

/* The blocks of `s` within [lo, hi), cut to it (live and pending blocks lie
 * wholly on mapped granules: only free ones are ever cut). */
static void stretch_blocks(const ta_segment *s, uintptr_t lo, uintptr_t hi, torchalloc_segment_info *info,
                           torchalloc_block_info *blocks, size_t blocks_cap, size_t *nb) {
  for (const ta_block *b = s->first; b && b->addr < hi; b = b->next) {
    uintptr_t start = b->addr > lo ? b->addr : lo, end = b->addr + b->size < hi ? b->addr + b->size : hi;
    if (end <= start) continue;
    int freed = b->state != TA_BLOCK_LIVE && b->state != TA_BLOCK_PENDING;
    if (*nb < blocks_cap)
      blocks[*nb] = (torchalloc_block_info){
          .addr = start,
          .size = end - start,
          /* A free block keeps the size of the last request it served, as in PyTorch's snapshot (its
           * memory_plots looks for a freed tensor's size there); in the stretch where the block starts. */
          .requested = !freed || start == b->addr ? b->requested : 0,
          .stack = freed ? 0 : b->stack_id,
          .phase = freed ? 0 : b->phase,
          .state = b->state == TA_BLOCK_LIVE ? TORCHALLOC_BLOCK_LIVE
                   : b->state == TA_BLOCK_PENDING ? TORCHALLOC_BLOCK_PENDING
                                                  : TORCHALLOC_BLOCK_FREE,
      };
    ++*nb;
    info->nblocks++;
  }
}

int ta_heap_snapshot(ta_heap *h, torchalloc_segment_info *segments, size_t segments_cap,
                     torchalloc_block_info *blocks, size_t blocks_cap, size_t *nsegments, size_t *nblocks) {
  ta_lock_acquire(&h->lock);
  const ta_segment_registry *r = &h->seg.registry;
  size_t nb = 0, ns = 0;
  for (size_t i = 0; i < r->count; i++) {
    const ta_segment *s = r->items[i];
    uintptr_t lo = s->addr, hi = s->addr + s->size, end = hi;
    /* An expandable segment: each stretch of mapped granules (none when all
     * of it went back to the device); an ordinary one: all of it. */
    for (uintptr_t from = s->addr; s->expansion ? ta_segments_mapped_stretch(s, from, end, &lo, &hi) : from == s->addr;
         from = hi) {
      torchalloc_segment_info info = {.addr = lo, .size = hi - lo, .stream = (uintptr_t)s->stream,
                                      .first_block = nb, .pool = s->pool, .policy = s->policy,
                                      .expandable = s->expansion != NULL};
      pool_of(h, s, info.pool_id);
      stretch_blocks(s, lo, hi, &info, blocks, blocks_cap, &nb);
      if (ns < segments_cap) segments[ns] = info;
      ns++;
    }
  }
  *nsegments = ns;
  *nblocks = nb;
  ta_lock_release(&h->lock);
  return ns <= segments_cap && nb <= blocks_cap ? 0 : 1;
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
