/* The simulated device: a fake address space with a capacity.
 *
 * Addresses are handed out by a bump pointer per device, so a trace of 80 GiB
 * costs a few bytes of host memory; addresses are never reused, which makes
 * a stale pointer in a test impossible to confuse with a fresh one. Device d
 * lives at [(d+1) << 52, (d+2) << 52): 4 PiB of cumulative allocations each
 * (with wide_addresses, replay's one device, [2^52, 2^62)). Only the address
 * ranges of released reservations are handed out again, and only once the
 * bump pointer has no room left: expandable segments come and go, each
 * reserving as many addresses as the device has bytes.
 * Events complete at once by default: the simulated device has no queued
 * work. With event_polls = N an event reports completion only on its Nth
 * query or after a synchronize, so tests can watch record_stream's deferral.
 *
 * With a lag of L ticks the device trails the host: the program tells it
 * what its kernels touch (ta_backend_sim_use, one tick each), and a kernel
 * launched at tick t is done at tick t + L, as is an event recorded then.
 * Deterministic, so tests can ask exactly what a GPU running behind the
 * host would make of the allocator: unmapping memory a queued kernel still
 * uses (a fault), a kernel touching unmapped memory, or a kernel of one
 * stream touching physical memory that a queued kernel of another stream
 * still uses (handed out too early: two addresses mapping one granule
 * count as the same memory) are violations, counted with the capture
 * ones. Each physical handle (one granule or several: backend_sim_vmm.c) is
 * mapped at one address or more (remap), mapped and unmapped whole, its
 * memory freed when it is released and no longer mapped anywhere, as
 * CUDA's virtual memory does.
 *
 * Stream capture is modelled too (ta_backend_sim_capture): while a stream
 * of the device captures, each call that would invalidate a real capture
 * under cudaStreamCaptureModeGlobal (synchronize, event record or query,
 * cudaFree) is a counted violation. Allocations are allowed: the CUDA
 * backend makes them in relaxed capture mode, as PyTorch does. The
 * capture's topology (which captured kernels come after which: forks and
 * joins of streams) is modelled in backend_sim_graph.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend_sim_model.h"

static int sim_device_count(ta_backend *b) { return ((sim_backend *)b)->opts.devices; }

static int sim_alloc(ta_backend *b, int device, size_t size, uintptr_t *out) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  uint64_t attempt = atomic_fetch_add_explicit(&s->allocs_attempted, 1, memory_order_relaxed) + 1;
  if (s->opts.fail_alloc_at != 0 && attempt == s->opts.fail_alloc_at) return TA_ENOMEM;
  size_t bytes = ta_align_up(size, SIM_ALIGN);
  if (bytes > ta_sim_free_bytes(s, d)) return TA_ENOMEM;
  if (bytes > d->end_addr - d->next_addr) {
    d->address_exhausted = 1;
    return TA_ENOMEM;
  }
  *out = d->next_addr;
  d->next_addr += bytes;
  d->used += bytes;
  return TA_OK;
}

static void sim_free(ta_backend *b, int device, uintptr_t addr, size_t size) {
  (void)addr;
  sim_device *d = &((sim_backend *)b)->dev[device];
  ta_sim_check_not_capturing(d, "cudaFree");
  d->used -= ta_align_up(size, SIM_ALIGN);
}

static int sim_mem_info(ta_backend *b, int device, size_t *free_bytes, size_t *total_bytes) {
  sim_backend *s = (sim_backend *)b;
  *total_bytes = s->opts.capacity;
  *free_bytes = ta_sim_free_bytes(s, &s->dev[device]);
  return TA_OK;
}

/* An event completes at a synchronize, or once the work queued before it
 * is done (its tick plus the lag) and it was queried event_polls times. */
typedef struct sim_event {
  int polls_left;
  uint64_t generation;
  uint64_t tick;
} sim_event;

static void sim_synchronize_device(ta_backend *b, int device) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  ta_sim_check_not_capturing(d, "cudaDeviceSynchronize");
  d->sync_generation++;
  d->synced_at = d->clock;
}

static void *sim_event_record(ta_backend *b, int device, cudaStream_t stream) {
  (void)stream; /* one lag for every stream: a stream's work completes in launch order */
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  ta_sim_check_not_capturing(d, "cudaEventRecord");
  sim_event *ev = malloc(sizeof *ev);
  if (ev) *ev = (sim_event){s->opts.event_polls, d->sync_generation, d->clock};
  return ev;
}

static uint64_t sim_clock_ns(ta_backend *b, int device) {
  const sim_device *d = &((sim_backend *)b)->dev[device];
  return d->clock * TA_SIM_TICK_NS + d->driver_ns;
}

static int sim_event_done(ta_backend *b, int device, void *event) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  sim_event *ev = event;
  ta_sim_check_not_capturing(d, "cudaEventQuery");
  if (ev->generation != d->sync_generation) return 1;
  if (d->clock < ev->tick + s->opts.lag) return 0; /* the device has not got there yet */
  return --ev->polls_left <= 0;
}

static void sim_event_release(ta_backend *b, int device, void *event) {
  (void)b, (void)device;
  free(event);
}

static int sim_stream_capturing(ta_backend *b, int device, cudaStream_t stream) {
  (void)stream; /* the model does not tell streams apart */
  return ((sim_backend *)b)->dev[device].capturing > 0;
}

static void sim_destroy(ta_backend *b) {
  sim_backend *s = (sim_backend *)b;
  for (int i = 0; i < SIM_MAX_DEVICES; i++) {
    sim_device *d = &s->dev[i];
    for (size_t r = 0; r < d->nreservations; r++)
      free(d->reservations[r].handle), free(d->reservations[r].sub), free(d->reservations[r].access);
    free(d->reservations);
    free(d->released);
    for (size_t h = 0; h < d->nhandles; h++) free(d->handles[h].uses);
    free(d->handles);
    free(d->free_tokens);
    ta_sim_graph_end(d);
  }
  free(b);
}

static const ta_backend_ops sim_ops = {
    .name = "sim",
    .device_count = sim_device_count,
    .alloc = sim_alloc,
    .free = sim_free,
    .mem_info = sim_mem_info,
    .synchronize = sim_synchronize_device,
    .event_record = sim_event_record,
    .event_done = sim_event_done,
    .event_release = sim_event_release,
    .stream_capturing = sim_stream_capturing,
    .destroy = sim_destroy,
    .clock_ns = sim_clock_ns,
    .granularity = ta_sim_granularity,
    .reserve = ta_sim_reserve,
    .unreserve = ta_sim_unreserve,
    .map = ta_sim_map,
    .remap = ta_sim_remap,
    .unmap = ta_sim_unmap,
    .release = ta_sim_release,
    .copy = ta_sim_copy,
    .peer_capable = ta_sim_peer_capable,
    .grant = ta_sim_grant,
    .ipc_export = ta_sim_ipc_export,
    .ipc_import = ta_sim_ipc_import,
    .ipc_base_handle = ta_sim_ipc_base_handle,
    .ipc_open_base = ta_sim_ipc_open_base,
    .ipc_close_base = ta_sim_ipc_close_base,
    .capture_frontier = ta_sim_capture_frontier,
    .node_dependencies = ta_sim_node_dependencies,
};

static int is_sim(ta_backend *b, int device) {
  return b && b->ops == &sim_ops && device >= 0 && device < ((sim_backend *)b)->opts.devices;
}

int ta_backend_sim_capture(ta_backend *b, int device, cudaStream_t stream, int capturing) {
  if (!is_sim(b, device)) return -1; /* any capture forbids the calls above (global mode) */
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (!capturing && d->capturing == 0) return -1;
  d->capturing += capturing ? 1 : -1;
  if (capturing) ta_sim_graph_begin(d, stream); /* without host memory the topology is unknown: asking fails */
  else if (d->capturing == 0) ta_sim_graph_end(d);
  return 0;
}

int ta_backend_sim_stream_wait(ta_backend *b, int device, cudaStream_t waiter, cudaStream_t waited) {
  if (!is_sim(b, device)) return -1;
  ta_sim_graph_wait(&((sim_backend *)b)->dev[device], waiter, waited);
  return 0;
}

int64_t ta_backend_sim_violations(ta_backend *b, int device, char *buf, size_t len) {
  if (!is_sim(b, device)) return -1;
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (buf && len) snprintf(buf, len, "%s", d->last_violation);
  return atomic_load(&d->violations);
}

int ta_backend_sim_use(ta_backend *b, int device, cudaStream_t stream, uintptr_t addr, size_t size) {
  if (!is_sim(b, device)) return -1;
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  d->clock++;
  if (d->graph) ta_sim_graph_launch(d, stream); /* a captured kernel: a node of the graph */
  const sim_reservation *r = ta_sim_reservation_of(d, addr);
  if (!r) return 0; /* an ordinary allocation: its addresses are never mapped again, nothing can race on them */
  uintptr_t end = addr + (size ? size : 1);
  if (end > r->base + r->size) end = r->base + r->size;
  for (uintptr_t lo = addr; lo < end;) {
    uintptr_t va = r->base + (lo - r->base) / TA_SIM_GRANULE * TA_SIM_GRANULE;
    uintptr_t hi = va + TA_SIM_GRANULE < end ? va + TA_SIM_GRANULE : end;
    ta_sim_use_granule(s, d, r, va, (uint32_t)(lo - va), (uint32_t)(hi - va), stream);
    lo = hi;
  }
  return 0;
}

int ta_backend_sim_peer_use(ta_backend *b, int device, int peer, uintptr_t addr, size_t size) {
  if (!is_sim(b, device) || !is_sim(b, peer)) return -1;
  return ta_sim_peer_touch(&((sim_backend *)b)->dev[device], device, peer, addr, size);
}

int ta_backend_sim_advance(ta_backend *b, int device, uint64_t ticks) {
  if (!is_sim(b, device)) return -1;
  ((sim_backend *)b)->dev[device].clock += ticks;
  return 0;
}

int ta_backend_sim_physical(ta_backend *b, int device, uintptr_t addr, uint64_t *phys) {
  if (!is_sim(b, device)) return -1;
  return ta_sim_translate(&((sim_backend *)b)->dev[device], addr, phys) ? 0 : -1;
}

int ta_backend_sim_address_exhausted(ta_backend *b, int device) {
  return ((sim_backend *)b)->dev[device].address_exhausted;
}

ta_backend *ta_backend_sim_create(const ta_sim_options *opts) {
  if (opts->devices < 1 || opts->devices > SIM_MAX_DEVICES || (opts->wide_addresses && opts->devices != 1)) return NULL;
  sim_backend *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->base.ops = &sim_ops;
  s->opts = *opts;
  for (int d = 0; d < opts->devices; d++) {
    s->dev[d].next_addr = (uintptr_t)(d + 1) << 52;
    s->dev[d].end_addr = (uintptr_t)(d + 2) << 52;
  }
  if (opts->wide_addresses) s->dev[0].end_addr = (uintptr_t)1 << 62;
  return &s->base;
}
