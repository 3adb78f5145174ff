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
 * ones. Each granule mapped is its own physical handle, mapped at one
 * address or more (remap), its memory freed when it is released and no
 * longer mapped anywhere, as CUDA's virtual memory does.
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

/* An address range reserved for an expandable segment, with the handle of
 * each granule mapped there (up to the highest one ever mapped; 0: none):
 * mapping a mapped granule, unmapping an unmapped one or with another
 * granule's handle, or freeing the range with granules mapped is a bug the
 * model counts as a violation (CUDA would fail or leak). */
typedef struct sim_reservation {
  uintptr_t base;
  size_t size;
  uint64_t *handle; /* per granule: the handle mapped there (its token), 0: unmapped */
  size_t cap;       /* granules `handle` covers */
  size_t nmapped;   /* granules mapped now */
} sim_reservation;

/* A released reservation's addresses, to be reserved again. */
typedef struct sim_range {
  uintptr_t base;
  size_t size;
} sim_range;

/* A kernel queued at `tick` on `stream` touching bytes [lo, hi) of a
 * handle's granule through the granule mapped at `va` (sim_use). */
typedef struct sim_use {
  uintptr_t va;
  uint32_t lo, hi;
  cudaStream_t stream;
  uint64_t tick;
} sim_use;

/* A physical allocation (cuMemCreate): alive while not released or still
 * mapped somewhere (cuMemMap keeps its memory, as CUDA does). Tokens are
 * index + 1, reused once a handle is gone. Its queued uses, pruned as they
 * complete, are kept with it: a use of a large block costs one entry per
 * granule, and a check looks at its granules' entries only. */
typedef struct sim_handle {
  uint32_t maps;    /* mappings now */
  uint8_t released; /* given back by its owner: its memory goes when `maps` reaches 0 */
  uint8_t alive;
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
  sim_reservation *reservations; /* sorted by base: found by binary search */
  size_t nreservations, cap_reservations;
  sim_range *released;           /* ranges of released reservations */
  size_t nreleased, cap_released;
  sim_handle *handles;           /* by token - 1 */
  size_t nhandles, cap_handles;
  uint32_t *free_tokens;         /* tokens of handles gone, for reuse */
  size_t nfree_tokens, cap_free_tokens;
  atomic_llong violations;       /* calls that would have invalidated a capture, or faulted */
  char last_violation[160];
} sim_device;

typedef struct sim_backend {
  ta_backend base;
  ta_sim_options opts;
  atomic_uint_least64_t allocs_attempted; /* across devices (each under its own heap lock): fault injection */
  sim_device dev[SIM_MAX_DEVICES];
} sim_backend;

/* Grow `*items` (of `*cap` elements of `size` bytes) to hold `need`. */
static int grow(void **items, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap * 2 : 16;
  while (n < need) n *= 2;
  void *p = realloc(*items, n * size);
  if (!p) return -1;
  *items = p;
  *cap = n;
  return 0;
}

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

/* An event completes at a synchronize, or once the work queued before it
 * is done (its tick plus the lag) and it was queried event_polls times. */
typedef struct sim_event {
  int polls_left;
  uint64_t generation;
  uint64_t tick;
} sim_event;

static void sim_synchronize_device(ta_backend *b, int device) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  check_not_capturing(d, "cudaDeviceSynchronize");
  d->sync_generation++;
  d->synced_at = d->clock;
}

static void *sim_event_record(ta_backend *b, int device, cudaStream_t stream) {
  (void)stream; /* one lag for every stream: a stream's work completes in launch order */
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  check_not_capturing(d, "cudaEventRecord");
  sim_event *ev = malloc(sizeof *ev);
  if (ev) *ev = (sim_event){s->opts.event_polls, d->sync_generation, d->clock};
  return ev;
}

static int sim_event_done(ta_backend *b, int device, void *event) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  sim_event *ev = event;
  check_not_capturing(d, "cudaEventQuery");
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

/* --- virtual memory --- */

static void violation(sim_device *d, const char *what) {
  atomic_fetch_add(&d->violations, 1);
  snprintf(d->last_violation, sizeof d->last_violation, "%s", what);
}

static size_t sim_granularity(ta_backend *b, int device) {
  (void)device;
  return ((sim_backend *)b)->opts.no_vmm ? 0 : TA_SIM_GRANULE;
}

/* Index of the first reservation whose base is above `addr`. */
static size_t reservation_after(const sim_device *d, uintptr_t addr) {
  size_t lo = 0, hi = d->nreservations;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->reservations[mid].base <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Addresses for a new reservation: from the bump pointer while it has room,
 * then from a released range (first fit; what is left of it stays). */
static int reserve_addresses(sim_device *d, size_t size, uintptr_t *out) {
  uintptr_t base = ta_align_up(d->next_addr, TA_SIM_GRANULE);
  if (base >= d->next_addr && base <= d->end_addr && size <= d->end_addr - base) {
    d->next_addr = base + size;
    *out = base;
    return TA_OK;
  }
  for (size_t i = 0; i < d->nreleased; i++) {
    sim_range *r = &d->released[i];
    if (r->size < size) continue;
    *out = r->base;
    r->base += size;
    r->size -= size;
    if (r->size == 0) *r = d->released[--d->nreleased];
    return TA_OK;
  }
  return TA_ENOMEM;
}

static int sim_reserve(ta_backend *b, int device, size_t size, uintptr_t *out) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (size == 0 || size % TA_SIM_GRANULE) return TA_ENOMEM;
  if (grow((void **)&d->reservations, &d->cap_reservations, d->nreservations + 1, sizeof *d->reservations))
    return TA_ENOMEM;
  uintptr_t base;
  if (reserve_addresses(d, size, &base) != TA_OK) return TA_ENOMEM;
  size_t at = reservation_after(d, base);
  memmove(d->reservations + at + 1, d->reservations + at, (d->nreservations - at) * sizeof *d->reservations);
  d->reservations[at] = (sim_reservation){.base = base, .size = size};
  d->nreservations++;
  *out = base;
  return TA_OK;
}

static sim_reservation *reservation_of(sim_device *d, uintptr_t addr) {
  size_t at = reservation_after(d, addr);
  if (at == 0) return NULL;
  sim_reservation *r = &d->reservations[at - 1];
  return addr - r->base < r->size ? r : NULL;
}

static void sim_unreserve(ta_backend *b, int device, uintptr_t addr, size_t size) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  sim_reservation *r = reservation_of(d, addr);
  if (!r || r->base != addr || r->size != size) {
    violation(d, "unreserve of a range that was not reserved");
    return;
  }
  if (r->nmapped) violation(d, "unreserve of a range still mapped");
  free(r->handle);
  size_t at = (size_t)(r - d->reservations);
  memmove(r, r + 1, (d->nreservations - at - 1) * sizeof *r);
  d->nreservations--;
  /* Without host memory for the note, the addresses are simply not reused. */
  if (!grow((void **)&d->released, &d->cap_released, d->nreleased + 1, sizeof *d->released))
    d->released[d->nreleased++] = (sim_range){.base = addr, .size = size};
}

/* The reservation holding [addr, addr + size), its handles covering it;
 * NULL (and a violation) when there is none. */
static sim_reservation *range_of(sim_device *d, uintptr_t addr, size_t size, const char *call) {
  sim_reservation *r = reservation_of(d, addr);
  if (!r || size == 0 || size % TA_SIM_GRANULE || (addr - r->base) % TA_SIM_GRANULE ||
      size > r->size - (addr - r->base)) {
    violation(d, call);
    return NULL;
  }
  size_t end = (addr - r->base + size) / TA_SIM_GRANULE, old = r->cap;
  if (end > r->cap) {
    if (grow((void **)&r->handle, &r->cap, end, sizeof *r->handle)) return NULL;
    memset(r->handle + old, 0, (r->cap - old) * sizeof *r->handle);
  }
  return r;
}

/* Work that may still run: launched after the last synchronize, less than
 * `lag` ticks ago. */
static int pending(const sim_backend *s, const sim_device *d, uint64_t tick) {
  return tick > d->synced_at && tick + s->opts.lag > d->clock;
}

static sim_handle *handle_of(sim_device *d, uint64_t token) {
  return token >= 1 && token <= d->nhandles && d->handles[token - 1].alive ? &d->handles[token - 1] : NULL;
}

static uint64_t handle_new(sim_device *d) {
  uint64_t token;
  if (d->nfree_tokens) {
    token = d->free_tokens[--d->nfree_tokens];
  } else {
    if (grow((void **)&d->handles, &d->cap_handles, d->nhandles + 1, sizeof *d->handles)) return 0;
    token = ++d->nhandles;
    d->handles[token - 1] = (sim_handle){0};
  }
  sim_use *uses = d->handles[token - 1].uses; /* a reused token keeps its (empty) array */
  uint32_t cap = d->handles[token - 1].cap_uses;
  d->handles[token - 1] = (sim_handle){.alive = 1, .uses = uses, .cap_uses = cap};
  return token;
}

/* A handle with no mapping left and released: its memory goes back. */
static void handle_settle(sim_device *d, uint64_t token) {
  sim_handle *h = &d->handles[token - 1];
  if (h->maps || !h->released) return;
  if (grow((void **)&d->free_tokens, &d->cap_free_tokens, d->nfree_tokens + 1, sizeof *d->free_tokens) == 0)
    d->free_tokens[d->nfree_tokens++] = (uint32_t)token; /* else the token is never reused: harmless */
  h->alive = 0;
  h->nuses = 0; /* its memory is gone: unmapping it checked that no queued use remained */
  d->used -= TA_SIM_GRANULE;
}

static int sim_map(ta_backend *b, int device, uintptr_t addr, size_t size, uint64_t *handles) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  sim_reservation *r = range_of(d, addr, size, "map outside a reserved range or not granule-aligned");
  if (!r) return TA_ENOMEM;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / TA_SIM_GRANULE;
  for (size_t i = 0; i < n; i++) {
    if (r->handle[first + i]) {
      violation(d, "map of a granule already mapped");
      return TA_ENOMEM;
    }
  }
  uint64_t attempt = atomic_fetch_add_explicit(&s->allocs_attempted, 1, memory_order_relaxed) + 1;
  if (s->opts.fail_alloc_at != 0 && attempt == s->opts.fail_alloc_at) return TA_ENOMEM;
  if (size > sim_free_bytes(s, d)) return TA_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    uint64_t token = handle_new(d);
    if (!token) { /* host memory: give back what this call made */
      for (size_t j = 0; j < i; j++) {
        d->handles[handles[j] - 1].maps = 0;
        d->handles[handles[j] - 1].released = 1;
        r->handle[first + j] = 0;
        handle_settle(d, handles[j]);
      }
      return TA_ENOMEM;
    }
    d->handles[token - 1].maps = 1;
    r->handle[first + i] = handles[i] = token;
    d->used += TA_SIM_GRANULE;
  }
  r->nmapped += n;
  return TA_OK;
}

static int sim_remap(ta_backend *b, int device, uintptr_t addr, size_t size, const uint64_t *handles) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  check_not_capturing(d, "cuMemMap of memory already made (a remap)");
  sim_reservation *r = range_of(d, addr, size, "remap outside a reserved range or not granule-aligned");
  if (!r) return TA_ENOMEM;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / TA_SIM_GRANULE;
  for (size_t i = 0; i < n; i++) {
    if (r->handle[first + i] || !handle_of(d, handles[i]) || d->handles[handles[i] - 1].released) {
      violation(d, "remap onto a mapped granule, or of a handle that is gone or released");
      return TA_ENOMEM;
    }
  }
  for (size_t i = 0; i < n; i++) {
    d->handles[handles[i] - 1].maps++;
    r->handle[first + i] = handles[i];
  }
  r->nmapped += n;
  return TA_OK;
}

static void sim_unmap(ta_backend *b, int device, uintptr_t addr, size_t size, const uint64_t *handles, int release) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  check_not_capturing(d, "cuMemUnmap");
  sim_reservation *r = range_of(d, addr, size, "unmap outside a reserved range or not granule-aligned");
  if (!r) return;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / TA_SIM_GRANULE;
  for (size_t i = 0; i < n; i++) {
    if (!r->handle[first + i] || handles[i] != r->handle[first + i]) {
      violation(d, "unmap of a granule not mapped, or with another granule's handle");
      return;
    }
  }
  for (size_t i = 0; i < n; i++) {
    const sim_handle *h = &d->handles[handles[i] - 1];
    uintptr_t va = addr + i * TA_SIM_GRANULE;
    for (uint32_t u = 0; u < h->nuses; u++) {
      if (h->uses[u].va == va && pending(s, d, h->uses[u].tick)) {
        snprintf(d->last_violation, sizeof d->last_violation,
                 "unmap of %#lx while a kernel queued on stream %p may still use it (a fault on the GPU)",
                 (unsigned long)va, (void *)h->uses[u].stream);
        atomic_fetch_add(&d->violations, 1);
        i = n; /* one violation per call */
        break;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    r->handle[first + i] = 0;
    d->handles[handles[i] - 1].maps--;
    if (release) d->handles[handles[i] - 1].released = 1;
    handle_settle(d, handles[i]);
  }
  r->nmapped -= n;
}

static void sim_release(ta_backend *b, int device, const uint64_t *handles, size_t n) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  for (size_t i = 0; i < n; i++) {
    sim_handle *h = handle_of(d, handles[i]);
    if (!h || h->released) {
      violation(d, "release of a handle that is gone or released");
      continue;
    }
    h->released = 1;
    handle_settle(d, handles[i]);
  }
}

/* ------------------------------------------------------------------------
 * Queued work (sim_use): what the program's kernels touch, and when
 * ---------------------------------------------------------------------- */

#define SIM_PHYS_BASE ((uint64_t)1 << 63) /* handles' memory; ordinary allocations are their own addresses */

/* The physical memory behind `addr`: 1 and *phys (ordinary allocations
 * are their own), or 0 when `addr` lies in a reservation but its granule
 * is not mapped. */
static int translate(sim_device *d, uintptr_t addr, uint64_t *phys) {
  sim_reservation *r = reservation_of(d, addr);
  if (!r) {
    *phys = addr;
    return 1;
  }
  size_t g = (addr - r->base) / TA_SIM_GRANULE;
  uint64_t token = g < r->cap ? r->handle[g] : 0;
  if (!token) return 0;
  *phys = SIM_PHYS_BASE | (token * TA_SIM_GRANULE) | ((addr - r->base) % TA_SIM_GRANULE);
  return 1;
}

/* A kernel on `stream` touches bytes [lo, hi) of the granule mapped at
 * `va` of reservation `r`: checked against the queued uses of its memory,
 * then queued itself. */
static void use_granule(sim_backend *s, sim_device *d, const sim_reservation *r, uintptr_t va, uint32_t lo,
                        uint32_t hi, cudaStream_t stream) {
  size_t g = (va - r->base) / TA_SIM_GRANULE;
  uint64_t token = g < r->cap ? r->handle[g] : 0;
  if (!token) {
    snprintf(d->last_violation, sizeof d->last_violation,
             "a kernel on stream %p touches %#lx, which is not mapped (a fault on the GPU)", (void *)stream,
             (unsigned long)(va + lo));
    atomic_fetch_add(&d->violations, 1);
    return;
  }
  sim_handle *h = &d->handles[token - 1];
  uint32_t k = 0;
  for (uint32_t u = 0; u < h->nuses; u++) {
    const sim_use *o = &h->uses[u];
    if (!pending(s, d, o->tick)) continue; /* done: pruned */
    if (o->stream != stream && o->lo < hi && lo < o->hi) {
      snprintf(d->last_violation, sizeof d->last_violation,
               "a kernel on stream %p touches memory at %#lx that a kernel queued on stream %p may still use "
               "(handed out too early)", (void *)stream, (unsigned long)(va + lo), (void *)o->stream);
      atomic_fetch_add(&d->violations, 1);
    }
    h->uses[k++] = *o;
  }
  h->nuses = k;
  if (!pending(s, d, d->clock)) return; /* no lag: done at once */
  size_t cap = h->cap_uses;
  if (grow((void **)&h->uses, &cap, (size_t)h->nuses + 1, sizeof *h->uses)) return;
  h->cap_uses = (uint32_t)cap;
  h->uses[h->nuses++] = (sim_use){va, lo, hi, stream, d->clock};
}

static void sim_destroy(ta_backend *b) {
  sim_backend *s = (sim_backend *)b;
  for (int i = 0; i < SIM_MAX_DEVICES; i++) {
    sim_device *d = &s->dev[i];
    for (size_t r = 0; r < d->nreservations; r++) free(d->reservations[r].handle);
    free(d->reservations);
    free(d->released);
    for (size_t h = 0; h < d->nhandles; h++) free(d->handles[h].uses);
    free(d->handles);
    free(d->free_tokens);
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
    .remap = sim_remap,
    .unmap = sim_unmap,
    .release = sim_release,
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

int ta_backend_sim_use(ta_backend *b, int device, cudaStream_t stream, uintptr_t addr, size_t size) {
  if (!is_sim(b, device)) return -1;
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  d->clock++;
  const sim_reservation *r = reservation_of(d, addr);
  if (!r) return 0; /* an ordinary allocation: its addresses are never mapped again, nothing can race on them */
  uintptr_t end = addr + (size ? size : 1);
  if (end > r->base + r->size) end = r->base + r->size;
  for (uintptr_t lo = addr; lo < end;) {
    uintptr_t va = r->base + (lo - r->base) / TA_SIM_GRANULE * TA_SIM_GRANULE;
    uintptr_t hi = va + TA_SIM_GRANULE < end ? va + TA_SIM_GRANULE : end;
    use_granule(s, d, r, va, (uint32_t)(lo - va), (uint32_t)(hi - va), stream);
    lo = hi;
  }
  return 0;
}

int ta_backend_sim_advance(ta_backend *b, int device, uint64_t ticks) {
  if (!is_sim(b, device)) return -1;
  ((sim_backend *)b)->dev[device].clock += ticks;
  return 0;
}

int ta_backend_sim_physical(ta_backend *b, int device, uintptr_t addr, uint64_t *phys) {
  if (!is_sim(b, device)) return -1;
  return translate(&((sim_backend *)b)->dev[device], addr, phys) ? 0 : -1;
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
