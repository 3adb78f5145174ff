/* Public functions for memory shared beyond one device's heap
 * (torchalloc.h): peer access between the GPUs of the process, and CUDA
 * IPC between processes. Each finds its heap through the runtime and asks
 * the heap (heap_share.c). */
#include <stdio.h>

#include "base/errors.h"
#include "runtime/runtime.h"

TORCHALLOC_API int torchalloc_enable_peer_access(int device, int peer) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  char why[256];
  if (ta_heap_grant_peer(h, peer, why, sizeof why)) {
    ta_set_error("%s", why);
    return -1;
  }
  return 0;
}

TORCHALLOC_API int torchalloc_peer_access(int device, int peer) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  return h ? ta_heap_peer_granted(h, peer) : -1;
}

TORCHALLOC_API int torchalloc_ipc_share(const void *ptr, void *buf, size_t cap, size_t *len, size_t *offset) {
  if (!ptr || !len || !offset || (!buf && cap) || !ta_runtime_ready()) {
    if (ta_runtime_ready()) ta_set_error("torchalloc_ipc_share: a NULL argument");
    return -1;
  }
  char why[512] = "";
  for (int d = 0; d < ta_runtime_device_count(); d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    int rc = 0;
    if (h && ta_heap_ipc_share(h, (uintptr_t)ptr, buf, cap, len, offset, &rc, why, sizeof why)) {
      if (rc) ta_set_error("cannot share %p with another process: %s", ptr, why);
      return rc;
    }
  }
  ta_set_error("cannot share %p with another process: it is in no live torchalloc block", ptr);
  return -1;
}

TORCHALLOC_API int torchalloc_ipc_open(int device, const void *handle, size_t len, void **ptr) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  if (!handle || !ptr) {
    ta_set_error("torchalloc_ipc_open: a NULL argument");
    return -1;
  }
  char why[512] = "";
  uintptr_t addr = 0;
  if (ta_heap_ipc_open(h, handle, len, &addr, why, sizeof why)) {
    ta_set_error("cannot open CUDA memory another process shared, on device %d: %s", device, why);
    return -1;
  }
  *ptr = (void *)addr;
  return 0;
}

TORCHALLOC_API int torchalloc_ipc_close(void *ptr) {
  if (!ptr || !ta_runtime_ready()) return -1;
  for (int d = 0; d < ta_runtime_device_count(); d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h && ta_heap_ipc_close(h, (uintptr_t)ptr)) return 0;
  }
  ta_set_error("%p is no memory opened from another process", ptr);
  return -1;
}

TORCHALLOC_API int64_t torchalloc_ipc_open_count(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  return h ? (int64_t)ta_heap_ipc_open_count(h) : -1;
}
