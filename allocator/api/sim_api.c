/* Public functions of the simulated device (torchalloc_sim.h): its capture
 * model, the lag model, its physical memory and its peer access. */
#include "base/errors.h"
#include "runtime/runtime.h"
#include "torchalloc_sim.h"

TORCHALLOC_API int torchalloc_sim_capture(int device, cudaStream_t stream, int capturing) {
  if (!ta_runtime_ready()) return -1;
  ta_heap *h = device >= 0 && device < ta_runtime_device_count() ? ta_runtime_heap(device) : NULL;
  int rc;
  if (h) {
    ta_lock_acquire(&h->lock); /* the capture's topology is read under it (heap_streams.c) */
    rc = ta_backend_sim_capture(ta_runtime_backend(), device, stream, capturing);
    ta_lock_release(&h->lock);
  } else {
    rc = ta_backend_sim_capture(ta_runtime_backend(), device, stream, capturing);
  }
  if (rc) {
    ta_set_error("torchalloc_sim_capture: needs backend:sim, a device in range, and a capture to end");
    return -1;
  }
  return 0;
}

TORCHALLOC_API int torchalloc_sim_stream_wait(int device, cudaStream_t waiter, cudaStream_t waited) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_stream_wait(ta_runtime_backend(), device, waiter, waited);
  ta_lock_release(&h->lock);
  if (rc) ta_set_error("torchalloc_sim_stream_wait: needs backend:sim");
  return rc;
}

TORCHALLOC_API int64_t torchalloc_sim_capture_violations(int device, char *buf, size_t len) {
  return ta_runtime_ready() ? ta_backend_sim_violations(ta_runtime_backend(), device, buf, len) : -1;
}

/* The sim's state is the heap's (its lock guards every backend call). */
TORCHALLOC_API int torchalloc_sim_use(int device, cudaStream_t stream, const void *ptr, size_t size) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_use(ta_runtime_backend(), device, stream, (uintptr_t)ptr, size);
  ta_lock_release(&h->lock);
  return rc;
}

TORCHALLOC_API int torchalloc_sim_advance(int device, uint64_t ticks) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_advance(ta_runtime_backend(), device, ticks);
  ta_lock_release(&h->lock);
  return rc;
}

TORCHALLOC_API int torchalloc_sim_physical(int device, const void *ptr, uint64_t *phys) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || !phys) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_physical(ta_runtime_backend(), device, (uintptr_t)ptr, phys);
  ta_lock_release(&h->lock);
  return rc;
}

TORCHALLOC_API void torchalloc_sim_on_copy(torchalloc_sim_copy_fn fn) { ta_backend_sim_on_copy(fn); }

TORCHALLOC_API int torchalloc_segment_mode(int device, int *configured) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  if (configured) *configured = h->conf->expandable;
  return h->seg.granule ? h->conf->expandable : 0; /* both fixed when the heap was made */
}

TORCHALLOC_API int torchalloc_sim_peer_use(int device, int peer, const void *ptr, size_t size) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_lock_acquire(&h->lock); /* the device's mappings change under its heap's lock */
  int rc = ta_backend_sim_peer_use(ta_runtime_backend(), device, peer, (uintptr_t)ptr, size);
  ta_lock_release(&h->lock);
  return rc;
}
