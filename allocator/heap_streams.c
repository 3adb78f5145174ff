/* record_stream: blocks used on more streams than their own, and the frees
 * they defer until that work completes (heap.h). */
#include <stdio.h>
#include <stdlib.h>

#include "heap.h"
#include "misuse.h"

int ta_heap_record_stream(ta_heap *h, void *ptr, cudaStream_t stream) {
  ta_lock_acquire(&h->lock);
  ta_block *b = ta_ptrmap_get(&h->live, (uintptr_t)ptr);
  int found = b && b->state == TA_BLOCK_LIVE;
  if (found && stream != b->stream) {
    ta_stream_uses *u = b->uses;
    int seen = 0;
    for (int i = 0; u && i < u->count; i++) seen |= u->streams[i] == stream;
    if (!seen && (!u || u->count == u->cap)) {
      int cap = u ? u->cap * 2 : 4;
      ta_stream_uses *grown = realloc(u, sizeof *u + (size_t)cap * sizeof(cudaStream_t));
      if (grown) {
        if (!u) grown->count = 0;
        grown->cap = cap;
        b->uses = u = grown;
      } else {
        seen = 1;
        fprintf(stderr, "torchalloc: warning: out of host memory in record_stream(%p); the block may be reused "
                        "before that stream is done with it\n", ptr);
      }
    }
    if (!seen) u->streams[u->count++] = stream;
  }
  ta_lock_release(&h->lock);
  return found;
}

/* record_stream of a pointer that is not a live block of any device. */
void ta_heap_report_bad_record_stream(ta_heap *h, void *ptr) {
  ta_lock_acquire(&h->lock);
  h->stats.num_bad_free_unknown++;
  ta_lock_release(&h->lock);
  ta_misuse_report(h->conf->warn, TA_MISUSE_RECORD_STREAM_UNKNOWN,
                   "record_stream of %p, which is not a live torchalloc block; ignored", ptr);
}

/* Record an event on every stream that used `b`; the block is reused only
 * when they have all completed (ta_heap_process_pending). */
ta_noinline void ta_heap_defer_free(ta_heap *h, ta_block *b) {
  ta_backend *backend = h->seg.backend;
  ta_stream_uses *u = b->uses;
  b->uses = NULL;
  void **events = malloc((size_t)u->count * sizeof *events);
  int n = 0;
  for (int i = 0; events && i < u->count; i++) {
    void *ev = backend->ops->event_record(backend, h->device, u->streams[i]);
    if (!ev) break;
    events[n++] = ev;
  }
  int complete = events && n == u->count;
  free(u);
  if (complete && h->npending == h->cap_pending) {
    size_t cap = h->cap_pending ? h->cap_pending * 2 : 16;
    ta_pending_free *p = realloc(h->pending, cap * sizeof *p);
    if (p) {
      h->pending = p;
      h->cap_pending = cap;
    } else {
      complete = 0;
    }
  }
  if (!complete) { /* could not track the streams: wait for the device instead */
    for (int i = 0; i < n; i++) backend->ops->event_release(backend, h->device, events[i]);
    free(events);
    backend->ops->synchronize(backend, h->device);
    ta_heap_release_block(h, b);
    return;
  }
  b->state = TA_BLOCK_PENDING;
  ta_stats_add(h->pending_stats.count, ta_block_pool(b), 1);
  ta_stats_add(h->pending_stats.bytes, ta_block_pool(b), (int64_t)b->size);
  h->pending[h->npending++] = (ta_pending_free){.block = b, .nevents = n, .events = events};
}

ta_noinline void ta_heap_process_pending(ta_heap *h) {
  ta_backend *backend = h->seg.backend;
  for (size_t i = 0; i < h->npending;) {
    ta_pending_free *p = &h->pending[i];
    while (p->nevents > 0 && backend->ops->event_done(backend, h->device, p->events[p->nevents - 1]))
      backend->ops->event_release(backend, h->device, p->events[--p->nevents]);
    if (p->nevents > 0) {
      i++;
      continue;
    }
    free(p->events);
    ta_stats_sub(h->pending_stats.count, ta_block_pool(p->block), 1);
    ta_stats_sub(h->pending_stats.bytes, ta_block_pool(p->block), (int64_t)p->block->size);
    ta_heap_release_block(h, p->block);
    h->pending[i] = h->pending[--h->npending];
  }
}
