/* Peer access and CUDA IPC for one device's heap (heap_share.h): the
 * heap's lock around the segment layer's work. */
#include "heap/heap_share.h"

#include <stdio.h>

int ta_heap_grant_peer(ta_heap *h, int peer, char *why, size_t whylen) {
  ta_backend *b = h->seg.backend;
  if (peer == h->device) return 0; /* a device always reaches its own memory */
  if (peer < 0 || peer >= 64 || peer >= b->ops->device_count(b)) {
    snprintf(why, whylen, "device %d does not exist (peer access to device %d)", peer, h->device);
    return -1;
  }
  if (!b->ops->peer_capable(b, h->device, peer)) {
    snprintf(why, whylen, "device %d cannot reach device %d's memory (no peer-to-peer path): copies between them go "
             "through the host", peer, h->device);
    return -1;
  }
  ta_lock_acquire(&h->lock);
  int rc = ta_segments_grant(&h->seg, (uint64_t)1 << peer);
  ta_lock_release(&h->lock);
  if (rc != TA_OK) snprintf(why, whylen, "the driver refused device %d access to device %d's memory", peer, h->device);
  return rc == TA_OK ? 0 : -1;
}

int ta_heap_peer_granted(ta_heap *h, int peer) {
  ta_lock_acquire(&h->lock);
  int yes = peer == h->device || (peer >= 0 && peer < 64 && (h->seg.peers >> peer & 1));
  ta_lock_release(&h->lock);
  return yes;
}

/* The live block holding `addr`, or NULL. */
static ta_block *live_block_at(ta_segment *seg, uintptr_t addr) {
  for (ta_block *b = seg->first; b; b = b->next)
    if (addr >= b->addr && addr < b->addr + b->size) return b->state == TA_BLOCK_LIVE ? b : NULL;
  return NULL;
}

int ta_heap_ipc_share(ta_heap *h, uintptr_t ptr, unsigned char *buf, size_t cap, size_t *len, size_t *offset,
                      int *rc, char *why, size_t whylen) {
  ta_lock_acquire(&h->lock);
  ta_segment *seg = ta_segments_find(&h->seg, ptr);
  ta_block *b = seg ? live_block_at(seg, ptr) : NULL;
  if (b) *rc = ta_segments_ipc_share(&h->seg, seg, b, ptr, buf, cap, len, offset, why, whylen) == TA_OK ? 0 : -1;
  ta_lock_release(&h->lock);
  return b != NULL;
}

int ta_heap_ipc_open(ta_heap *h, const unsigned char *handle, size_t len, uintptr_t *out, char *why, size_t whylen) {
  ta_lock_acquire(&h->lock);
  int rc = ta_segments_ipc_open(&h->seg, handle, len, out, why, whylen);
  ta_lock_release(&h->lock);
  return rc == TA_OK ? 0 : -1;
}

int ta_heap_ipc_close(ta_heap *h, uintptr_t addr) {
  ta_lock_acquire(&h->lock);
  int found = ta_segments_ipc_close(&h->seg, addr);
  ta_lock_release(&h->lock);
  return found;
}

size_t ta_heap_ipc_open_count(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  size_t n = ta_segments_ipc_open_count(&h->seg);
  ta_lock_release(&h->lock);
  return n;
}
