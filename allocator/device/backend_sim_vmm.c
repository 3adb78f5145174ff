/* The simulated device's virtual memory (backend.h, backend_sim.c): address
 * ranges reserved, physical handles of one granule or several mapped into
 * them, and what the program's queued kernels touch through them.
 *
 * Why a handle may span several granules: the CUDA driver's calls cost per
 * handle (bench/vmm_costs.c), so large blocks are mapped in large handles;
 * CUDA maps and unmaps a handle whole, and so does the model: a call that
 * covers part of a handle, or a handle of another size, is a violation. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device/backend_sim_model.h"

static void violation(sim_device *d, const char *what) {
  atomic_fetch_add(&d->violations, 1);
  snprintf(d->last_violation, sizeof d->last_violation, "%s", what);
}

size_t ta_sim_granularity(ta_backend *b, int device) {
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

int ta_sim_reserve(ta_backend *b, int device, size_t size, uintptr_t *out) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (size == 0 || size % TA_SIM_GRANULE) return TA_ENOMEM;
  if (ta_grow(&d->reservations, &d->cap_reservations, d->nreservations + 1, 16))
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

sim_reservation *ta_sim_reservation_of(sim_device *d, uintptr_t addr) {
  size_t at = reservation_after(d, addr);
  if (at == 0) return NULL;
  sim_reservation *r = &d->reservations[at - 1];
  return addr - r->base < r->size ? r : NULL;
}

void ta_sim_unreserve(ta_backend *b, int device, uintptr_t addr, size_t size) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  sim_reservation *r = ta_sim_reservation_of(d, addr);
  if (!r || r->base != addr || r->size != size) {
    violation(d, "unreserve of a range that was not reserved");
    return;
  }
  if (r->nmapped) violation(d, "unreserve of a range still mapped");
  free(r->handle);
  free(r->sub);
  free(r->access);
  size_t at = (size_t)(r - d->reservations);
  memmove(r, r + 1, (d->nreservations - at - 1) * sizeof *r);
  d->nreservations--;
  /* Without host memory for the note, the addresses are simply not reused. */
  if (!ta_grow(&d->released, &d->cap_released, d->nreleased + 1, 16))
    d->released[d->nreleased++] = (sim_range){.base = addr, .size = size};
}

/* The reservation holding [addr, addr + size), its handles covering it;
 * NULL (and a violation) when there is none. */
static sim_reservation *range_of(sim_device *d, uintptr_t addr, size_t size, const char *call) {
  sim_reservation *r = ta_sim_reservation_of(d, addr);
  if (!r || size == 0 || size % TA_SIM_GRANULE || (addr - r->base) % TA_SIM_GRANULE ||
      size > r->size - (addr - r->base)) {
    violation(d, call);
    return NULL;
  }
  size_t end = (addr - r->base + size) / TA_SIM_GRANULE, old = r->cap;
  if (end > r->cap) {
    size_t cap = ta_grown_capacity(old, end, 16);
    /* `handle` last: r->cap counts the smallest of the three */
    if (!cap || ta_resize(&r->sub, cap) || ta_resize(&r->access, cap) || ta_resize(&r->handle, cap)) return NULL;
    r->cap = cap;
    memset(r->handle + old, 0, (r->cap - old) * sizeof *r->handle);
  }
  return r;
}

static sim_handle *handle_of(sim_device *d, uint64_t token) {
  return token >= 1 && token <= d->nhandles && d->handles[token - 1].alive ? &d->handles[token - 1] : NULL;
}

static uint64_t handle_new(sim_device *d, uint32_t granules) {
  uint64_t token;
  if (d->nfree_tokens) {
    token = d->free_tokens[--d->nfree_tokens];
  } else {
    if (ta_grow(&d->handles, &d->cap_handles, d->nhandles + 1, 16)) return 0;
    token = ++d->nhandles;
    d->handles[token - 1] = (sim_handle){0};
  }
  sim_use *uses = d->handles[token - 1].uses; /* a reused token keeps its (empty) array */
  uint32_t cap = d->handles[token - 1].cap_uses;
  d->handles[token - 1] = (sim_handle){.granules = granules, .alive = 1, .uses = uses, .cap_uses = cap};
  return token;
}

/* The token whose memory `token` is (itself, unless imported). */
static uint64_t root_of(const sim_device *d, uint64_t token) {
  uint64_t root = d->handles[token - 1].alias_of;
  return root ? root : token;
}

/* A handle with no mapping left and released (and, for memory of its
 * own, no imported handle over it left): its memory goes back. */
static void handle_settle(sim_device *d, uint64_t token) {
  sim_handle *h = &d->handles[token - 1];
  if (h->maps || !h->released || h->aliases) return;
  uint64_t root = h->alias_of;
  if (ta_grow(&d->free_tokens, &d->cap_free_tokens, d->nfree_tokens + 1, 16) == 0)
    d->free_tokens[d->nfree_tokens++] = (uint32_t)token; /* else the token is never reused: harmless */
  h->alive = 0;
  h->nuses = 0; /* its memory is gone: unmapping it checked that no queued use remained */
  h->alias_of = 0;
  if (root) { /* an imported handle: the memory is its owner's, which may go now */
    d->handles[root - 1].aliases--;
    handle_settle(d, root);
    return;
  }
  d->used -= h->granules * TA_SIM_GRANULE;
}

/* Granules per handle of `handle` bytes for a call covering `size` bytes;
 * 0 (and a violation) when the call is not made of whole handles. */
static uint32_t handle_granules(sim_device *d, size_t size, size_t handle, const char *call) {
  if (handle == 0 || handle % TA_SIM_GRANULE || handle / TA_SIM_GRANULE > SIM_MAX_HANDLE_GRANULES ||
      size % handle) {
    violation(d, call);
    return 0;
  }
  return (uint32_t)(handle / TA_SIM_GRANULE);
}

/* Whether granules [g, g + k) of `r` hold exactly the whole handle `token`. */
static int holds_handle(const sim_reservation *r, size_t g, uint32_t k, uint64_t token) {
  for (uint32_t j = 0; j < k; j++)
    if (r->handle[g + j] != token || r->sub[g + j] != j) return 0;
  return 1;
}

static void place(sim_reservation *r, size_t g, uint32_t k, uint64_t token, uint64_t access) {
  for (uint32_t j = 0; j < k; j++) {
    r->handle[g + j] = token;
    r->sub[g + j] = j;
    r->access[g + j] = access;
  }
}

static uint64_t device_bit(int device) { return (uint64_t)1 << device; }

int ta_sim_map(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle, uint64_t *handles,
               uint64_t peers) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  sim_reservation *r = range_of(d, addr, size, "map outside a reserved range or not granule-aligned");
  uint32_t k = handle_granules(d, size, handle, "map not made of whole handles of a granule multiple");
  if (!r || !k) return TA_ENOMEM;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / handle;
  for (size_t g = first; g < first + n * k; g++) {
    if (r->handle[g]) {
      violation(d, "map of a granule already mapped");
      return TA_ENOMEM;
    }
  }
  uint64_t attempt = atomic_fetch_add_explicit(&s->allocs_attempted, 1, memory_order_relaxed) + 1;
  if (s->opts.fail_alloc_at != 0 && attempt == s->opts.fail_alloc_at) return TA_ENOMEM;
  if (size > ta_sim_free_bytes(s, d)) return TA_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    uint64_t token = handle_new(d, k);
    if (!token) { /* host memory: give back what this call made */
      for (size_t j = 0; j < i; j++) {
        d->handles[handles[j] - 1].maps = 0;
        d->handles[handles[j] - 1].released = 1;
        place(r, first + j * k, k, 0, 0);
        handle_settle(d, handles[j]);
      }
      return TA_ENOMEM;
    }
    d->handles[token - 1].maps = 1;
    place(r, first + i * k, k, token, peers | device_bit(device));
    handles[i] = token;
    d->used += handle;
  }
  r->nmapped += n * k;
  d->driver_ns += n * (TA_SIM_CREATE_NS + TA_SIM_MAP_NS);
  return TA_OK;
}

int ta_sim_remap(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle, const uint64_t *handles,
                 uint64_t peers) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  ta_sim_check_not_capturing(d, "cuMemMap of memory already made (a remap)");
  sim_reservation *r = range_of(d, addr, size, "remap outside a reserved range or not granule-aligned");
  uint32_t k = handle_granules(d, size, handle, "remap not made of whole handles of a granule multiple");
  if (!r || !k) return TA_ENOMEM;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / handle;
  for (size_t i = 0; i < n; i++) {
    const sim_handle *h = handle_of(d, handles[i]);
    int taken = 0;
    for (uint32_t j = 0; j < k; j++) taken |= r->handle[first + i * k + j] != 0;
    if (taken || !h || h->released || h->granules != k) {
      violation(d, "remap onto a mapped granule, or of a handle that is gone, released or of another size");
      return TA_ENOMEM;
    }
  }
  for (size_t i = 0; i < n; i++) {
    d->handles[handles[i] - 1].maps++;
    place(r, first + i * k, k, handles[i], peers | device_bit(device));
  }
  r->nmapped += n * k;
  d->driver_ns += n * TA_SIM_MAP_NS;
  return TA_OK;
}

void ta_sim_unmap(ta_backend *b, int device, uintptr_t addr, size_t size, size_t handle, const uint64_t *handles,
                  int release) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  ta_sim_check_not_capturing(d, "cuMemUnmap");
  sim_reservation *r = range_of(d, addr, size, "unmap outside a reserved range or not granule-aligned");
  uint32_t k = handle_granules(d, size, handle, "unmap not made of whole handles of a granule multiple");
  if (!r || !k) return;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, n = size / handle;
  for (size_t i = 0; i < n; i++) {
    if (!handles[i] || !holds_handle(r, first + i * k, k, handles[i]) || d->handles[handles[i] - 1].granules != k) {
      violation(d, "unmap of a granule not mapped, of part of a handle, or with another granule's handle");
      return;
    }
  }
  for (size_t g = 0; g < n * k; g++) {
    const sim_handle *h = &d->handles[root_of(d, handles[g / k]) - 1]; /* uses are kept with the memory's owner */
    uintptr_t va = addr + g * TA_SIM_GRANULE;
    for (uint32_t u = 0; u < h->nuses; u++) {
      if (h->uses[u].va == va && ta_sim_pending(s, d, h->uses[u].tick)) {
        snprintf(d->last_violation, sizeof d->last_violation,
                 "unmap of %#lx while a kernel queued on stream %p may still use it (a fault on the GPU)",
                 (unsigned long)va, (void *)h->uses[u].stream);
        atomic_fetch_add(&d->violations, 1);
        g = n * k; /* one violation per call */
        break;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    place(r, first + i * k, k, 0, 0);
    d->handles[handles[i] - 1].maps--;
    if (release) d->handles[handles[i] - 1].released = 1;
    handle_settle(d, handles[i]);
  }
  r->nmapped -= n * k;
  d->driver_ns += n * (TA_SIM_UNMAP_NS + (release ? TA_SIM_RELEASE_NS : 0));
}

void ta_sim_release(ta_backend *b, int device, const uint64_t *handles, size_t n) {
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
  d->driver_ns += n * TA_SIM_RELEASE_NS;
}

static _Atomic(torchalloc_sim_copy_fn) copy_hook; /* torchalloc_sim_on_copy's function */

void ta_backend_sim_on_copy(torchalloc_sim_copy_fn fn) { atomic_store(&copy_hook, fn); }

/* The model holds no bytes: a copy checks that both ranges are mapped,
 * granule by granule, and that no queued kernel may still write the source
 * (the caller synchronized), as a copy on the GPU would need. */
int ta_sim_copy(ta_backend *b, int device, uintptr_t dst, uintptr_t src, size_t size) {
  sim_backend *s = (sim_backend *)b;
  sim_device *d = &s->dev[device];
  if (d->clock != d->synced_at) {
    violation(d, "copy of memory queued kernels may still use (no synchronize before it)");
    return TA_EDEVICE;
  }
  torchalloc_sim_copy_fn hook = atomic_load(&copy_hook);
  for (size_t off = 0; off < size; off += TA_SIM_GRANULE) {
    uint64_t from, to;
    if (!ta_sim_translate(d, src + off, &from) || !ta_sim_translate(d, dst + off, &to)) {
      violation(d, "copy from or to addresses not mapped");
      return TA_EDEVICE;
    }
    if (hook) hook(device, to, from, size - off < TA_SIM_GRANULE ? size - off : TA_SIM_GRANULE);
  }
  return TA_OK;
}

/* ------------------------------------------------------------------------
 * Queued work (sim_use): what the program's kernels touch, and when
 * ---------------------------------------------------------------------- */

#define SIM_PHYS_BASE ((uint64_t)1 << 63) /* handles' memory; ordinary allocations are their own addresses */

int ta_sim_translate(sim_device *d, uintptr_t addr, uint64_t *phys) {
  sim_reservation *r = ta_sim_reservation_of(d, addr);
  if (!r) {
    *phys = addr;
    return 1;
  }
  size_t g = (addr - r->base) / TA_SIM_GRANULE;
  uint64_t token = g < r->cap ? r->handle[g] : 0;
  if (!token) return 0;
  *phys = SIM_PHYS_BASE | ((root_of(d, token) * SIM_MAX_HANDLE_GRANULES + r->sub[g]) * TA_SIM_GRANULE) |
          ((addr - r->base) % TA_SIM_GRANULE);
  return 1;
}

void ta_sim_use_granule(sim_backend *s, sim_device *d, const sim_reservation *r, uintptr_t va, uint32_t lo,
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
  sim_handle *h = &d->handles[root_of(d, token) - 1];
  uint32_t sub = r->sub[g], k = 0;
  for (uint32_t u = 0; u < h->nuses; u++) {
    const sim_use *o = &h->uses[u];
    if (!ta_sim_pending(s, d, o->tick)) continue; /* done: pruned */
    if (o->stream != stream && o->sub == sub && o->lo < hi && lo < o->hi) {
      snprintf(d->last_violation, sizeof d->last_violation,
               "a kernel on stream %p touches memory at %#lx that a kernel queued on stream %p may still use "
               "(handed out too early)", (void *)stream, (unsigned long)(va + lo), (void *)o->stream);
      atomic_fetch_add(&d->violations, 1);
    }
    h->uses[k++] = *o;
  }
  h->nuses = k;
  if (!ta_sim_pending(s, d, d->clock)) return; /* no lag: done at once */
  size_t cap = h->cap_uses;
  if (ta_grow(&h->uses, &cap, (size_t)h->nuses + 1, 16)) return;
  h->cap_uses = (uint32_t)cap;
  h->uses[h->nuses++] = (sim_use){va, lo, hi, sub, stream, d->clock};
}
/* ------------------------------------------------------------------------
 * Peer access: what each granule's mapping lets other devices touch
 * ---------------------------------------------------------------------- */

int ta_sim_peer_capable(ta_backend *b, int device, int peer) {
  int n = ((sim_backend *)b)->opts.devices;
  return device != peer && device >= 0 && peer >= 0 && device < n && peer < n; /* every pair has a path */
}

int ta_sim_grant(ta_backend *b, int device, uintptr_t addr, size_t size, uint64_t peers) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  sim_reservation *r = range_of(d, addr, size, "cuMemSetAccess outside a reserved range or not granule-aligned");
  if (!r) return TA_EDEVICE;
  size_t first = (addr - r->base) / TA_SIM_GRANULE, end = first + size / TA_SIM_GRANULE;
  for (size_t g = first; g < end; g++) {
    if (!r->handle[g]) { /* CUDA refuses access to a range with holes */
      violation(d, "cuMemSetAccess over a granule that is not mapped");
      return TA_EDEVICE;
    }
  }
  for (size_t g = first; g < end; g++) r->access[g] |= peers;
  return TA_OK;
}

int ta_sim_peer_touch(sim_device *d, int device, int peer, uintptr_t addr, size_t size) {
  sim_reservation *r = ta_sim_reservation_of(d, addr);
  if (!r) return 0; /* an ordinary allocation: reached through the context's peer access */
  uintptr_t end = addr + (size ? size : 1);
  if (end > r->base + r->size) end = r->base + r->size;
  for (uintptr_t va = addr; va < end; va = (va - r->base) / TA_SIM_GRANULE * TA_SIM_GRANULE + r->base + TA_SIM_GRANULE) {
    size_t g = (va - r->base) / TA_SIM_GRANULE;
    if (g < r->cap && r->handle[g] && (r->access[g] & device_bit(peer))) continue;
    snprintf(d->last_violation, sizeof d->last_violation,
             "a copy or kernel on device %d touches %#lx of device %d, %s (CUDA: invalid argument)", peer,
             (unsigned long)va, device, g < r->cap && r->handle[g] ? "which grants it no access" : "which is not mapped");
    atomic_fetch_add(&d->violations, 1);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------
 * CUDA IPC within the one process the sim lives in: a descriptor is a
 * handle's token; importing it makes a handle of its own over that memory
 * ---------------------------------------------------------------------- */

int ta_sim_ipc_export(ta_backend *b, int device, uint64_t handle, int *fd, char *why, size_t whylen) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (!handle_of(d, handle) || handle > 0x7fffffff) {
    snprintf(why, whylen, "handle %llu of sim device %d is not alive", (unsigned long long)handle, device);
    return TA_EDEVICE;
  }
  *fd = (int)handle;
  return TA_OK;
}

int ta_sim_ipc_import(ta_backend *b, int device, int pid, const int *fds, size_t n, size_t handle, uint64_t *handles,
                      char *why, size_t whylen) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (pid != (int)getpid()) {
    snprintf(why, whylen, "the simulated device lives in one process: memory of process %d cannot be opened", pid);
    return TA_EDEVICE;
  }
  uint32_t k = (uint32_t)(handle / TA_SIM_GRANULE);
  for (size_t i = 0; i < n; i++) {
    const sim_handle *h = fds[i] > 0 ? handle_of(d, (uint64_t)fds[i]) : NULL;
    if (!h || h->granules != k || handle % TA_SIM_GRANULE) {
      snprintf(why, whylen, "descriptor %d is no handle of %zu bytes on sim device %d", fds[i], handle, device);
      return TA_EDEVICE;
    }
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t root = root_of(d, (uint64_t)fds[i]);
    uint64_t token = handle_new(d, k); /* may move d->handles */
    if (!token) {
      snprintf(why, whylen, "out of host memory");
      ta_sim_release(b, device, handles, i);
      return TA_EDEVICE;
    }
    d->handles[token - 1].alias_of = root;
    d->handles[root - 1].aliases++;
    handles[i] = token;
  }
  return TA_OK;
}

/* An ordinary allocation's "IPC handle": its device and address. */
static const char SIM_BASE_MAGIC[8] = "tasimipc";

int ta_sim_ipc_base_handle(ta_backend *b, int device, uintptr_t base, unsigned char out[TA_IPC_BASE_HANDLE_BYTES],
                           char *why, size_t whylen) {
  (void)b, (void)why, (void)whylen;
  uint64_t addr = base;
  int32_t dev = device;
  memset(out, 0, TA_IPC_BASE_HANDLE_BYTES);
  memcpy(out, SIM_BASE_MAGIC, sizeof SIM_BASE_MAGIC);
  memcpy(out + 8, &dev, sizeof dev);
  memcpy(out + 16, &addr, sizeof addr);
  return TA_OK;
}

int ta_sim_ipc_open_base(ta_backend *b, int device, const unsigned char handle[TA_IPC_BASE_HANDLE_BYTES],
                         uintptr_t *out, char *why, size_t whylen) {
  sim_backend *s = (sim_backend *)b;
  int32_t dev;
  uint64_t addr;
  memcpy(&dev, handle + 8, sizeof dev);
  memcpy(&addr, handle + 16, sizeof addr);
  if (memcmp(handle, SIM_BASE_MAGIC, sizeof SIM_BASE_MAGIC) || dev < 0 || dev >= s->opts.devices) {
    snprintf(why, whylen, "not a memory handle of this simulated device (opening it on device %d)", device);
    return TA_EDEVICE;
  }
  *out = (uintptr_t)addr; /* the same memory: one process holds both ends */
  return TA_OK;
}

void ta_sim_ipc_close_base(ta_backend *b, int device, uintptr_t addr) { (void)b, (void)device, (void)addr; }
