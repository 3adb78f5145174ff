/* The CUDA backend: cudart, loaded at run time.
 *
 * Why dlopen instead of linking: inside PyTorch we want the very cudart that
 * torch already loaded (RTLD_NOLOAD finds it by soname), and without a GPU
 * the library must still load so the sim backend, tests and replay run on
 * any machine. Only the handful of functions below are used. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "device/backend.h"

typedef int cudaError_t; /* enum in CUDA; 0 = cudaSuccess, 2 = cudaErrorMemoryAllocation */
typedef struct CUevent_st *cudaEvent_t;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_READY = 600, CUDA_EVENT_DISABLE_TIMING = 2 };
enum { CUDA_CAPTURE_MODE_RELAXED = 2 }; /* cudaStreamCaptureModeRelaxed */

typedef struct cudart_fns {
  cudaError_t (*Malloc)(void **, size_t);
  cudaError_t (*Free)(void *);
  cudaError_t (*MemGetInfo)(size_t *, size_t *);
  cudaError_t (*GetDeviceCount)(int *);
  cudaError_t (*GetDevice)(int *);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*DeviceSynchronize)(void);
  cudaError_t (*GetLastError)(void);
  const char *(*GetErrorString)(cudaError_t);
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t *, unsigned);
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*EventQuery)(cudaEvent_t);
  cudaError_t (*EventDestroy)(cudaEvent_t);
  cudaError_t (*ThreadExchangeStreamCaptureMode)(int *); /* optional: NULL on a cudart without it */
  cudaError_t (*StreamIsCapturing)(cudaStream_t, int *);  /* optional likewise */
  /* The driver's entry points: cudart >= 12.5 has the ByVersion form, older
   * ones only the other (deprecated since). Either may be NULL. */
  cudaError_t (*GetDriverEntryPointByVersion)(const char *, void **, unsigned, unsigned long long, int *);
  cudaError_t (*GetDriverEntryPoint)(const char *, void **, unsigned long long, int *);
} cudart_fns;

/* The CUDA driver's virtual memory API (cuda.h), reached through cudart's
 * driver entry points, so the library still has no link-time dependency on
 * libcuda. The structs mirror cuda.h's layouts. */
typedef int CUresult; /* 0 = CUDA_SUCCESS, 2 = CUDA_ERROR_OUT_OF_MEMORY */
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { int type, id; } CUmemLocation; /* type 1: a device, id its ordinal */
typedef struct {
  int type;                  /* 1: CU_MEM_ALLOCATION_TYPE_PINNED */
  int requestedHandleTypes;  /* 0: none (not shared between processes) */
  CUmemLocation location;
  void *win32HandleMetaData;
  struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; /* 3: read and write */ } CUmemAccessDesc;
enum { CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_ALLOCATION_TYPE_PINNED = 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
       CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0 };

typedef struct cuvmm_fns {
  CUresult (*AddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*AddressFree)(CUdeviceptr, size_t);
  CUresult (*Create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*Release)(CUmemGenericAllocationHandle);
  CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*Unmap)(CUdeviceptr, size_t);
  CUresult (*SetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*GetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
} cuvmm_fns;

/* Expandable segments map in granules of at least 2 MiB: the driver's
 * minimum on current GPUs, and few enough mappings for an 80 GiB device. */
#define VMM_GRANULE_MIN ((size_t)2 << 20)
#define VMM_MAX_DEVICES 64

typedef struct cuda_backend {
  ta_backend base;
  void *lib;
  cudart_fns fn;
  int devices;
  int vmm_loaded; /* 1: vmm has every function */
  cuvmm_fns vmm;
  size_t granule[VMM_MAX_DEVICES]; /* 0: not asked yet; SIZE_MAX: the device cannot */
} cuda_backend;

/* Switch to `device` for the duration of one call; PyTorch may free a block
 * of device 1 while device 0 is current. */
typedef struct device_guard {
  int previous;
} device_guard;

static device_guard guard_enter(cuda_backend *c, int device) {
  device_guard g = {device};
  if (c->fn.GetDevice(&g.previous) != CUDA_SUCCESS) g.previous = device;
  if (g.previous != device) c->fn.SetDevice(device);
  return g;
}
static void guard_exit(cuda_backend *c, device_guard g, int device) {
  if (g.previous != device) c->fn.SetDevice(g.previous);
}

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
}

static CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

/* Asked once per device (under that device's heap lock). */
static size_t cuda_granularity(ta_backend *b, int device) {
  cuda_backend *c = (cuda_backend *)b;
  if (!c->vmm_loaded || device < 0 || device >= VMM_MAX_DEVICES) return 0;
  if (c->granule[device] == 0) {
    CUmemAllocationProp prop = device_prop(device);
    size_t g = 0;
    device_guard guard = guard_enter(c, device);
    if (c->vmm.GetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != 0 || g == 0) g = SIZE_MAX;
    guard_exit(c, guard, device);
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

/* Unmap `n` handles of `handle` bytes mapped one after the other from
 * `addr`. One cuMemUnmap over the whole range costs the same as one a
 * handle (bench/vmm_costs.c), and a failure here names the handle. */
static void unmap_handles(cuda_backend *c, uintptr_t addr, size_t n, size_t handle, const uint64_t *handles,
                          int release) {
  for (size_t i = 0; i < n; i++) {
    CUresult e = c->vmm.Unmap((CUdeviceptr)(addr + i * handle), handle);
    CUresult r = release ? c->vmm.Release((CUmemGenericAllocationHandle)handles[i]) : 0;
    if (e != 0 || r != 0)
      fprintf(stderr, "torchalloc: unmapping %p failed: cuMemUnmap error %d, cuMemRelease error %d\n",
              (void *)(addr + i * handle), e, r);
  }
}

/* Read and write access for `device` to [addr, addr + size): one call for
 * the run (its cost follows the number of mappings it covers). */
static CUresult set_access(cuda_backend *c, int device, uintptr_t addr, size_t size) {
  CUmemAccessDesc access = {.location = device_prop(device).location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  return c->vmm.SetAccess((CUdeviceptr)addr, size, &access, 1);
}

/* One physical allocation per handle-sized piece (PyTorch's expandable
 * segments make 2 MiB or 20 MiB ones): cuMemUnmap must unmap whole
 * mappings, so the piece is the unit memory can be given back or moved in.
 * Made in relaxed capture mode, as cudaMalloc is above. */
static int cuda_map(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle, uint64_t *handles) {
  cuda_backend *c = (cuda_backend *)b;
  size_t n = size / handle, mapped = 0;
  CUmemAllocationProp prop = device_prop(device);
  device_guard g = guard_enter(c, device);
  int mode = CUDA_CAPTURE_MODE_RELAXED;
  int swapped = c->fn.ThreadExchangeStreamCaptureMode && c->fn.ThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  CUresult e = 0;
  for (; mapped < n; mapped++) {
    CUmemGenericAllocationHandle h = 0;
    if ((e = c->vmm.Create(&h, handle, &prop, 0)) != 0) break;
    if ((e = c->vmm.Map((CUdeviceptr)(addr + mapped * handle), handle, 0, h, 0)) != 0) {
      c->vmm.Release(h);
      break;
    }
    handles[mapped] = (uint64_t)h;
  }
  if (e == 0) e = set_access(c, device, addr, size);
  if (e != 0) unmap_handles(c, addr, mapped, handle, handles, 1); /* all or nothing */
  if (swapped) c->fn.ThreadExchangeStreamCaptureMode(&mode);
  guard_exit(c, g, device);
  if (e != 0 && e != 2) /* 2: out of memory, the expected failure */
    fprintf(stderr, "torchalloc: mapping %zu bytes at %p on device %d failed: CUDA driver error %d\n", size,
            (void *)addr, device, e);
  return e == 0 ? TA_OK : TA_ENOMEM;
}

/* The same physical handles at a second address (or a new one, after the
 * first was unmapped without release): cuMemMap keeps a reference to each,
 * so the memory lives while any mapping does. */
static int cuda_remap(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle,
                      const uint64_t *handles) {
  cuda_backend *c = (cuda_backend *)b;
  size_t n = size / handle, mapped = 0;
  device_guard g = guard_enter(c, device);
  CUresult e = 0;
  for (; mapped < n; mapped++)
    if ((e = c->vmm.Map((CUdeviceptr)(addr + mapped * handle), handle, 0,
                        (CUmemGenericAllocationHandle)handles[mapped], 0)) != 0)
      break;
  if (e == 0) e = set_access(c, device, addr, size);
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
    CUresult e = c->vmm.Release((CUmemGenericAllocationHandle)handles[i]);
    if (e != 0) fprintf(stderr, "torchalloc: cuMemRelease on device %d failed: error %d\n", device, e);
  }
  guard_exit(c, g, device);
}

static void cuda_destroy(ta_backend *b) {
  /* cudart stays loaded: torch may share it, and unloading cudart is unsafe. */
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
  *(void **)(&c->fn.GetDriverEntryPointByVersion) = dlsym(c->lib, "cudaGetDriverEntryPointByVersion");
  *(void **)(&c->fn.GetDriverEntryPoint) = dlsym(c->lib, "cudaGetDriverEntryPoint");
  cudaError_t e = c->fn.GetDeviceCount(&c->devices);
  if (e != CUDA_SUCCESS || c->devices < 1) {
    snprintf(err, errlen, "no CUDA device (cudaGetDeviceCount: %s); use backend:sim where there is no GPU",
             e != CUDA_SUCCESS ? c->fn.GetErrorString(e) : "0 devices");
    c->fn.GetLastError();
    free(c);
    return NULL;
  }
  load_vmm(c); /* without it, expandable:1 falls back to ordinary segments */
  return &c->base;
}
