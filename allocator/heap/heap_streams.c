/* record_stream: blocks used on more streams than their own, and the frees
 * they defer until that work completes (heap.h). */
#include <stdio.h>
#include <stdlib.h>

#include "heap/heap_streams.h"
#include "accounting/misuse.h"

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

/* Record an event on every stream that used `p->block` (none when no other
 * stream did: it waited only for routing to end). Returns 0, or -1 when
 * they could not all be recorded (out of host memory or events). */
static int record_events(ta_heap *h, ta_pending_free *p) {
  ta_backend *backend = h->seg.backend;
  ta_stream_uses *u = p->block->uses;
  if (!u) {
    p->nevents = 0;
    return 0;
  }
  p->block->uses = NULL;
  void **events = malloc((size_t)u->count * sizeof *events);
  int n = 0;
  for (int i = 0; events && i < u->count; i++) {
    void *ev = backend->ops->event_record(backend, h->device, u->streams[i]);
    if (!ev) break;
    events[n++] = ev;
  }
  int complete = events && n == u->count;
  free(u);
  if (!complete) {
    for (int i = 0; i < n; i++) backend->ops->event_release(backend, h->device, events[i]);
    free(events);
    return -1;
  }
  p->events = events;
  p->nevents = n;
  return 0;
}

/* The block waits in the pending list (stats count it as active). */
static int add_pending(ta_heap *h, ta_block *b) {
  if (h->npending == h->cap_pending) {
    size_t cap = h->cap_pending ? h->cap_pending * 2 : 16;
    ta_pending_free *p = realloc(h->pending, cap * sizeof *p);
    if (!p) return -1;
    h->pending = p;
    h->cap_pending = cap;
  }
  b->state = TA_BLOCK_PENDING;
  ta_stats_add(h->pending_stats.count, ta_block_pool(b), 1);
  ta_stats_add(h->pending_stats.bytes, ta_block_pool(b), (int64_t)b->size);
  h->pending[h->npending++] = (ta_pending_free){.block = b, .nevents = -1, .events = NULL};
  return 0;
}

static void remove_pending(ta_heap *h, size_t i) {
  ta_block *b = h->pending[i].block;
  free(h->pending[i].events);
  ta_stats_sub(h->pending_stats.count, ta_block_pool(b), 1);
  ta_stats_sub(h->pending_stats.bytes, ta_block_pool(b), (int64_t)b->size);
  h->pending[i] = h->pending[--h->npending];
}

/* Tracking failed (host memory, events): wait for the device instead, then
 * the block is free to reuse. While routing a synchronize would break a
 * capture, so the block is released at once with a warning. */
static void release_untracked(ta_heap *h, ta_block *b) {
  free(b->uses);
  b->uses = NULL;
  b->state = TA_BLOCK_LIVE;
  if (h->routing)
    fprintf(stderr, "torchalloc: warning: out of host memory while a CUDA graph capture may be underway; a "
                    "record_stream block is reused without waiting for its other streams\n");
  else
    ta_segments_synchronize(&h->seg);
  ta_heap_release_block(h, b);
}

/* The block is reused only when the work queued on every stream that used
 * it has completed (ta_heap_process_pending). While routing, recording the
 * events has to wait (ta_heap_record_deferred_events); so does a block that
 * waits only for routing to end (no other streams). */
ta_noinline void ta_heap_defer_free(ta_heap *h, ta_block *b) {
  if (add_pending(h, b) != 0) {
    release_untracked(h, b);
  } else if (!h->routing && record_events(h, &h->pending[h->npending - 1]) != 0) {
    remove_pending(h, h->npending - 1);
    release_untracked(h, b);
  }
}

void ta_heap_record_deferred_events(ta_heap *h) {
  /* Entries whose events were recorded now with none outstanding are handed
   * back by the next ta_heap_process_pending. */
  for (size_t i = 0; i < h->npending;) {
    ta_pending_free *p = &h->pending[i];
    if (p->nevents >= 0 || record_events(h, p) == 0) {
      i++;
      continue;
    }
    ta_block *b = p->block;
    remove_pending(h, i);
    release_untracked(h, b);
  }
}

ta_noinline void ta_heap_process_pending(ta_heap *h) {
  ta_assert(!h->routing);
  ta_backend *backend = h->seg.backend;
  for (size_t i = 0; i < h->npending;) {
    ta_pending_free *p = &h->pending[i];
    while (p->nevents > 0 && backend->ops->event_done(backend, h->device, p->events[p->nevents - 1]))
      backend->ops->event_release(backend, h->device, p->events[--p->nevents]);
    if (p->nevents != 0 || (p->block->segment->policy_instance->ops->frees_to_device &&
                            ta_heap_capture_anywhere(h))) { /* events outstanding or not yet recorded; or a
                                                              * device free while another device captures */
      i++;
      continue;
    }
    ta_block *b = p->block;
    remove_pending(h, i);
    ta_heap_release_block(h, b);
  }
}
