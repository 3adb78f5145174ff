/* record_stream: blocks used on more streams than their own, and the frees
 * they defer until that work completes (heap.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static int record_events(ta_heap *h, ta_pending_free *p) TA_REQUIRES(h->lock) {
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
static int add_pending(ta_heap *h, ta_block *b) TA_REQUIRES(h->lock) {
  if (ta_grow(&h->pending, &h->cap_pending, h->npending + 1, 16)) return -1;
  b->state = TA_BLOCK_PENDING;
  ta_stats_add(h->pending_stats.count, ta_block_pool(b), 1);
  ta_stats_add(h->pending_stats.bytes, ta_block_pool(b), (int64_t)b->size);
  h->pending[h->npending++] = (ta_pending_free){.block = b, .nevents = -1};
  return 0;
}

static void remove_pending(ta_heap *h, size_t i) TA_REQUIRES(h->lock) {
  ta_block *b = h->pending[i].block;
  free(h->pending[i].events);
  free(h->pending[i].markers);
  ta_stats_sub(h->pending_stats.count, ta_block_pool(b), 1);
  ta_stats_sub(h->pending_stats.bytes, ta_block_pool(b), (int64_t)b->size);
  h->pending[i] = h->pending[--h->npending];
}

/* Tracking failed (host memory, events): wait for the device instead, then
 * the block is free to reuse. While routing a synchronize would break a
 * capture, so the block is released at once with a warning. */
static void release_untracked(ta_heap *h, ta_block *b) TA_REQUIRES(h->lock) {
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

/* ------------------------------------------------------------------------
 * graph_capture_record_stream_reuse: inside a CUDA graph capture no event
 * may be recorded or queried, so a block freed after record_stream would
 * wait for the capture's end. PyTorch's option (c10/cuda/CUDACachingAllocator.cpp,
 * free_safe_blocks_in_capture) reads the capture's topology instead: at the
 * free, the nodes that are the last captured work of each stream that used
 * the block (the markers); at a later request on the block's own stream,
 * the block is reused once every marker precedes that stream's next work,
 * that is, once the graph joined those streams back into it. Work captured
 * after that depends on every use of the block; before it, a kernel of the
 * other stream may still run alongside the new use, so the block waits.
 * ---------------------------------------------------------------------- */

#define FRONTIER_GUESS 64

/* Append `stream`'s capture frontier to (*nodes, *n, *cap). 1 while it
 * captures, 0 when it does not, -1 on error or without host memory. */
static int append_frontier(ta_heap *h, cudaStream_t stream, uint64_t **nodes, size_t *n, size_t *cap)
    TA_REQUIRES(h->lock) {
  ta_backend *backend = h->seg.backend;
  uint64_t guess[FRONTIER_GUESS];
  size_t count = 0;
  int rc = backend->ops->capture_frontier(backend, h->device, stream, guess, FRONTIER_GUESS, &count);
  if (rc != 1) return rc;
  if (ta_grow(nodes, cap, *n + count, 2 * (*n + count))) return -1;
  if (count == 0) return 1; /* a capture with nothing in it yet */
  if (count <= FRONTIER_GUESS) memcpy(*nodes + *n, guess, count * sizeof *guess);
  else if (backend->ops->capture_frontier(backend, h->device, stream, *nodes + *n, count, &count) != 1) return -1;
  *n += count;
  return 1;
}

/* At the free: the markers of pending entry `p`, from its block's stream
 * and every stream it was used on. Any of them not capturing (or the
 * backend unable to say) leaves none: the block waits for the capture's
 * end, as without the option. */
static void mark_capture_frontiers(ta_heap *h, ta_pending_free *p) TA_REQUIRES(h->lock) {
  ta_backend *backend = h->seg.backend;
  if (!backend->ops->capture_frontier || !backend->ops->node_dependencies ||
      p->block->segment->policy_instance->ops->frees_to_device) /* its free would be a cudaFree: not now */
    return;
  uint64_t *nodes = NULL;
  size_t n = 0, cap = 0;
  int ok = append_frontier(h, p->block->stream, &nodes, &n, &cap) == 1;
  for (int i = 0; ok && i < p->block->uses->count; i++)
    ok = append_frontier(h, p->block->uses->streams[i], &nodes, &n, &cap) == 1;
  if (!ok || n == 0) {
    free(nodes);
    return;
  }
  p->markers = nodes;
  p->nmarkers = n;
}

/* A set of graph nodes (never 0), open addressing. */
typedef struct node_set {
  uint64_t *slots;
  size_t cap, count; /* cap: a power of 2, kept at least twice count */
} node_set;

static size_t slot_of(const node_set *s, uint64_t node) {
  size_t i = (size_t)(node * 0x9E3779B97F4A7C15ull) & (s->cap - 1);
  while (s->slots[i] && s->slots[i] != node) i = (i + 1) & (s->cap - 1);
  return i;
}

static int set_has(const node_set *s, uint64_t node) { return s->cap && s->slots[slot_of(s, node)] == node; }

/* 1 when added, 0 when there already, -1 without host memory. */
static int set_add(node_set *s, uint64_t node) {
  if (2 * (s->count + 1) > s->cap) {
    node_set grown = {calloc(s->cap ? s->cap * 2 : 64, sizeof(uint64_t)), s->cap ? s->cap * 2 : 64, 0};
    if (!grown.slots) return -1;
    for (size_t i = 0; i < s->cap; i++)
      if (s->slots[i]) grown.slots[slot_of(&grown, s->slots[i])] = s->slots[i], grown.count++;
    free(s->slots);
    *s = grown;
  }
  size_t i = slot_of(s, node);
  if (s->slots[i]) return 0;
  s->slots[i] = node;
  s->count++;
  return 1;
}

/* Every node `stream`'s next captured work will come after: its frontier
 * and all they depend on. 0, or -1 (not capturing, an error, no memory). */
static int preceding_nodes(ta_heap *h, cudaStream_t stream, node_set *seen) TA_REQUIRES(h->lock) {
  ta_backend *backend = h->seg.backend;
  uint64_t *todo = NULL, deps[FRONTIER_GUESS];
  size_t n = 0, cap = 0;
  int rc = append_frontier(h, stream, &todo, &n, &cap) == 1 ? 0 : -1;
  while (rc == 0 && n) {
    uint64_t node = todo[--n];
    int added = set_add(seen, node);
    if (added <= 0) {
      rc = added; /* 0: seen already, and what it depends on with it */
      continue;
    }
    size_t count = 0;
    if (backend->ops->node_dependencies(backend, h->device, node, deps, FRONTIER_GUESS, &count) != 0) rc = -1;
    if (rc == 0 && ta_grow(&todo, &cap, n + count, 2 * (n + count))) rc = -1;
    if (rc == 0 && count == 0) continue; /* the capture's first node */
    if (rc == 0 && count <= FRONTIER_GUESS) memcpy(todo + n, deps, count * sizeof *deps);
    else if (rc == 0 && backend->ops->node_dependencies(backend, h->device, node, todo + n, count, &count)) rc = -1;
    if (rc == 0) n += count;
  }
  free(todo);
  return rc;
}

void ta_heap_reuse_in_capture(ta_heap *h, cudaStream_t stream) {
  int waiting = 0;
  for (size_t i = 0; i < h->npending && !waiting; i++)
    waiting = h->pending[i].markers && h->pending[i].block->stream == stream;
  if (!waiting) return;
  node_set seen = {0};
  if (preceding_nodes(h, stream, &seen) == 0) {
    for (size_t i = 0; i < h->npending;) {
      ta_pending_free *p = &h->pending[i];
      size_t m = 0;
      while (p->markers && p->block->stream == stream && m < p->nmarkers && set_has(&seen, p->markers[m])) m++;
      if (!p->markers || p->block->stream != stream || m < p->nmarkers) {
        i++;
        continue;
      }
      ta_block *b = p->block; /* the graph orders every use of it before what comes next: no event needed */
      free(b->uses);
      b->uses = NULL;
      remove_pending(h, i);
      ta_heap_release_block(h, b);
    }
  }
  free(seen.slots);
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
  } else if (h->routing && h->capture_reuse && b->uses) {
    mark_capture_frontiers(h, &h->pending[h->npending - 1]);
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
