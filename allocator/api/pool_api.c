/* Public private-pool functions (torchalloc.h): CUDA graphs and MemPool.
 * Each finds its heap through the runtime; heap_pools.c does the work. */
#include "base/errors.h"
#include "runtime/runtime.h"

TORCHALLOC_API int torchalloc_pool_retain(int device, uint64_t id0, uint64_t id1) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  const uint64_t id[2] = {id0, id1};
  int count = h ? ta_heap_pool_retain(h, id) : -1;
  if (h && count < 0) ta_set_error("out of host memory while creating pool (%llu, %llu)", (unsigned long long)id0,
                                   (unsigned long long)id1);
  return count;
}

TORCHALLOC_API int torchalloc_pool_create(int device, uint64_t id0, uint64_t id1,
                                          const torchalloc_pool_source *source) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  const uint64_t id[2] = {id0, id1};
  if (source && (!source->alloc || !source->free)) {
    ta_set_error("torchalloc_pool_create: a pool source needs both alloc and free");
    return -1;
  }
  int count = h ? ta_heap_pool_create(h, id, source) : -1;
  if (count == -2)
    ta_set_error("pool (%llu, %llu) exists already on device %d: its allocator cannot be replaced",
                 (unsigned long long)id0, (unsigned long long)id1, device);
  else if (h && count < 0)
    ta_set_error("out of host memory while creating pool (%llu, %llu)", (unsigned long long)id0,
                 (unsigned long long)id1);
  return count < 0 ? -1 : count;
}

TORCHALLOC_API int torchalloc_pool_flags(int device, uint64_t id0, uint64_t id1, unsigned set, unsigned clear) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  const uint64_t id[2] = {id0, id1};
  unsigned known = TORCHALLOC_POOL_USE_ON_OOM | TORCHALLOC_POOL_NO_SPLIT;
  if ((set | clear) & ~known) {
    ta_set_error("torchalloc_pool_flags: unknown flags %#x", (set | clear) & ~known);
    return -1;
  }
  int flags = h ? ta_heap_pool_flags(h, id, set, clear) : -1;
  if (h && flags < 0)
    ta_set_error("no pool (%llu, %llu) on device %d", (unsigned long long)id0, (unsigned long long)id1, device);
  return flags;
}

TORCHALLOC_API int torchalloc_pool_release(int device, uint64_t id0, uint64_t id1) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  const uint64_t id[2] = {id0, id1};
  int count = h ? ta_heap_pool_release(h, id) : -1;
  if (h && count < 0)
    ta_set_error("no pool (%llu, %llu) in use on device %d", (unsigned long long)id0, (unsigned long long)id1, device);
  return count;
}

TORCHALLOC_API int torchalloc_pool_use_count(int device, uint64_t id0, uint64_t id1) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  const uint64_t id[2] = {id0, id1};
  return h ? ta_heap_pool_use_count(h, id) : -1;
}

TORCHALLOC_API void *torchalloc_pool_malloc(size_t size, int device, cudaStream_t stream, uint64_t id0,
                                           uint64_t id1) {
  if (size == 0) return NULL;
  ta_heap *h = ta_runtime_heap(device);
  if (!h) {
    if (ta_runtime_state() == TA_STATE_READY) ta_runtime_report_bad_device(device);
    return NULL;
  }
  if (size > TA_MAX_REQUEST) {
    ta_heap_report_bad_size(h, size); /* refused as torchalloc_malloc refuses it: counted and reported */
    return NULL;
  }
  const uint64_t id[2] = {id0, id1};
  void *p = ta_heap_pool_malloc(h, size, stream, id);
  if (!p) ta_runtime_after_oom(h);
  else ta_runtime_device_in_use(device);
  return p;
}

TORCHALLOC_API int64_t torchalloc_pool_live_blocks(int device, uint64_t id0, uint64_t id1, uint64_t *addrs,
                                                   size_t cap) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  const uint64_t id[2] = {id0, id1};
  if (!h || (!addrs && cap)) return -1;
  return ta_heap_pool_live(h, id, addrs, cap);
}

TORCHALLOC_API int64_t torchalloc_pool_empty(int device, uint64_t id0, uint64_t id1) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  const uint64_t id[2] = {id0, id1};
  return h ? ta_heap_pool_empty(h, id) : -1;
}

TORCHALLOC_API int torchalloc_pool_restore(int device, uint64_t id0, uint64_t id1,
                                           const torchalloc_block_info *live, size_t n, uint64_t *freed,
                                           size_t freed_cap, size_t *nfreed) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || (!live && n) || (!freed && freed_cap) || !nfreed) return -1;
  char err[256];
  const uint64_t id[2] = {id0, id1};
  if (ta_heap_pool_restore(h, id, live, n, freed, freed_cap, nfreed, err, sizeof err)) {
    ta_set_error("%s", err);
    return -1;
  }
  return 0;
}

TORCHALLOC_API int torchalloc_routing_begin(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_runtime_routing_begin(h);
  return 0;
}

TORCHALLOC_API int torchalloc_routing_end(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  return ta_runtime_routing_end(h);
}
