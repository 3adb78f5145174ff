/* The CUDA backend: cudart, loaded at run time.
 *
 * Why dlopen instead of linking: inside PyTorch we want the very cudart that
 * torch already loaded (RTLD_NOLOAD finds it by soname), and without a GPU
 * the library must still load so the sim backend, tests and replay run on
 * any machine. Only the handful of functions below are used. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend_cuda_model.h"

static int cuda_device_count(ta_backend *b) { return ((cuda_backend *)b)->devices; }

/* A cudaMalloc while some stream captures a CUDA graph is illegal in the
 * default (global) capture mode and invalidates the capture; in relaxed mode
 * it is fine, and the graph just uses the memory (PyTorch's allocator does
 * the same, cudaMallocMaybeCapturing). The mode is per thread and cheap to
 * swap, so it is swapped for every device allocation. */
static int cuda_alloc(ta_backend *b, int device, size_t size, uintptr_t *out) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  void *p = NULL;
  int mode = CUDA_CAPTURE_MODE_RELAXED;
  int swapped = c->fn.ThreadExchangeStreamCaptureMode && c->fn.ThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  cudaError_t e = c->fn.Malloc(&p, size);
  if (swapped) c->fn.ThreadExchangeStreamCaptureMode(&mode); /* back to the caller's mode */
  if (e != CUDA_SUCCESS) c->fn.GetLastError(); /* clear it: torch's next check must not see our OOM */
  guard_exit(c, g, device);
  if (e != CUDA_SUCCESS) return TA_ENOMEM;
  *out = (uintptr_t)p;
  return TA_OK;
}

static void cuda_free(ta_backend *b, int device, uintptr_t addr, size_t size) {
  (void)size;
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  cudaError_t e = c->fn.Free((void *)addr);
  if (e != CUDA_SUCCESS) {
    fprintf(stderr, "torchalloc: cudaFree(%p) on device %d failed: %s\n", (void *)addr, device,
            c->fn.GetErrorString(e));
    c->fn.GetLastError();
  }
  guard_exit(c, g, device);
}

static int cuda_mem_info(ta_backend *b, int device, size_t *free_bytes, size_t *total_bytes) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  cudaError_t e = c->fn.MemGetInfo(free_bytes, total_bytes);
  guard_exit(c, g, device);
  return e == CUDA_SUCCESS ? TA_OK : TA_EDEVICE;
}

static void cuda_synchronize(ta_backend *b, int device) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  c->fn.DeviceSynchronize();
  guard_exit(c, g, device);
}

static void *cuda_event_record(ta_backend *b, int device, cudaStream_t stream) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  cudaEvent_t ev = NULL;
  if (c->fn.EventCreateWithFlags(&ev, CUDA_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
      c->fn.EventRecord(ev, stream) != CUDA_SUCCESS) {
    c->fn.EventDestroy(ev);
    ev = NULL;
  }
  guard_exit(c, g, device);
  return ev; /* NULL: treat as complete after a synchronize, see heap.c */
}

static int cuda_event_done(ta_backend *b, int device, void *event) {
  (void)device;
  cuda_backend *c = (cuda_backend *)b;
  cudaError_t e = c->fn.EventQuery((cudaEvent_t)event);
  if (e == CUDA_ERROR_NOT_READY) {
    c->fn.GetLastError();
    return 0;
  }
  return 1;
}

static void cuda_event_release(ta_backend *b, int device, void *event) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  c->fn.EventDestroy((cudaEvent_t)event);
  guard_exit(c, g, device);
}

static int cuda_stream_capturing(ta_backend *b, int device, cudaStream_t stream) {
  (void)device;
  cuda_backend *c = (cuda_backend *)b;
  int status = 0; /* cudaStreamCaptureStatusNone */
  if (!c->fn.StreamIsCapturing || c->fn.StreamIsCapturing(stream, &status) != CUDA_SUCCESS) {
    if (c->fn.StreamIsCapturing) c->fn.GetLastError();
    return 0;
  }
  return status != 0; /* active, or invalidated: either way a capture */
}

/* The capture's topology for graph_capture_record_stream_reuse
 * (heap_streams.c). Both calls only read the capture: legal while it runs. */
static const cugraph_fns *graph_fns(cuda_backend *c) {
  return c->graph.StreamGetCaptureInfo && c->graph.GraphNodeGetDependencies ? &c->graph : NULL;
}

_Static_assert(sizeof(void *) == sizeof(uint64_t), "graph nodes travel as 64-bit numbers");

static int cuda_capture_frontier(ta_backend *b, int device, cudaStream_t stream, uint64_t *nodes, size_t cap,
                                 size_t *n) {
  (void)device;
  const cugraph_fns *g = graph_fns((cuda_backend *)b);
  int status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE; 1 active, 2 invalidated */
  void *const *deps = NULL;
  size_t count = 0;
  if (!g || g->StreamGetCaptureInfo(stream, &status, NULL, NULL, &deps, &count) != CUDA_SUCCESS || status == 2)
    return -1;
  if (status == 0) return 0;
  for (size_t i = 0; i < count && i < cap; i++) nodes[i] = (uint64_t)(uintptr_t)deps[i];
  *n = count;
  return 1;
}

static int cuda_node_dependencies(ta_backend *b, int device, uint64_t node, uint64_t *deps, size_t cap,
                                  size_t *n) {
  (void)device;
  const cugraph_fns *g = graph_fns((cuda_backend *)b);
  size_t count = 0;
  if (!g || g->GraphNodeGetDependencies((void *)(uintptr_t)node, NULL, &count) != CUDA_SUCCESS) return -1;
  if (count && count <= cap && g->GraphNodeGetDependencies((void *)(uintptr_t)node, (void **)deps, &count))
    return -1;
  *n = count;
  return 0;
}

/* ------------------------------------------------------------------------
 * Virtual memory (expandable segments)
 * ---------------------------------------------------------------------- */

static void *driver_entry(cuda_backend *c, const char *symbol) {
  void *fn = NULL;
  int status = 0;
  if (c->fn.GetDriverEntryPointByVersion) {
    if (c->fn.GetDriverEntryPointByVersion(symbol, &fn, 12000, 0, &status) == CUDA_SUCCESS && fn) return fn;
    c->fn.GetLastError();
  }
  if (c->fn.GetDriverEntryPoint) {
    if (c->fn.GetDriverEntryPoint(symbol, &fn, 0, &status) == CUDA_SUCCESS && fn) return fn;
    c->fn.GetLastError();
  }
  return NULL;
}

static void load_vmm(cuda_backend *c) {
  void **slots[] = {(void **)&c->vmm.AddressReserve, (void **)&c->vmm.AddressFree, (void **)&c->vmm.Create,
                    (void **)&c->vmm.Release,        (void **)&c->vmm.Map,         (void **)&c->vmm.Unmap,
                    (void **)&c->vmm.SetAccess,      (void **)&c->vmm.GetAllocationGranularity};
  static const char *const names[] = {"cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate",
                                      "cuMemRelease",        "cuMemMap",         "cuMemUnmap",
                                      "cuMemSetAccess",      "cuMemGetAllocationGranularity"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if ((*slots[i] = driver_entry(c, names[i])) == NULL) return;
  c->vmm_loaded = 1;
  /* Optional: without them mapped memory is not shared with other processes (backend_cuda_ipc.c). */
  *(void **)&c->vmm.ExportToShareableHandle = driver_entry(c, "cuMemExportToShareableHandle");
  *(void **)&c->vmm.ImportFromShareableHandle = driver_entry(c, "cuMemImportFromShareableHandle");
  *(void **)&c->vmm.DeviceGetAttribute = driver_entry(c, "cuDeviceGetAttribute");
  *(void **)&c->vmm.MemcpyDtoD = driver_entry(c, "cuMemcpyDtoD");
}

/* Asked once per device (under that device's heap lock). */
static size_t cuda_granularity(ta_backend *b, int device) {
  cuda_backend *c = (cuda_backend *)b;
  if (!c->vmm_loaded || device < 0 || device >= VMM_MAX_DEVICES) return 0;
  if (c->granule[device] == 0) {
    CUmemAllocationProp prop = device_prop(device);
    size_t g = 0;
    /* The property names the device, so no device is made current: making
     * one current starts its context (CUDA 12+), and a torchrun rank that
     * sees every GPU of the node would hold a context on each. Only a
     * driver that wants a context for the query gets the device's. */
    if (c->vmm.GetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != 0 || g == 0) {
      device_guard guard = guard_enter(c, device);
      if (c->vmm.GetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != 0 || g == 0) g = SIZE_MAX;
      guard_exit(c, guard, device);
    }
    c->granule[device] = g == SIZE_MAX ? SIZE_MAX : ta_align_up(VMM_GRANULE_MIN, g);
  }
  return c->granule[device] == SIZE_MAX ? 0 : c->granule[device];
}

static int cuda_reserve(ta_backend *b, int device, size_t size, uintptr_t *out) {
  cuda_backend *c = (cuda_backend *)b;
  CUdeviceptr p = 0;
  device_guard g = guard_enter(c, device);
  CUresult e = c->vmm.AddressReserve(&p, size, c->granule[device], 0, 0);
  guard_exit(c, g, device);
  if (e != 0) return TA_ENOMEM;
  *out = (uintptr_t)p;
  return TA_OK;
}

static void cuda_unreserve(ta_backend *b, int device, uintptr_t addr, size_t size) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  CUresult e = c->vmm.AddressFree((CUdeviceptr)addr, size);
  guard_exit(c, g, device);
  if (e != 0) fprintf(stderr, "torchalloc: cuMemAddressFree(%p) on device %d failed: error %d\n", (void *)addr, device, e);
}

static CUresult release_handle(cuda_backend *c, uint64_t handle) {
  ta_cuda_forget_exported(c, handle);
  return c->vmm.Release((CUmemGenericAllocationHandle)handle);
}

/* Unmap `n` handles of `handle` bytes mapped one after the other from
 * `addr`. One cuMemUnmap over the whole range costs the same as one a
 * handle (bench/vmm_costs.c), and a failure here names the handle. */
static void unmap_handles(cuda_backend *c, uintptr_t addr, size_t n, size_t handle, const uint64_t *handles,
                          int release) {
  for (size_t i = 0; i < n; i++) {
    CUresult e = c->vmm.Unmap((CUdeviceptr)(addr + i * handle), handle);
    CUresult r = release ? release_handle(c, handles[i]) : 0;
    if (e != 0 || r != 0)
      fprintf(stderr, "torchalloc: unmapping %p failed: cuMemUnmap error %d, cuMemRelease error %d\n",
              (void *)(addr + i * handle), e, r);
  }
}

/* Read and write access to [addr, addr + size) for `device` (when `self`)
 * and every device of `peers`: one call for the run and all of them (its
 * cost follows the number of mappings it covers and of devices named;
 * bench/vmm_costs.c --peers). */
static CUresult set_access(cuda_backend *c, int device, int self, uintptr_t addr, size_t size, uint64_t peers) {
  CUmemAccessDesc access[VMM_MAX_DEVICES];
  size_t n = 0;
  for (int d = 0; d < VMM_MAX_DEVICES && d < c->devices; d++)
    if ((d == device && self) || (d != device && (peers >> d & 1)))
      access[n++] = (CUmemAccessDesc){.location = device_prop(d).location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  return n ? c->vmm.SetAccess((CUdeviceptr)addr, size, access, n) : 0;
}

/* The properties of new physical memory on `device`: exportable to a file
 * descriptor (CUDA IPC, as PyTorch's expandable segments ask) where the
 * device says it can be; asked once. */
static CUmemAllocationProp create_prop(cuda_backend *c, int device) {
  CUmemAllocationProp prop = device_prop(device);
  if (c->exportable[device] == 0) {
    int yes = 0;
    c->exportable[device] = c->vmm.ExportToShareableHandle && c->vmm.DeviceGetAttribute &&
                                    c->vmm.DeviceGetAttribute(&yes, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                                              device) == 0 && yes
                                ? 1
                                : -1;
  }
  if (c->exportable[device] > 0) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

static CUresult create_handle(cuda_backend *c, int device, size_t size, CUmemGenericAllocationHandle *h) {
  CUmemAllocationProp prop = create_prop(c, device);
  CUresult e = c->vmm.Create(h, size, &prop, 0);
  if (e != 0 && e != CUDA_ERROR_OUT_OF_MEMORY && prop.requestedHandleTypes) {
    c->exportable[device] = -1; /* the driver refuses exportable memory here: make it plain from now on */
    prop.requestedHandleTypes = 0;
    e = c->vmm.Create(h, size, &prop, 0);
  }
  return e;
}

/* One physical allocation per handle-sized piece (PyTorch's expandable
 * segments make 2 MiB or 20 MiB ones): cuMemUnmap must unmap whole
 * mappings, so the piece is the unit memory can be given back or moved in.
 * Made in relaxed capture mode, as cudaMalloc is above. */
static int cuda_map(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle, uint64_t *handles,
                    uint64_t peers) {
  cuda_backend *c = (cuda_backend *)b;
  size_t n = size / handle, mapped = 0;
  device_guard g = guard_enter(c, device);
  int mode = CUDA_CAPTURE_MODE_RELAXED;
  int swapped = c->fn.ThreadExchangeStreamCaptureMode && c->fn.ThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  CUresult e = 0;
  for (; mapped < n; mapped++) {
    CUmemGenericAllocationHandle h = 0;
    if ((e = create_handle(c, device, handle, &h)) != 0) break;
    if ((e = c->vmm.Map((CUdeviceptr)(addr + mapped * handle), handle, 0, h, 0)) != 0) {
      c->vmm.Release(h);
      break;
    }
    handles[mapped] = (uint64_t)h;
  }
  if (e == 0) e = set_access(c, device, 1, addr, size, peers);
  if (e != 0) unmap_handles(c, addr, mapped, handle, handles, 1); /* all or nothing */
  if (swapped) c->fn.ThreadExchangeStreamCaptureMode(&mode);
  guard_exit(c, g, device);
  if (e != 0 && e != CUDA_ERROR_OUT_OF_MEMORY) /* out of memory: the expected failure */
    fprintf(stderr, "torchalloc: mapping %zu bytes at %p on device %d failed: CUDA driver error %d\n", size,
            (void *)addr, device, e);
  return e == 0 ? TA_OK : TA_ENOMEM;
}

/* The same physical handles at a second address (or a new one, after the
 * first was unmapped without release; or handles imported from another
 * process): cuMemMap keeps a reference to each, so the memory lives while
 * any mapping does. */
static int cuda_remap(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle,
                      const uint64_t *handles, uint64_t peers) {
  cuda_backend *c = (cuda_backend *)b;
  size_t n = size / handle, mapped = 0;
  device_guard g = guard_enter(c, device);
  CUresult e = 0;
  for (; mapped < n; mapped++)
    if ((e = c->vmm.Map((CUdeviceptr)(addr + mapped * handle), handle, 0,
                        (CUmemGenericAllocationHandle)handles[mapped], 0)) != 0)
      break;
  if (e == 0) e = set_access(c, device, 1, addr, size, peers);
  if (e != 0) unmap_handles(c, addr, mapped, handle, handles, 0); /* all or nothing; the handles stay */
  guard_exit(c, g, device);
  if (e != 0)
    fprintf(stderr, "torchalloc: remapping %zu bytes at %p on device %d failed: CUDA driver error %d\n", size,
            (void *)addr, device, e);
  return e == 0 ? TA_OK : TA_ENOMEM;
}

static void cuda_unmap(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle,
                       const uint64_t *handles, int release) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  unmap_handles(c, addr, size / handle, handle, handles, release);
  guard_exit(c, g, device);
}

static void cuda_release(ta_backend *b, int device, const uint64_t *handles, size_t n) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  for (size_t i = 0; i < n; i++) {
    CUresult e = release_handle(c, handles[i]);
    if (e != 0) fprintf(stderr, "torchalloc: cuMemRelease on device %d failed: error %d\n", device, e);
  }
  guard_exit(c, g, device);
}

/* ------------------------------------------------------------------------
 * Peer access
 * ---------------------------------------------------------------------- */

static int cuda_peer_capable(ta_backend *b, int device, int peer) {
  cuda_backend *c = (cuda_backend *)b;
  int can = 0;
  if (device == peer || !c->fn.DeviceCanAccessPeer || device < 0 || peer < 0 || device >= c->devices ||
      peer >= c->devices || peer >= VMM_MAX_DEVICES)
    return 0;
  if (c->fn.DeviceCanAccessPeer(&can, peer, device) != CUDA_SUCCESS) { /* can `peer` reach `device`'s memory */
    c->fn.GetLastError();
    return 0;
  }
  return can != 0;
}

static int cuda_grant(ta_backend *b, int device, uintptr_t addr, size_t size, uint64_t peers) {
  cuda_backend *c = (cuda_backend *)b;
  device_guard g = guard_enter(c, device);
  CUresult e = set_access(c, device, 0, addr, size, peers);
  guard_exit(c, g, device);
  if (e != 0)
    fprintf(stderr, "torchalloc: granting peers %#llx access to %zu bytes at %p of device %d failed: CUDA driver "
            "error %d\n", (unsigned long long)peers, size, (void *)addr, device, e);
  return e == 0 ? TA_OK : TA_EDEVICE;
}

/* A device-to-device copy makes no host-side synchronization of its own:
 * the device is synchronized after it, so the source may be unmapped. */
static int cuda_copy(ta_backend *b, int device, uintptr_t dst, uintptr_t src, size_t size) {
  cuda_backend *c = (cuda_backend *)b;
  if (!c->vmm.MemcpyDtoD) return TA_EDEVICE;
  device_guard g = guard_enter(c, device);
  CUresult e = c->vmm.MemcpyDtoD((CUdeviceptr)dst, (CUdeviceptr)src, size);
  cudaError_t s = c->fn.DeviceSynchronize();
  guard_exit(c, g, device);
  if (e != 0 || s != CUDA_SUCCESS) {
    fprintf(stderr, "torchalloc: copying %zu bytes from %p to %p on device %d failed: cuMemcpyDtoD error %d, "
            "synchronize error %d\n", size, (void *)src, (void *)dst, device, e, (int)s);
    return TA_EDEVICE;
  }
  return TA_OK;
}

static void cuda_destroy(ta_backend *b) {
  /* cudart stays loaded: torch may share it, and unloading cudart is unsafe. */
  ta_cuda_ipc_destroy((cuda_backend *)b);
  free(b);
}

static const ta_backend_ops cuda_ops = {
    .name = "cuda",
    .device_count = cuda_device_count,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .mem_info = cuda_mem_info,
    .synchronize = cuda_synchronize,
    .event_record = cuda_event_record,
    .event_done = cuda_event_done,
    .event_release = cuda_event_release,
    .stream_capturing = cuda_stream_capturing,
    .destroy = cuda_destroy,
    .granularity = cuda_granularity,
    .reserve = cuda_reserve,
    .unreserve = cuda_unreserve,
    .map = cuda_map,
    .remap = cuda_remap,
    .unmap = cuda_unmap,
    .release = cuda_release,
    .copy = cuda_copy,
    .peer_capable = cuda_peer_capable,
    .grant = cuda_grant,
    .ipc_export = ta_cuda_ipc_export,
    .ipc_import = ta_cuda_ipc_import,
    .ipc_base_handle = ta_cuda_ipc_base_handle,
    .ipc_open_base = ta_cuda_ipc_open_base,
    .ipc_close_base = ta_cuda_ipc_close_base,
    .capture_frontier = cuda_capture_frontier,
    .node_dependencies = cuda_node_dependencies,
};

static void *open_cudart(void) {
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
    if (h) return h; /* the copy torch already loaded */
  }
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (h) return h;
  }
  return dlopen("/usr/local/cuda/lib64/libcudart.so", RTLD_NOW | RTLD_GLOBAL);
}

#define LOAD(field, symbol)                                                                  \
  do {                                                                                       \
    *(void **)(&c->fn.field) = dlsym(c->lib, symbol);                                        \
    if (!c->fn.field) {                                                                      \
      snprintf(err, errlen, "cudart has no %s", symbol);                                     \
      free(c);                                                                               \
      return NULL;                                                                           \
    }                                                                                        \
  } while (0)

ta_backend *ta_backend_cuda_create(char *err, size_t errlen) {
  cuda_backend *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  c->base.ops = &cuda_ops;
  pthread_mutex_init(&c->exported_lock, NULL);
  c->lib = open_cudart();
  if (!c->lib) {
    snprintf(err, errlen, "cannot load libcudart (backend:cuda); use backend:sim where there is no GPU");
    free(c);
    return NULL;
  }
  LOAD(Malloc, "cudaMalloc");
  LOAD(Free, "cudaFree");
  LOAD(MemGetInfo, "cudaMemGetInfo");
  LOAD(GetDeviceCount, "cudaGetDeviceCount");
  LOAD(GetDevice, "cudaGetDevice");
  LOAD(SetDevice, "cudaSetDevice");
  LOAD(DeviceSynchronize, "cudaDeviceSynchronize");
  LOAD(GetLastError, "cudaGetLastError");
  LOAD(GetErrorString, "cudaGetErrorString");
  LOAD(EventCreateWithFlags, "cudaEventCreateWithFlags");
  LOAD(EventRecord, "cudaEventRecord");
  LOAD(EventQuery, "cudaEventQuery");
  LOAD(EventDestroy, "cudaEventDestroy");
  *(void **)(&c->fn.ThreadExchangeStreamCaptureMode) = dlsym(c->lib, "cudaThreadExchangeStreamCaptureMode");
  *(void **)(&c->fn.StreamIsCapturing) = dlsym(c->lib, "cudaStreamIsCapturing");
  *(void **)(&c->fn.DeviceCanAccessPeer) = dlsym(c->lib, "cudaDeviceCanAccessPeer");
  *(void **)(&c->fn.IpcGetMemHandle) = dlsym(c->lib, "cudaIpcGetMemHandle");
  *(void **)(&c->fn.IpcOpenMemHandle) = dlsym(c->lib, "cudaIpcOpenMemHandle");
  *(void **)(&c->fn.IpcCloseMemHandle) = dlsym(c->lib, "cudaIpcCloseMemHandle");
  *(void **)(&c->fn.GetDriverEntryPointByVersion) = dlsym(c->lib, "cudaGetDriverEntryPointByVersion");
  *(void **)(&c->fn.GetDriverEntryPoint) = dlsym(c->lib, "cudaGetDriverEntryPoint");
  *(void **)&c->graph.StreamGetCaptureInfo = driver_entry(c, "cuStreamGetCaptureInfo");
  *(void **)&c->graph.GraphNodeGetDependencies = driver_entry(c, "cuGraphNodeGetDependencies");
  cudaError_t e = c->fn.GetDeviceCount(&c->devices);
  if (e != CUDA_SUCCESS || c->devices < 1) {
    /* On a machine without an NVIDIA driver (no GPU) cudart says "CUDA driver version is insufficient for CUDA
     * runtime version", which reads as an old driver: say that there is none. */
    const char *why = e != CUDA_SUCCESS ? c->fn.GetErrorString(e) : "0 devices";
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver) {
      dlclose(driver);
      snprintf(err, errlen, "no CUDA device (cudaGetDeviceCount: %s); use backend:sim where there is no GPU", why);
    } else {
      snprintf(err, errlen,
               "no GPU here: no NVIDIA driver is installed (libcuda.so.1 not found; cudaGetDeviceCount: %s); "
               "use backend:sim where there is no GPU",
               why);
    }
    c->fn.GetLastError();
    free(c);
    return NULL;
  }
  load_vmm(c); /* without it, expandable:1 falls back to ordinary segments */
  return &c->base;
}
