/* The simulated device's model, shared by its two files (backend_sim.c:
 * devices, allocations, events, queued work; backend_sim_vmm.c: virtual
 * memory). Private to the sim. */
#ifndef TA_BACKEND_SIM_MODEL_H
#define TA_BACKEND_SIM_MODEL_H

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "device/backend.h"

#define SIM_MAX_DEVICES 64
#define SIM_ALIGN 512
#define SIM_MAX_HANDLE_GRANULES 1024 /* 2 GiB: its granules' physical addresses stay apart */

/* An address range reserved for an expandable segment, with the handle of
 * each granule mapped there (up to the highest one ever mapped; 0: none):
 * mapping a mapped granule, unmapping an unmapped one or with another
 * granule's handle, or freeing the range with granules mapped is a bug the
 * model counts as a violation (CUDA would fail or leak). */
typedef struct sim_reservation {
  uintptr_t base;
  size_t size;
  uint64_t *handle; /* per granule: the handle mapped there (its token), 0: unmapped */
  uint32_t *sub;    /* per granule: which granule of that handle it is */
  uint64_t *access; /* per granule: the devices that may touch it (bit d: device d), set by map, remap, grant */
  size_t cap;       /* granules `handle`, `sub` and `access` cover */
  size_t nmapped;   /* granules mapped now */
} sim_reservation;

/* A released reservation's addresses, to be reserved again. */
typedef struct sim_range {
  uintptr_t base;
  size_t size;
} sim_range;

/* A kernel queued at `tick` on `stream` touching bytes [lo, hi) of a
 * handle's granule `sub` through the granule mapped at `va` (sim_use). */
typedef struct sim_use {
  uintptr_t va;
  uint32_t lo, hi, sub;
  cudaStream_t stream;
  uint64_t tick;
} sim_use;

/* A physical allocation (cuMemCreate): alive while not released or still
 * mapped somewhere (cuMemMap keeps its memory, as CUDA does). Tokens are
 * index + 1, reused once a handle is gone. Its queued uses, pruned as they
 * complete, are kept with it: a use of a large block costs one entry per
 * granule, and a check looks at its granules' entries only. A handle
 * spans one granule or several (up to SIM_MAX_HANDLE_GRANULES). */
typedef struct sim_handle {
  uint32_t granules; /* its size, in granules: mapped, unmapped and counted whole */
  uint32_t maps;    /* mappings now */
  uint8_t released; /* given back by its owner: its memory goes when `maps` reaches 0 */
  uint8_t alive;
  /* CUDA IPC in one process (ipc_import of a descriptor ipc_export gave):
   * an imported handle is a handle of its own over another's memory, as
   * cuMemImportFromShareableHandle's is. `alias_of`: the token whose
   * memory it is (0: its own); `aliases`: imported handles alive over this
   * one's memory, which stays until they are gone too. */
  uint64_t alias_of;
  uint32_t aliases;
  uint32_t nuses, cap_uses;
  sim_use *uses;
} sim_handle;

typedef struct sim_device {
  uint64_t sync_generation; /* bumped by synchronize: older events are done */
  uint64_t clock;           /* ticks: kernels launched so far (sim_use, sim_advance) */
  uint64_t synced_at;       /* the clock at the last synchronize: work launched by then is done */
  size_t used;
  uintptr_t next_addr;
  uintptr_t end_addr;
  int address_exhausted;
  int capturing;                 /* streams of this device capturing now */
  struct sim_graph *graph;       /* the capture's nodes while one is underway (backend_sim_graph.c) */
  sim_reservation *reservations; /* sorted by base: found by binary search */
  size_t nreservations, cap_reservations;
  sim_range *released;           /* ranges of released reservations */
  size_t nreleased, cap_released;
  sim_handle *handles;           /* by token - 1 */
  size_t nhandles, cap_handles;
  uint32_t *free_tokens;         /* tokens of handles gone, for reuse */
  size_t nfree_tokens, cap_free_tokens;
  uint64_t driver_ns;            /* the modelled host time of its virtual-memory calls so far (sim_clock_ns) */
  atomic_llong violations;       /* calls that would have invalidated a capture, or faulted */
  char last_violation[160];
} sim_device;

/* The sim's clock (backend.h clock_ns): a tick (a kernel the program
 * reports, an event of replay) is TA_SIM_TICK_NS of host time, about what a
 * host-bound training step spends per allocation (a small conv net on the
 * H200, 2026-11-27: 2.7 ms for 168 allocations and frees); each
 * virtual-memory call adds what it costs the CUDA driver per handle
 * (bench/vmm_costs.c on the H100, BENCHMARKS.md: create 13 us, map 1,
 * set access 32, unmap 22, release 16). */
#define TA_SIM_TICK_NS 16000u
#define TA_SIM_CREATE_NS 13000u
#define TA_SIM_MAP_NS 33000u /* cuMemMap and its cuMemSetAccess */
#define TA_SIM_UNMAP_NS 22000u
#define TA_SIM_RELEASE_NS 16000u

typedef struct sim_backend {
  ta_backend base;
  ta_sim_options opts;
  atomic_uint_least64_t allocs_attempted; /* across devices (each under its own heap lock): fault injection */
  sim_device dev[SIM_MAX_DEVICES];
} sim_backend;

/* --- between the sim's files --- */

/* A call that would invalidate a capture (global mode) while one runs: a violation. */
static inline void ta_sim_check_not_capturing(sim_device *d, const char *call) {
  if (!d->capturing) return;
  atomic_fetch_add(&d->violations, 1);
  snprintf(d->last_violation, sizeof d->last_violation, "%s while a stream of the device was capturing", call);
}

static inline size_t ta_sim_free_bytes(const sim_backend *s, const sim_device *d) {
  size_t taken = d->used + s->opts.held_elsewhere;
  return taken < s->opts.capacity ? s->opts.capacity - taken : 0;
}
/* Work that may still run: launched after the last synchronize, less than
 * `lag` ticks ago. */
static inline int ta_sim_pending(const sim_backend *s, const sim_device *d, uint64_t tick) {
  return tick > d->synced_at && tick + s->opts.lag > d->clock;
}
/* The reservation holding `addr`, or NULL. */
ta_internal sim_reservation *ta_sim_reservation_of(sim_device *d, uintptr_t addr);
/* The physical memory behind `addr`: 1 and *phys (ordinary allocations
 * are their own), or 0 when `addr` lies in a reservation but its granule
 * is not mapped. */
ta_internal int ta_sim_translate(sim_device *d, uintptr_t addr, uint64_t *phys);
/* A kernel on `stream` touches bytes [lo, hi) of the granule mapped at
 * `va` of reservation `r`: checked against the queued uses of its memory,
 * then queued itself. */
ta_internal void ta_sim_use_granule(sim_backend *s, sim_device *d, const sim_reservation *r, uintptr_t va,
                                    uint32_t lo, uint32_t hi, cudaStream_t stream);

/* The virtual memory operations (backend.h). */
ta_internal size_t ta_sim_granularity(ta_backend *b, int device);
ta_internal int ta_sim_reserve(ta_backend *b, int device, size_t size, uintptr_t *out);
ta_internal void ta_sim_unreserve(ta_backend *b, int device, uintptr_t addr, size_t size);
ta_internal int ta_sim_map(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle, uint64_t *handles,
                           uint64_t peers);
ta_internal int ta_sim_remap(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle,
                             const uint64_t *handles, uint64_t peers);
ta_internal void ta_sim_unmap(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle,
                              const uint64_t *handles, int release);
ta_internal void ta_sim_release(ta_backend *b, int device, const uint64_t *handles, size_t n);
ta_internal int ta_sim_copy(ta_backend *b, int device, uintptr_t dst, uintptr_t src, size_t size);

ta_internal int ta_sim_peer_capable(ta_backend *b, int device, int peer);
ta_internal int ta_sim_grant(ta_backend *b, int device, uintptr_t addr, size_t size, uint64_t peers);
/* 1 (and a violation) when a copy or kernel of `peer` may not touch [addr, addr + size) of device `device`. */
/* The capture graph (backend_sim_graph.c): begun on `stream`, ended (every
 * node dropped), a kernel of `stream` captured (a node after its frontier),
 * `waiter` waiting for `waited`; the two backend ops. 0, or -1 without host
 * memory (the model then forgets the capture: the frontier calls fail). */
ta_internal int ta_sim_graph_begin(sim_device *d, cudaStream_t stream);
ta_internal void ta_sim_graph_end(sim_device *d);
ta_internal int ta_sim_graph_launch(sim_device *d, cudaStream_t stream);
ta_internal int ta_sim_graph_wait(sim_device *d, cudaStream_t waiter, cudaStream_t waited);
ta_internal int ta_sim_capture_frontier(ta_backend *b, int device, cudaStream_t stream, uint64_t *nodes, size_t cap,
                                        size_t *n);
ta_internal int ta_sim_node_dependencies(ta_backend *b, int device, uint64_t node, uint64_t *deps, size_t cap,
                                         size_t *n);
ta_internal int ta_sim_peer_touch(sim_device *d, int device, int peer, uintptr_t addr, size_t size);
ta_internal int ta_sim_ipc_export(ta_backend *b, int device, uint64_t handle, int *fd, char *why, size_t whylen);
ta_internal int ta_sim_ipc_import(ta_backend *b, int device, int pid, const int *fds, size_t n, size_t handle,
                                  uint64_t *handles, char *why, size_t whylen);
ta_internal int ta_sim_ipc_base_handle(ta_backend *b, int device, uintptr_t base,
                                       unsigned char out[TA_IPC_BASE_HANDLE_BYTES], char *why, size_t whylen);
ta_internal int ta_sim_ipc_open_base(ta_backend *b, int device, const unsigned char handle[TA_IPC_BASE_HANDLE_BYTES],
                                     uintptr_t *out, char *why, size_t whylen);
ta_internal void ta_sim_ipc_close_base(ta_backend *b, int device, uintptr_t addr);

#endif
