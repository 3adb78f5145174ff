/* The CUDA backend: cudart, loaded at run time.
 *
 * Why dlopen instead of linking: inside PyTorch we want the very cudart that
 * torch already loaded (RTLD_NOLOAD finds it by soname), and without a GPU
 * the library must still load so the sim backend, tests and replay run on
 * any machine. Only the handful of functions below are used. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"

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
} cudart_fns;

typedef struct cuda_backend {
  ta_backend base;
  void *lib;
  cudart_fns fn;
  int devices;
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
  cudaError_t e = c->fn.GetDeviceCount(&c->devices);
  if (e != CUDA_SUCCESS || c->devices < 1) {
    snprintf(err, errlen, "no CUDA device (cudaGetDeviceCount: %s); use backend:sim where there is no GPU",
             e != CUDA_SUCCESS ? c->fn.GetErrorString(e) : "0 devices");
    c->fn.GetLastError();
    free(c);
    return NULL;
  }
  return &c->base;
}
