/* CUDA IPC for the CUDA backend (backend.h): device memory of this process
 * opened by another, as torch.multiprocessing sends CUDA tensors.
 *
 * Two kinds of memory travel, as in PyTorch's allocator:
 *   - an ordinary allocation (cudaMalloc) as cudaIpcGetMemHandle's 64
 *     bytes, opened with cudaIpcOpenMemHandle;
 *   - mapped memory (expandable segments) as its physical handles, each
 *     exported once to a POSIX file descriptor that stays open in this
 *     process while the handle lives. The receiver copies the descriptor
 *     out of the sender with pidfd_getfd (Linux 5.6; it needs the right to
 *     ptrace the sender: the same user, and a Yama ptrace_scope that allows
 *     it) and imports it with cuMemImportFromShareableHandle.
 * Why descriptors are closed only when their handle is given back: the
 * receiver copies the descriptor at some later moment, which the sender
 * never learns; PyTorch keeps them for the handle's life too. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "device/backend_cuda_model.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

void ta_cuda_forget_exported(cuda_backend *c, uint64_t handle) {
  if (atomic_load_explicit(&c->nexported, memory_order_acquire) == 0) return; /* nothing was ever shared */
  pthread_mutex_lock(&c->exported_lock);
  size_t n = atomic_load_explicit(&c->nexported, memory_order_relaxed);
  for (size_t i = 0; i < n; i++) {
    if (c->exported[i].handle != handle) continue;
    close(c->exported[i].fd);
    c->exported[i] = c->exported[n - 1];
    atomic_store_explicit(&c->nexported, n - 1, memory_order_release);
    break;
  }
  pthread_mutex_unlock(&c->exported_lock);
}

void ta_cuda_ipc_destroy(cuda_backend *c) {
  size_t n = atomic_load(&c->nexported);
  for (size_t i = 0; i < n; i++) close(c->exported[i].fd);
  free(c->exported);
  c->exported = NULL;
  atomic_store(&c->nexported, 0);
  pthread_mutex_destroy(&c->exported_lock);
}

int ta_cuda_ipc_export(ta_backend *b, int device, uint64_t handle, int *fd, char *why, size_t whylen) {
  cuda_backend *c = (cuda_backend *)b;
  if (!c->vmm.ExportToShareableHandle || c->exportable[device] <= 0) {
    snprintf(why, whylen, "device %d's mapped memory cannot be exported to a file descriptor (the driver or device "
             "lacks CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR): run with expandable:off to share it", device);
    return TA_EDEVICE;
  }
  int rc = TA_OK;
  pthread_mutex_lock(&c->exported_lock);
  size_t n = atomic_load_explicit(&c->nexported, memory_order_relaxed);
  for (size_t i = 0; i < n; i++) {
    if (c->exported[i].handle == handle) {
      *fd = c->exported[i].fd;
      goto done;
    }
  }
  if (ta_grow(&c->exported, &c->cap_exported, n + 1, 64)) {
    snprintf(why, whylen, "out of host memory");
    rc = TA_EDEVICE;
    goto done;
  }
  int out = -1;
  CUresult e = c->vmm.ExportToShareableHandle(&out, (CUmemGenericAllocationHandle)handle,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (e != 0) {
    snprintf(why, whylen, "cuMemExportToShareableHandle on device %d failed: CUDA driver error %d", device, e);
    rc = TA_EDEVICE;
    goto done;
  }
  c->exported[n] = (exported_fd){handle, out};
  atomic_store_explicit(&c->nexported, n + 1, memory_order_release);
  *fd = out;
done:
  pthread_mutex_unlock(&c->exported_lock);
  return rc;
}

int ta_cuda_ipc_import(ta_backend *b, int device, int pid, const int *fds, size_t n, size_t handle, uint64_t *handles,
                       char *why, size_t whylen) {
  cuda_backend *c = (cuda_backend *)b;
  (void)handle; /* an imported handle's size is its exporter's: the caller maps it by the size it was told */
  if (!c->vmm.ImportFromShareableHandle) {
    snprintf(why, whylen, "this CUDA driver has no cuMemImportFromShareableHandle");
    return TA_EDEVICE;
  }
  long pidfd = syscall(SYS_pidfd_open, (pid_t)pid, 0);
  if (pidfd < 0) {
    snprintf(why, whylen, "pidfd_open of the sending process %d failed: %s%s", pid, strerror(errno),
             errno == ENOSYS ? " (Linux 5.6 or later is needed; or send from a process with expandable:off)" : "");
    return TA_EDEVICE;
  }
  device_guard g = guard_enter(c, device);
  size_t got = 0;
  int rc = TA_OK;
  for (; got < n; got++) {
    long mine = syscall(SYS_pidfd_getfd, (int)pidfd, fds[got], 0);
    if (mine < 0) {
      snprintf(why, whylen, "pidfd_getfd of descriptor %d of process %d failed: %s%s", fds[got], pid, strerror(errno),
               errno == EPERM ? " (it needs the right to ptrace the sender: the same user, and "
                                "/proc/sys/kernel/yama/ptrace_scope 0 when the sender is not an ancestor)"
                              : "");
      rc = TA_EDEVICE;
      break;
    }
    CUmemGenericAllocationHandle h = 0;
    CUresult e = c->vmm.ImportFromShareableHandle(&h, (void *)(uintptr_t)mine, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close((int)mine); /* the handle holds the memory now */
    if (e != 0) {
      snprintf(why, whylen, "cuMemImportFromShareableHandle on device %d failed: CUDA driver error %d", device, e);
      rc = TA_EDEVICE;
      break;
    }
    handles[got] = (uint64_t)h;
  }
  if (rc != TA_OK)
    for (size_t i = 0; i < got; i++) c->vmm.Release((CUmemGenericAllocationHandle)handles[i]);
  guard_exit(c, g, device);
  close((int)pidfd);
  return rc;
}

int ta_cuda_ipc_base_handle(ta_backend *b, int device, uintptr_t base, unsigned char out[TA_IPC_BASE_HANDLE_BYTES],
                            char *why, size_t whylen) {
  cuda_backend *c = (cuda_backend *)b;
  if (!c->fn.IpcGetMemHandle) {
    snprintf(why, whylen, "this cudart has no cudaIpcGetMemHandle");
    return TA_EDEVICE;
  }
  cudaIpcMemHandle_t h;
  device_guard g = guard_enter(c, device);
  cudaError_t e = c->fn.IpcGetMemHandle(&h, (void *)base);
  guard_exit(c, g, device);
  if (e != CUDA_SUCCESS) {
    c->fn.GetLastError();
    snprintf(why, whylen, "cudaIpcGetMemHandle on device %d failed: %s", device, c->fn.GetErrorString(e));
    return TA_EDEVICE;
  }
  memcpy(out, h.reserved, TA_IPC_BASE_HANDLE_BYTES);
  return TA_OK;
}

int ta_cuda_ipc_open_base(ta_backend *b, int device, const unsigned char handle[TA_IPC_BASE_HANDLE_BYTES],
                          uintptr_t *out, char *why, size_t whylen) {
  cuda_backend *c = (cuda_backend *)b;
  if (!c->fn.IpcOpenMemHandle || !c->fn.IpcCloseMemHandle) {
    snprintf(why, whylen, "this cudart has no cudaIpcOpenMemHandle");
    return TA_EDEVICE;
  }
  cudaIpcMemHandle_t h;
  memcpy(h.reserved, handle, TA_IPC_BASE_HANDLE_BYTES);
  void *p = NULL;
  device_guard g = guard_enter(c, device);
  cudaError_t e = c->fn.IpcOpenMemHandle(&p, h, CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  guard_exit(c, g, device);
  if (e != CUDA_SUCCESS) {
    c->fn.GetLastError();
    snprintf(why, whylen, "cudaIpcOpenMemHandle on device %d failed: %s", device, c->fn.GetErrorString(e));
    return TA_EDEVICE;
  }
  *out = (uintptr_t)p;
  return TA_OK;
}

void ta_cuda_ipc_close_base(ta_backend *b, int device, uintptr_t addr) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  cudaError_t e = c->fn.IpcCloseMemHandle((void *)addr);
  guard_exit(c, g, device);
  if (e != CUDA_SUCCESS) {
    c->fn.GetLastError();
    fprintf(stderr, "torchalloc: cudaIpcCloseMemHandle(%p) on device %d failed: %s\n", (void *)addr, device,
            c->fn.GetErrorString(e));
  }
}
