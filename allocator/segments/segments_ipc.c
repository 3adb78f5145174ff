/* CUDA IPC in the segment layer (segments.h): the memory of a live block
 * described for another process, and memory another process described
 * mapped here.
 *
 * Why PyTorch's wire format, byte for byte (c10/cuda/CUDACachingAllocator.cpp,
 * torch 2.11, shareIpcHandle / getIpcDevPtr): the receiver decodes the
 * bytes with its own allocator, which may be PyTorch's; speaking its format
 * lets a torchalloc process and a PyTorch one exchange tensors either way.
 *
 *   version (1 byte, 2) | kind (1 byte) | payload
 *   kind 'c', an ordinary allocation: cudaIpcGetMemHandle of the
 *     allocation's start (64 bytes); the offset counts from that start.
 *   kind 'e', mapped memory: a header {int32 pid, 4 zero bytes, uint64
 *     handle size, uint64 number of handles} (native byte order), then one
 *     int32 per handle: the sender's file descriptor of it. The handles are
 *     those that cover the block, in address order; the offset counts from
 *     the first one's start.
 *   Exactly 64 bytes with no version: a bare cudaIpcMemHandle_t (older
 *   PyTorch).
 * A newer version is refused with a message saying so, as PyTorch does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "segments/segments.h"

enum { WIRE_VERSION = 2, KIND_MALLOC = 'c', KIND_MAPPED = 'e', WIRE_HEADER = 24, WIRE_PREFIX = 2 };
enum { FABRIC_HANDLE_BYTES = 64 };

/* Memory of another process mapped here. */
struct ta_ipc_opening {
  unsigned char *key;  /* the bytes it was opened with: opening them again finds it */
  size_t key_len;
  uintptr_t addr;      /* where it is mapped */
  int kind;            /* KIND_MALLOC or KIND_MAPPED */
  size_t handle;       /* KIND_MAPPED: bytes per imported handle */
  size_t nhandles;
  uint64_t *handles;   /* KIND_MAPPED: the imported handles, in address order */
  int users;           /* opens not yet closed; 0: waiting to be unmapped (a capture forbade the synchronize) */
};

/* ------------------------------------------------------------------------
 * The wire format
 * ---------------------------------------------------------------------- */

typedef struct wire_header {
  int32_t pid;
  uint32_t zero; /* PyTorch zeroes the padding: the bytes are a cache key on the receiving side */
  uint64_t handle;
  uint64_t nhandles;
} wire_header;

_Static_assert(sizeof(wire_header) == WIRE_HEADER, "the header is PyTorch's ShareHeader on LP64");

/* ------------------------------------------------------------------------
 * Sending
 * ---------------------------------------------------------------------- */

int ta_segments_ipc_share(ta_segments *s, ta_segment *seg, const ta_block *block, uintptr_t ptr,
                          unsigned char *buf, size_t cap, size_t *len, size_t *offset, char *why, size_t whylen) {
  const ta_backend_ops *ops = s->backend->ops;
  if (!seg->expansion) {
    *len = WIRE_PREFIX + TA_IPC_BASE_HANDLE_BYTES;
    *offset = ptr - seg->addr;
    if (cap < *len) return TA_OK;
    buf[0] = WIRE_VERSION;
    buf[1] = KIND_MALLOC;
    return ops->ipc_base_handle(s->backend, s->device, seg->addr, buf + WIRE_PREFIX, why, whylen);
  }
  const ta_expansion *x = seg->expansion;
  size_t first = (block->addr - seg->addr) / x->granule;
  size_t end = ta_align_up(block->addr + block->size - seg->addr, x->granule) / x->granule;
  *len = WIRE_PREFIX + WIRE_HEADER + (end - first) * sizeof(int32_t);
  *offset = ptr - (seg->addr + first * x->granule);
  if (cap < *len) return TA_OK;
  for (size_t g = first; g < end; g++) /* runs of granules become a handle a granule (segments_runs.c) */
    if (x->run[g]) {
      size_t released = 0;
      if (ta_runs_break(s, seg, first, end, &released, why, whylen) != TA_OK) return TA_EDEVICE;
      break;
    }
  wire_header header = {.pid = (int32_t)getpid(), .handle = x->granule, .nhandles = end - first};
  buf[0] = WIRE_VERSION;
  buf[1] = KIND_MAPPED;
  memcpy(buf + WIRE_PREFIX, &header, sizeof header);
  for (size_t g = first; g < end; g++) {
    if (x->handles[g] == TA_HANDLE_SPLIT) { /* PyTorch's format has one handle size a segment */
      snprintf(why, whylen, "the block lies on a granule mapped in %zu-byte pieces near the device's capacity, "
               "which PyTorch's IPC format cannot describe", x->granule / x->split_pieces);
      return TA_EDEVICE;
    }
    if (!x->handles[g] || x->lent[g]) { /* a live block's granules are mapped and its own: a broken invariant */
      snprintf(why, whylen, "granule %zu of the segment at %#lx is not mapped here", g, (unsigned long)seg->addr);
      return TA_EDEVICE;
    }
    int fd = -1;
    int rc = ops->ipc_export(s->backend, s->device, x->handles[g], &fd, why, whylen);
    if (rc != TA_OK) return rc;
    int32_t wire_fd = fd;
    memcpy(buf + WIRE_PREFIX + WIRE_HEADER + (g - first) * sizeof wire_fd, &wire_fd, sizeof wire_fd);
  }
  return TA_OK;
}

/* ------------------------------------------------------------------------
 * Receiving
 * ---------------------------------------------------------------------- */

/* What the bytes say: the kind, and for KIND_MAPPED the header and where
 * the descriptors start. TA_OK, or TA_EDEVICE with the reason. */
static int decode(const unsigned char *bytes, size_t len, int *kind, const unsigned char **payload,
                  wire_header *header, char *why, size_t whylen) {
  if (len == TA_IPC_BASE_HANDLE_BYTES) { /* a bare cudaIpcMemHandle_t */
    *kind = KIND_MALLOC;
    *payload = bytes;
    return TA_OK;
  }
  if (len < WIRE_PREFIX) {
    snprintf(why, whylen, "a CUDA IPC handle of %zu bytes is too short", len);
    return TA_EDEVICE;
  }
  if (bytes[0] > WIRE_VERSION || bytes[0] == 0) {
    snprintf(why, whylen, "a CUDA IPC handle of version %d: this torchalloc reads versions 1 to %d (the sender runs "
             "a newer PyTorch or torchalloc)", bytes[0], WIRE_VERSION);
    return TA_EDEVICE;
  }
  *kind = bytes[1];
  *payload = bytes + WIRE_PREFIX;
  if (*kind == KIND_MALLOC) {
    if (len == WIRE_PREFIX + TA_IPC_BASE_HANDLE_BYTES) return TA_OK;
  } else if (*kind == KIND_MAPPED && len >= WIRE_PREFIX + WIRE_HEADER) {
    memcpy(header, *payload, sizeof *header);
    *payload += WIRE_HEADER;
    size_t rest = len - WIRE_PREFIX - WIRE_HEADER;
    if (header->nhandles > 0 && header->nhandles <= rest / FABRIC_HANDLE_BYTES &&
        rest == header->nhandles * FABRIC_HANDLE_BYTES) {
      snprintf(why, whylen, "the sender shared fabric handles (CU_MEM_HANDLE_TYPE_FABRIC), which torchalloc does not "
               "import: send from a process whose expandable segments use file descriptors, or expandable:off");
      return TA_EDEVICE;
    }
    if (header->nhandles > 0 && rest == header->nhandles * sizeof(int32_t)) return TA_OK;
  }
  snprintf(why, whylen, "a malformed CUDA IPC handle (%zu bytes, kind %#x)", len, *kind);
  return TA_EDEVICE;
}

/* Room for one more opening, made before anything is mapped. */
static int room_for_one(ta_segments *s) {
  return ta_grow(&s->ipc_opened, &s->cap_ipc_opened, s->nipc_opened + 1, 8);
}

/* Map the handles another process exported: addresses of their own, the
 * handles imported and mapped there, access for this device and its peers. */
static int open_mapped(ta_segments *s, const wire_header *h, const unsigned char *payload, ta_ipc_opening *o,
                       char *why, size_t whylen) {
  const ta_backend_ops *ops = s->backend->ops;
  if (!s->granule || h->handle == 0 || h->handle % s->granule || h->nhandles > ((size_t)1 << 40) / h->handle) {
    snprintf(why, whylen, s->granule ? "a CUDA IPC handle of %llu-byte pages, not a multiple of device %d's %zu-byte "
                                       "granule (or over 1 TiB in all)"
                                     : "a CUDA IPC handle of mapped memory (%llu-byte pages), but device %d has no "
                                       "virtual memory management (granule %zu)",
             (unsigned long long)h->handle, s->device, s->granule);
    return TA_EDEVICE;
  }
  size_t n = (size_t)h->nhandles, bytes = n * (size_t)h->handle;
  int *fds = malloc(n * sizeof *fds);
  uint64_t *handles = calloc(n, sizeof *handles);
  uintptr_t addr = 0;
  int rc = TA_EDEVICE;
  if (!fds || !handles) {
    snprintf(why, whylen, "out of host memory");
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    int32_t fd;
    memcpy(&fd, payload + i * sizeof fd, sizeof fd);
    fds[i] = fd;
  }
  if (ops->reserve(s->backend, s->device, bytes, &addr) != TA_OK) {
    snprintf(why, whylen, "cannot reserve %zu bytes of addresses on device %d", bytes, s->device);
    goto done;
  }
  if (ops->ipc_import(s->backend, s->device, h->pid, fds, n, (size_t)h->handle, handles, why, whylen) != TA_OK) {
    ops->unreserve(s->backend, s->device, addr, bytes);
    goto done;
  }
  if (ops->remap(s->backend, s->device, addr, bytes, (size_t)h->handle, handles, s->peers) != TA_OK) {
    snprintf(why, whylen, "mapping %zu bytes of process %d's memory on device %d failed", bytes, (int)h->pid,
             s->device);
    ops->release(s->backend, s->device, handles, n);
    ops->unreserve(s->backend, s->device, addr, bytes);
    goto done;
  }
  *o = (ta_ipc_opening){.addr = addr, .kind = KIND_MAPPED, .handle = (size_t)h->handle, .nhandles = n,
                        .handles = handles};
  handles = NULL;
  rc = TA_OK;
done:
  free(fds);
  free(handles);
  return rc;
}

/* Unmap `o` (the device is past every use of it). */
static void unmap_opening(ta_segments *s, ta_ipc_opening *o) {
  const ta_backend_ops *ops = s->backend->ops;
  if (o->kind == KIND_MALLOC) {
    ops->ipc_close_base(s->backend, s->device, o->addr);
  } else {
    ops->unmap(s->backend, s->device, o->addr, o->nhandles * o->handle, o->handle, o->handles, 1);
    ops->unreserve(s->backend, s->device, o->addr, o->nhandles * o->handle);
  }
  free(o->key);
  free(o->handles);
}

static void forget_opening(ta_segments *s, size_t i) {
  unmap_opening(s, &s->ipc_opened[i]);
  s->ipc_opened[i] = s->ipc_opened[--s->nipc_opened];
}

/* Openings whose last user is gone, once nothing forbids waiting for the
 * device: the receiver's kernels may still read them until then. */
static void sweep(ta_segments *s) {
  int synced = 0;
  for (size_t i = s->nipc_opened; i-- > 0;) {
    if (s->ipc_opened[i].users > 0) continue;
    if (s->no_sync) return; /* a capture may be underway: later */
    if (!synced) {
      ta_segments_synchronize(s);
      synced = 1;
    }
    forget_opening(s, i);
  }
}

int ta_segments_ipc_open(ta_segments *s, const unsigned char *handle, size_t len, uintptr_t *out, char *why,
                         size_t whylen) {
  for (size_t i = 0; i < s->nipc_opened; i++) {
    ta_ipc_opening *o = &s->ipc_opened[i];
    if (o->key_len == len && memcmp(o->key, handle, len) == 0) { /* CUDA opens a memory handle once a process */
      o->users++;
      *out = o->addr;
      return TA_OK;
    }
  }
  if (s->no_sync) { /* mapping (or cudaIpcOpenMemHandle) would invalidate a capture */
    snprintf(why, whylen, "a CUDA graph capture or a MemPool context is open on device %d: open memory of another "
             "process before it or after it", s->device);
    return TA_EDEVICE;
  }
  int kind = 0;
  const unsigned char *payload = NULL;
  wire_header header = {0};
  if (decode(handle, len, &kind, &payload, &header, why, whylen) != TA_OK) return TA_EDEVICE;
  ta_ipc_opening o = {0};
  if (room_for_one(s)) {
    snprintf(why, whylen, "out of host memory");
    return TA_EDEVICE;
  }
  if (kind == KIND_MALLOC) {
    uintptr_t addr = 0;
    if (s->backend->ops->ipc_open_base(s->backend, s->device, payload, &addr, why, whylen) != TA_OK) return TA_EDEVICE;
    o = (ta_ipc_opening){.addr = addr, .kind = KIND_MALLOC};
  } else if (open_mapped(s, &header, payload, &o, why, whylen) != TA_OK) {
    return TA_EDEVICE;
  }
  if ((o.key = malloc(len)) == NULL) {
    snprintf(why, whylen, "out of host memory");
    unmap_opening(s, &o);
    return TA_EDEVICE;
  }
  memcpy(o.key, handle, len);
  o.key_len = len;
  o.users = 1;
  s->ipc_opened[s->nipc_opened++] = o;
  *out = o.addr;
  return TA_OK;
}

int ta_segments_ipc_close(ta_segments *s, uintptr_t addr) {
  for (size_t i = 0; i < s->nipc_opened; i++) {
    ta_ipc_opening *o = &s->ipc_opened[i];
    if (o->addr != addr || o->users == 0) continue;
    o->users--;
    sweep(s);
    return 1;
  }
  return 0;
}

size_t ta_segments_ipc_open_count(const ta_segments *s) { return s->nipc_opened; }

int ta_segments_ipc_grant(ta_segments *s, uint64_t peers) {
  int rc = TA_OK;
  for (size_t i = 0; i < s->nipc_opened; i++) {
    const ta_ipc_opening *o = &s->ipc_opened[i];
    if (o->kind == KIND_MAPPED && s->backend->ops->grant(s->backend, s->device, o->addr, o->nhandles * o->handle,
                                                         peers) != TA_OK)
      rc = TA_EDEVICE;
  }
  return rc;
}

void ta_segments_ipc_teardown(ta_segments *s) {
  while (s->nipc_opened) forget_opening(s, s->nipc_opened - 1);
  free(s->ipc_opened);
  s->ipc_opened = NULL;
  s->cap_ipc_opened = 0;
}
