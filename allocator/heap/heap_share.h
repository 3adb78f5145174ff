/* Device memory shared beyond this heap (heap_share.c): with the other
 * GPUs of the process (peer access to mapped memory) and with other
 * processes (CUDA IPC). */
#ifndef TA_HEAP_SHARE_H
#define TA_HEAP_SHARE_H

#include "heap/heap_state.h"

/* Device `peer` may read and write this heap's memory from now on (its
 * mappings, old and new). 0, or -1 with the reason in `why`. */
ta_internal int ta_heap_grant_peer(ta_heap *h, int peer, char *why, size_t whylen) TA_EXCLUDES(h->lock);
/* 1 when `peer` may reach this heap's mapped memory now. */
ta_internal int ta_heap_peer_granted(ta_heap *h, int peer) TA_EXCLUDES(h->lock);

/* CUDA IPC (segments_ipc.c says the format). 1 when `ptr` lies in a live
 * block of this heap: then *rc is 0 with the bytes in buf (*len, the
 * length needed, even when over cap) and *offset, or -1 with the reason in
 * `why`. 0 when the heap holds no live block there. */
ta_internal int ta_heap_ipc_share(ta_heap *h, uintptr_t ptr, unsigned char *buf, size_t cap, size_t *len,
                                  size_t *offset, int *rc, char *why, size_t whylen) TA_EXCLUDES(h->lock);
ta_internal int ta_heap_ipc_open(ta_heap *h, const unsigned char *handle, size_t len, uintptr_t *out, char *why,
                                 size_t whylen) TA_EXCLUDES(h->lock);
/* 1 when `addr` was opened on this heap's device (one user fewer now). */
ta_internal int ta_heap_ipc_close(ta_heap *h, uintptr_t addr) TA_EXCLUDES(h->lock);
ta_internal size_t ta_heap_ipc_open_count(ta_heap *h) TA_EXCLUDES(h->lock);

#endif
