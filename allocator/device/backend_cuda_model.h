/* The CUDA backend's state, shared by its two files (backend_cuda.c:
 * devices, allocations, events, virtual memory and peer access;
 * backend_cuda_ipc.c: memory shared with other processes). Private to the
 * backend: cudart's and the driver's functions are loaded at run time, so
 * their types are declared here, mirroring cuda.h's layouts. */
#ifndef TA_BACKEND_CUDA_MODEL_H
#define TA_BACKEND_CUDA_MODEL_H

#include <pthread.h>
#include <stdatomic.h>

#include "device/backend.h"

typedef int cudaError_t; /* enum in CUDA; 0 = cudaSuccess, 2 = cudaErrorMemoryAllocation */
typedef struct CUevent_st *cudaEvent_t;
typedef struct { unsigned char reserved[TA_IPC_BASE_HANDLE_BYTES]; } cudaIpcMemHandle_t; /* passed by value */
enum { CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1 };
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
  cudaError_t (*DeviceCanAccessPeer)(int *, int, int);     /* optional likewise (then: no peers) */
  cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t *, void *);          /* optional likewise (then: no IPC) */
  cudaError_t (*IpcOpenMemHandle)(void **, cudaIpcMemHandle_t, unsigned);
  cudaError_t (*IpcCloseMemHandle)(void *);
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
       CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
       CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103, CUDA_ERROR_OUT_OF_MEMORY = 2 };

typedef struct cuvmm_fns {
  CUresult (*AddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*AddressFree)(CUdeviceptr, size_t);
  CUresult (*Create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*Release)(CUmemGenericAllocationHandle);
  CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*Unmap)(CUdeviceptr, size_t);
  CUresult (*SetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*GetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
  CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t); /* optional: without it nothing moves */
  /* Optional: without them no memory of an expandable segment is shared with another process. */
  CUresult (*ExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
  CUresult (*ImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
  CUresult (*DeviceGetAttribute)(int *, int, int);
} cuvmm_fns;

/* Expandable segments map in granules of at least 2 MiB: the driver's
 * minimum on current GPUs, and few enough mappings for an 80 GiB device. */
#define VMM_GRANULE_MIN ((size_t)2 << 20)
#define VMM_MAX_DEVICES 64

/* A physical handle's exported descriptor (ipc_export): made once, closed
 * when the handle is given back. */
typedef struct exported_fd {
  uint64_t handle;
  int fd;
} exported_fd;

/* A capture's topology (graph_capture_record_stream_reuse), through the
 * driver at the ABI of CUDA 12.0 (cuStreamGetCaptureInfo_v2 and the first
 * cuGraphNodeGetDependencies), which the CUDA 13 driver keeps: streams,
 * graphs and nodes are pointers. Found when cudart is loaded; NULL when absent. */
typedef struct cugraph_fns {
  CUresult (*StreamGetCaptureInfo)(void *stream, int *status, unsigned long long *id, void **graph,
                                   void *const **dependencies, size_t *count);
  CUresult (*GraphNodeGetDependencies)(void *node, void **dependencies, size_t *count);
} cugraph_fns;

typedef struct cuda_backend {
  ta_backend base;
  void *lib;
  cudart_fns fn;
  cugraph_fns graph;
  int devices;
  int vmm_loaded; /* 1: vmm has every function */
  cuvmm_fns vmm;
  size_t granule[VMM_MAX_DEVICES]; /* 0: not asked yet; SIZE_MAX: the device cannot */
  /* Whether cuMemCreate asks for handles that can be exported to a file
   * descriptor (CUDA IPC): 0 not asked yet, 1 yes, -1 no (the device or
   * driver cannot; memory is then not shareable). Per device, set under
   * that device's heap lock. */
  int exportable[VMM_MAX_DEVICES];
  /* Descriptors of exported handles; any device's heap may add or close
   * one, hence the lock. `nexported` is read without it on the release
   * path: 0 means none to look for (the common case costs nothing). */
  pthread_mutex_t exported_lock;
  exported_fd *exported;
  atomic_size_t nexported;
  size_t cap_exported;
} cuda_backend;

/* Switch to `device` for the duration of one call; PyTorch may free a block
 * of device 1 while device 0 is current. */
typedef struct device_guard {
  int previous;
} device_guard;

static inline device_guard guard_enter(cuda_backend *c, int device) {
  device_guard g = {device};
  if (c->fn.GetDevice(&g.previous) != CUDA_SUCCESS) g.previous = device;
  if (g.previous != device) c->fn.SetDevice(device);
  return g;
}
static inline void guard_exit(cuda_backend *c, device_guard g, int device) {
  if (g.previous != device) c->fn.SetDevice(g.previous);
}

static inline CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

/* --- between the backend's files --- */

/* The handle's exported descriptor, if it has one, is closed: the handle
 * is being given back (backend_cuda_ipc.c). */
ta_internal void ta_cuda_forget_exported(cuda_backend *c, uint64_t handle);
/* Close every exported descriptor (teardown). */
ta_internal void ta_cuda_ipc_destroy(cuda_backend *c);
ta_internal int ta_cuda_ipc_export(ta_backend *b, int device, uint64_t handle, int *fd, char *why, size_t whylen);
ta_internal int ta_cuda_ipc_import(ta_backend *b, int device, int pid, const int *fds, size_t n, size_t handle,
                                   uint64_t *handles, char *why, size_t whylen);
ta_internal int ta_cuda_ipc_base_handle(ta_backend *b, int device, uintptr_t base,
                                        unsigned char out[TA_IPC_BASE_HANDLE_BYTES], char *why, size_t whylen);
ta_internal int ta_cuda_ipc_open_base(ta_backend *b, int device, const unsigned char handle[TA_IPC_BASE_HANDLE_BYTES],
                                      uintptr_t *out, char *why, size_t whylen);
ta_internal void ta_cuda_ipc_close_base(ta_backend *b, int device, uintptr_t addr);

#endif
