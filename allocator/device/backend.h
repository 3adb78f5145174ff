/* The device boundary. Policies never call CUDA; they ask the heap for
 * segments, and the heap asks its backend. Two backends share this table:
 * `cuda` (cudart, loaded at run time) and `sim` (a fake address space with a
 * capacity and fault injection; no host memory per simulated byte). */
#ifndef TA_BACKEND_H
#define TA_BACKEND_H

#include "base/common.h"
#include "torchalloc.h"
#include "torchalloc_sim.h"


typedef struct ta_backend ta_backend;

/* cudaIpcMemHandle_t's size (CUDA_IPC_HANDLE_SIZE). */
#define TA_IPC_BASE_HANDLE_BYTES 64

typedef struct ta_backend_ops {
  const char *name;
  int (*device_count)(ta_backend *);
  /* Allocate `size` bytes on `device`; TA_ENOMEM when the device is full. */
  int (*alloc)(ta_backend *, int device, size_t size, uintptr_t *out);
  void (*free)(ta_backend *, int device, uintptr_t addr, size_t size);
  int (*mem_info)(ta_backend *, int device, size_t *free_bytes, size_t *total_bytes);
  /* Wait until all work queued on `device` is done (before releasing cached
   * segments that queued kernels might still use). */
  void (*synchronize)(ta_backend *, int device);
  /* Events for record_stream: record one on `stream`, ask if it completed,
   * release it. */
  void *(*event_record)(ta_backend *, int device, cudaStream_t stream);
  int (*event_done)(ta_backend *, int device, void *event);
  void (*event_release)(ta_backend *, int device, void *event);
  /* 1 when `stream` is capturing a CUDA graph now. */
  int (*stream_capturing)(ta_backend *, int device, cudaStream_t stream);
  void (*destroy)(ta_backend *);
  /* The host's time in nanoseconds, for the move budget (segments_moves.c);
   * NULL: the monotonic clock. The sim's is a model: its ticks plus what its
   * virtual-memory calls would have cost on the GPU, so that replay is the
   * same on every machine. */
  uint64_t (*clock_ns)(ta_backend *, int device);

  /* Virtual memory, for expandable segments: an address range reserved
   * once, physical memory mapped into it granule by granule as it grows and
   * unmapped as it shrinks. `granularity` is 0 when the device cannot (the
   * other four are then never called). Sizes and addresses given to them
   * are multiples of the granularity. */
  size_t (*granularity)(ta_backend *, int device);
  /* Reserve `size` bytes of addresses (no memory); TA_ENOMEM when refused. */
  int (*reserve)(ta_backend *, int device, size_t size, uintptr_t *out);
  void (*unreserve)(ta_backend *, int device, uintptr_t addr, size_t size);
  /* Back [addr, addr + size) with new device memory, readable and writable
   * by `device` and by every device of `peers` (bit d: device d; see
   * grant): one physical allocation of `handle` bytes (a multiple of
   * the granularity) per handle-sized piece, its handle stored in
   * handles[i] for piece i, so any piece can be unmapped later. Fewer,
   * larger handles cost less: the driver's calls cost per handle, not per
   * byte (bench/vmm_costs.c). TA_ENOMEM when the device is full (nothing
   * stays mapped then). */
  int (*map)(ta_backend *, int device, uintptr_t addr, size_t size, size_t handle, uint64_t *handles,
             uint64_t peers);
  /* Map the existing physical handles handles[i], each of `handle` bytes
   * (made by map, mapped elsewhere now or unmapped without release, or
   * imported from another process by ipc_import), at [addr, addr + size),
   * with access for `device` and `peers`: no new memory; one handle may be
   * mapped at several addresses at once. */
  int (*remap)(ta_backend *, int device, uintptr_t addr, size_t size, size_t handle, const uint64_t *handles,
               uint64_t peers);
  /* Unmap [addr, addr + size), made of whole handles of `handle` bytes;
   * with `release` give its handles back too (their memory is freed once
   * no mapping of them remains). Queued work must no longer use these
   * addresses (the caller synchronized, or knows from events that the
   * device is past it). */
  void (*unmap)(ta_backend *, int device, uintptr_t addr, size_t size, size_t handle, const uint64_t *handles,
                int release);
  /* Give back `n` handles mapped nowhere now (unmapped without release). */
  void (*release)(ta_backend *, int device, const uint64_t *handles, size_t n);
  /* Copy `size` bytes of device memory from `src` to `dst` (both mapped on
   * `device`) and wait until the copy is done: the out-of-memory path moves
   * live bytes from a large handle into smaller ones with it. The device
   * must be idle (the caller synchronized). TA_OK, or TA_EDEVICE (nothing
   * may be assumed copied). NULL when the backend cannot. */
  int (*copy)(ta_backend *, int device, uintptr_t dst, uintptr_t src, size_t size);

  /* Peer access. Memory mapped with cuMemMap is reachable only from the
   * devices its mapping names (cuMemSetAccess): a copy or kernel of
   * another device faults ("invalid argument") until access is granted.
   * 1 when `peer` can reach `device`'s memory at all (a peer-to-peer path,
   * cudaDeviceCanAccessPeer); then grant gives the devices of `peers`
   * read and write access to the mapped range [addr, addr + size) of
   * `device` (map and remap give it to what they map). TA_OK, or
   * TA_EDEVICE when the driver refuses. */
  int (*peer_capable)(ta_backend *, int device, int peer);
  int (*grant)(ta_backend *, int device, uintptr_t addr, size_t size, uint64_t peers);
  /* A CUDA graph capture's topology, for graph_capture_record_stream_reuse
   * (heap_streams.c), which may ask it while a capture is underway (it
   * neither records nor queries anything). capture_frontier: 1 while
   * `stream` captures, with the capture's nodes its next work will depend
   * on (cudaStreamGetCaptureInfo's dependencies), *n of them, written up to
   * `cap`; 0 when it does not capture. node_dependencies: the nodes `node`
   * depends on, likewise. -1 on error. NULL when the backend cannot tell
   * (such blocks wait for the capture's end). */
  int (*capture_frontier)(ta_backend *, int device, cudaStream_t stream, uint64_t *nodes, size_t cap, size_t *n);
  int (*node_dependencies)(ta_backend *, int device, uint64_t node, uint64_t *deps, size_t cap, size_t *n);

  /* CUDA IPC: memory of this process opened in another (segments_ipc.c).
   * Mapped memory travels as its physical handles: ipc_export gives a
   * POSIX file descriptor of `handle` (made once, kept open while the
   * handle lives: the receiver copies it out of this process with
   * pidfd_getfd) and ipc_import turns the descriptors `fds` of process
   * `pid` into handles of this process, each of `handle` bytes, mapped
   * with remap and given back with unmap(release). An ordinary
   * allocation travels as cudaIpcGetMemHandle's 64 bytes: ipc_open_base
   * maps another process's allocation here, ipc_close_base unmaps it.
   * Each returns TA_OK, or TA_EDEVICE with the reason in `why`. */
  int (*ipc_export)(ta_backend *, int device, uint64_t handle, int *fd, char *why, size_t whylen);
  int (*ipc_import)(ta_backend *, int device, int pid, const int *fds, size_t n, size_t handle, uint64_t *handles,
                    char *why, size_t whylen);
  int (*ipc_base_handle)(ta_backend *, int device, uintptr_t base, unsigned char out[TA_IPC_BASE_HANDLE_BYTES],
                         char *why, size_t whylen);
  int (*ipc_open_base)(ta_backend *, int device, const unsigned char handle[TA_IPC_BASE_HANDLE_BYTES],
                       uintptr_t *out, char *why, size_t whylen);
  void (*ipc_close_base)(ta_backend *, int device, uintptr_t addr);
} ta_backend_ops;

struct ta_backend {
  const ta_backend_ops *ops;
};

typedef struct ta_sim_options {
  int devices;            /* number of simulated devices */
  size_t capacity;        /* bytes per device */
  uint64_t fail_alloc_at; /* fail the Nth device allocation (1-based); 0: never */
  int event_polls;        /* an event completes on its Nth query (or a synchronize); 0: at once */
  size_t held_elsewhere;  /* bytes of each device taken by someone else: never available */
  int no_vmm;             /* model a device without virtual memory management (granularity 0) */
  int wide_addresses;     /* one device whose addresses span [2^52, 2^62) instead of 4 PiB (replay: a trace may
                             have any number of expandable segments, each reserving up to 1 TiB) */
  uint64_t lag;           /* ticks the device trails the host by (ta_backend_sim_use); 0: none */
} ta_sim_options;

/* The sim's granule: that of the GPUs torchalloc runs on (2 MiB). */
#define TA_SIM_GRANULE ((size_t)2 << 20)

ta_internal ta_backend *ta_backend_sim_create(const ta_sim_options *opts);
/* 1 once a sim device refused an allocation for want of addresses (4 PiB of
 * cumulative allocations, 2^62 bytes with wide_addresses: allocations are
 * never reused), not of capacity. */
ta_internal int ta_backend_sim_address_exhausted(ta_backend *sim, int device);
/* The sim's model of stream capture (backend_sim.c); -1 when `b` is not a
 * sim backend or the device is out of range. */
ta_internal int ta_backend_sim_capture(ta_backend *b, int device, cudaStream_t stream, int capturing);
ta_internal int64_t ta_backend_sim_violations(ta_backend *b, int device, char *buf, size_t len);
/* `waiter` waits for the work queued on `waited` so far (an event recorded
 * there, then cudaStreamWaitEvent): in a capture, waiter's next work
 * depends on waited's captured work, and a waiter that did not capture
 * joins the capture (a fork). -1 when `b` is not sim. */
ta_internal int ta_backend_sim_stream_wait(ta_backend *b, int device, cudaStream_t waiter, cudaStream_t waited);
/* The program's kernel on `stream` touches [addr, addr + size) now: one
 * tick of the sim's clock, checked against the work still queued (see
 * backend_sim.c). -1 when `b` is not a sim backend or the device is bad. */
ta_internal int ta_backend_sim_use(ta_backend *b, int device, cudaStream_t stream, uintptr_t addr, size_t size);
/* `ticks` of host time pass (kernels that touch nothing tracked). */
ta_internal int ta_backend_sim_advance(ta_backend *b, int device, uint64_t ticks);
/* The physical memory behind `addr` (a token unique among the device's
 * memory now); -1 when it is not mapped or `b` is not sim. */
ta_internal int ta_backend_sim_physical(ta_backend *b, int device, uintptr_t addr, uint64_t *phys);
/* Every sim backend's copies are told to `fn` (torchalloc_sim_on_copy). */
ta_internal void ta_backend_sim_on_copy(torchalloc_sim_copy_fn fn);
/* A copy or kernel of device `peer` touches [addr, addr + size) of device
 * `device` (sim devices reach each other: every pair is peer-capable):
 * 0 when every mapped granule of it grants `peer` access, 1 (and a
 * violation counted on `device`) when one does not, as CUDA's "invalid
 * argument" would say; ordinary allocations are reachable (their access
 * is the context's, cudaDeviceEnablePeerAccess). -1 when `b` is not sim. */
ta_internal int ta_backend_sim_peer_use(ta_backend *b, int device, int peer, uintptr_t addr, size_t size);
/* NULL with a message in `err` when cudart cannot be loaded. */
ta_internal ta_backend *ta_backend_cuda_create(char *err, size_t errlen);

#endif
