/* The simulated device: a fake address space with a capacity.
 *
 * Addresses are handed out by a bump pointer per device, so a trace of 80 GiB
 * costs a few bytes of host memory; addresses are never reused, which makes
 * a stale pointer in a test impossible to confuse with a fresh one. Device d
 * lives at [(d+1) << 52, (d+2) << 52): 4 PiB of cumulative allocations each.
 * Events complete at once by default: the simulated device has no queued
 * work. With event_polls = N an event reports completion only on its Nth
 * query or after a synchronize, so tests can watch record_stream's deferral.
 *
 * Stream capture is modelled too (ta_backend_sim_capture): while a stream
 * of the device captures, each call that would invalidate a real capture
 * under cudaStreamCaptureModeGlobal (synchronize, event record or query,
 * cudaFree) is a counted violation. Allocations are allowed: the CUDA
 * backend makes them in relaxed capture mode, as PyTorch does. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"

#define SIM_MAX_DEVICES 64
#define SIM_ALIGN 512

/* An address range reserved for an expandable segment, with a flag per
 * granule (up to the highest one ever mapped): mapping a mapped granule,
 * unmapping an unmapped one, or freeing the range with granules mapped is a
 * bug the model counts as a violation (CUDA would fail or leak). */
typedef struct sim_reservation {
  uintptr_t base;
  size_t size;
  uint8_t *mapped; /* one flag per granule */
  size_t cap;      /* granules `mapped` covers */
  size_t nmapped;  /* granules mapped now */
} sim_reservation;

typedef struct sim_device {
  uint64_t sync_generation; /* bumped by synchronize: older events are done */
  size_t used;
  uintptr_t next_addr;
  uintptr_t end_addr;
  int address_exhausted;
  int capturing;                 /* streams of this device capturing now */
  sim_reservation *reservations;
  size_t nreservations, cap_reservations;
  atomic_llong violations;       /* calls that would have invalidated a capture */
  char last_violation[128];
} sim_device;

typedef struct sim_backend {
  ta_backend base;
  ta_sim_options opts;
  atomic_uint_least64_t allocs_attempted; /* across devices (each under its own heap lock): fault injection */
  sim_device dev[SIM_MAX_DEVICES];
} sim_backend;

static int sim_device_count(ta_backend *b) { return ((sim_backend *)b)->opts.devices; }

static size_t sim_free_bytes(const sim_backend *s, const sim_device *d) {
  size_t taken = d->used + s->opts.held_elsewhere;
  return taken < s->opts.capacity ? s->opts.capacity - taken : 0;
}

static void check_not_capturing(sim_device *d, const char *call) {
  if (!d->capturing) return;
  atomic_fetch_add(&d->violations, 1);
  snprintf(d->last_violation, sizeof d->last_violation, "%s while a stream of the device was capturing", call);
}

static int sim_alloc(ta_backend *b, int device, size_t size, uintptr_t *out) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  uint64_t attempt = atomic_fetch_add_explicit(&s->allocs_attempted, 1, memory_order_relaxed) + 1;
  if (s->opts.fail_alloc_at != 0 && attempt == s->opts.fail_alloc_at) return TA_ENOMEM;
  size_t bytes = ta_align_up(size, SIM_ALIGN);
  if (bytes > sim_free_bytes(s, d)) return TA_ENOMEM;
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
  check_not_capturing(d, "cudaFree");
  d->used -= ta_align_up(size, SIM_ALIGN);
}

static int sim_mem_info(ta_backend *b, int device, size_t *free_bytes, size_t *total_bytes) {
  sim_backend *s = (sim_backend *)b;
  *total_bytes = s->opts.capacity;
  *free_bytes = sim_free_bytes(s, &s->dev[device]);
  return TA_OK;
}

typedef struct sim_event {
  int polls_left;
  uint64_t generation;
} sim_event;

static void sim_synchronize_device(ta_backend *b, int device) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  check_not_capturing(d, "cudaDeviceSynchronize");
  d->sync_generation++;
}

static void *sim_event_record(ta_backend *b, int device, cudaStream_t stream) {
  (void)stream;
  sim_backend *s = (sim_backend *)b;
  check_not_capturing(&s->dev[device], "cudaEventRecord");
  sim_event *ev = malloc(sizeof *ev);
  if (ev) *ev = (sim_event){s->opts.event_polls, s->dev[device].sync_generation};
  return ev;
}

static int sim_event_done(ta_backend *b, int device, void *event) {
  sim_event *ev = event;
  check_not_capturing(&((sim_backend *)b)->dev[device], "cudaEventQuery");
  if (ev->generation != ((sim_backend *)b)->dev[device].sync_generation) return 1;
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

/* --- virtual memory --- */

static void violation(sim_device *d, const char *what) {
  atomic_fetch_add(&d->violations, 1);
  snprintf(d->last_violation, sizeof d->last_violation, "%s", what);
}

static size_t sim_granularity(ta_backend *b, int device) {
  (void)device;
  return ((sim_backend *)b)->opts.no_vmm ? 0 : TA_SIM_GRANULE;
}

static int sim_reserve(ta_backend *b, int device, size_t size, uintptr_t *out) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (size == 0 || size % TA_SIM_GRANULE || size > d->end_addr - d->next_addr) return TA_ENOMEM;
  if (d->nreservations == d->cap_reservations) {
    size_t cap = d->cap_reservations ? d->cap_reservations * 2 : 8;
    sim_reservation *r = realloc(d->reservations, cap * sizeof *r);
    if (!r) return TA_ENOMEM;
    d->reservations = r;
    d->cap_reservations = cap;
  }
  uintptr_t base = ta_align_up(d->next_addr, TA_SIM_GRANULE);
  if (base - d->next_addr > d->end_addr - d->next_addr - size) return TA_ENOMEM;
  d->next_addr = base + size;
  d->reservations[d->nreservations++] = (sim_reservation){.base = base, .size = size};
  *out = base;
  return TA_OK;
}

static sim_reservation *reservation_of(sim_device *d, uintptr_t addr) {
  for (size_t i = 0; i < d->nreservations; i++)
    if (addr >= d->reservations[i].base && addr - d->reservations[i].base < d->reservations[i].size)
      return &d->reservations[i];
  return NULL;
}

static void sim_unreserve(ta_backend *b, int device, uintptr_t addr, size_t size) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  sim_reservation *r = reservation_of(d, addr);
  if (!r || r->base != addr || r->size != size) {
    violation(d, "unreserve of a range that was not reserved");
    return;
  }
  if (r->nmapped) violation(d, "unreserve of a range still mapped");
  free(r->mapped);
  *r = d->reservations[--d->nreservations];
}

/* The reservation holding [addr, addr + size), its flags covering it; NULL
 * (and a violation) when there is none. */
static sim_reservation *range_of(sim_device *d, uintptr_t addr, size_t size, const char *call) {
  sim_reservation *r = reservation_of(d, addr);
  if (!r || size == 0 || size % TA_SIM_GRANULE || (addr - r->base) % TA_SIM_GRANULE ||
      size > r->size - (addr - r->base)) {
    violation(d, call);
    return NULL;
  }
  size_t end = (addr - r->base + size) / TA_SIM_GRANULE;
  if (end > r->cap) {
    size_t cap = r->cap ? r->cap : 64;
    while (cap < end) cap *= 2;
    uint8_t *m = realloc(r->mapped, cap);
    if (!m) return NULL;
    memset(m + r->cap, 0, cap - r->cap);
    r->mapped = m;
    r->cap = cap;
  }
  return r;
}

static int sim_map(ta_backend *b, int device, uintptr_t addr, size_t size, uint64_t *handles) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  sim_reservation *r = range_of(d, addr, size, "map outside a reserved range or not granule-aligned");
  if (!r) return TA_ENOMEM;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / TA_SIM_GRANULE;
  for (size_t i = 0; i < n; i++) {
    if (r->mapped[first + i]) {
      violation(d, "map of a granule already mapped");
      return TA_ENOMEM;
    }
  }
  uint64_t attempt = atomic_fetch_add_explicit(&s->allocs_attempted, 1, memory_order_relaxed) + 1;
  if (s->opts.fail_alloc_at != 0 && attempt == s->opts.fail_alloc_at) return TA_ENOMEM;
  if (size > sim_free_bytes(s, d)) return TA_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    r->mapped[first + i] = 1;
    handles[i] = (addr + i * TA_SIM_GRANULE) | 1; /* a token unmap checks */
  }
  r->nmapped += n;
  d->used += size;
  return TA_OK;
}

static void sim_unmap(ta_backend *b, int device, uintptr_t addr, size_t size, const uint64_t *handles) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  check_not_capturing(d, "cuMemUnmap");
  sim_reservation *r = range_of(d, addr, size, "unmap outside a reserved range or not granule-aligned");
  if (!r) return;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / TA_SIM_GRANULE;
  for (size_t i = 0; i < n; i++) {
    if (!r->mapped[first + i] || handles[i] != ((addr + i * TA_SIM_GRANULE) | 1)) {
      violation(d, "unmap of a granule not mapped, or with another granule's handle");
      return;
    }
  }
  memset(r->mapped + first, 0, n);
  r->nmapped -= n;
  d->used -= size;
}

static void sim_destroy(ta_backend *b) {
  sim_backend *s = (sim_backend *)b;
  for (int i = 0; i < SIM_MAX_DEVICES; i++) {
    for (size_t r = 0; r < s->dev[i].nreservations; r++) free(s->dev[i].reservations[r].mapped);
    free(s->dev[i].reservations);
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
    .granularity = sim_granularity,
    .reserve = sim_reserve,
    .unreserve = sim_unreserve,
    .map = sim_map,
    .unmap = sim_unmap,
};

static int is_sim(ta_backend *b, int device) {
  return b && b->ops == &sim_ops && device >= 0 && device < ((sim_backend *)b)->opts.devices;
}

int ta_backend_sim_capture(ta_backend *b, int device, cudaStream_t stream, int capturing) {
  (void)stream; /* any capture forbids the calls above (global mode) */
  if (!is_sim(b, device)) return -1;
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (!capturing && d->capturing == 0) return -1;
  d->capturing += capturing ? 1 : -1;
  return 0;
}

int64_t ta_backend_sim_violations(ta_backend *b, int device, char *buf, size_t len) {
  if (!is_sim(b, device)) return -1;
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (buf && len) snprintf(buf, len, "%s", d->last_violation);
  return atomic_load(&d->violations);
}

int ta_backend_sim_address_exhausted(ta_backend *b, int device) {
  return ((sim_backend *)b)->dev[device].address_exhausted;
}

ta_backend *ta_backend_sim_create(const ta_sim_options *opts) {
  if (opts->devices < 1 || opts->devices > SIM_MAX_DEVICES) return NULL;
  sim_backend *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->base.ops = &sim_ops;
  s->opts = *opts;
  for (int d = 0; d < opts->devices; d++) {
    s->dev[d].next_addr = (uintptr_t)(d + 1) << 52;
    s->dev[d].end_addr = (uintptr_t)(d + 2) << 52;
  }
  return &s->base;
}
