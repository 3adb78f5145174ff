/* The arena (arena.h): split on malloc, coalesce on free, per-stream bins. */
#include "arena.h"

#include <stdlib.h>

#include "size_classes.h"

ta_arena *ta_arena_create(ta_segments *segments, ta_policy *policy) {
  ta_arena *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->segments = segments;
  a->policy = policy;
  return a;
}

static void own(ta_arena *a, ta_segment *s) {
  s->owner_prev = NULL;
  s->owner_next = a->owned;
  if (a->owned) a->owned->owner_prev = s;
  a->owned = s;
  a->reserved += s->size;
}

static void disown(ta_arena *a, ta_segment *s) {
  if (s->owner_prev) s->owner_prev->owner_next = s->owner_next;
  else a->owned = s->owner_next;
  if (s->owner_next) s->owner_next->owner_prev = s->owner_prev;
  a->reserved -= s->size;
}

static ta_noinline ta_stream_bins *add_stream(ta_arena *a, cudaStream_t stream) {
  if (a->nstreams == a->cap_streams) {
    size_t cap = a->cap_streams ? a->cap_streams * 2 : 4;
    ta_stream_bins *s = realloc(a->streams, cap * sizeof *s);
    if (!s) return NULL;
    a->streams = s;
    a->cap_streams = cap;
  }
  ta_stream_bins *s = &a->streams[a->nstreams];
  s->stream = stream;
  s->pool[0] = NULL;
  s->pool[TA_POOL_SMALL] = calloc(1, sizeof(ta_bins));
  s->pool[TA_POOL_LARGE] = calloc(1, sizeof(ta_bins));
  if (!s->pool[TA_POOL_SMALL] || !s->pool[TA_POOL_LARGE]) {
    free(s->pool[TA_POOL_SMALL]);
    free(s->pool[TA_POOL_LARGE]);
    return NULL;
  }
  a->last = a->nstreams++;
  return s;
}

/* The free index of `stream`; created on first use. NULL only when host
 * memory runs out. Linear search: a process uses a handful of streams. */
static inline ta_bins *bins_for(ta_arena *a, cudaStream_t stream, int pool) {
  if (ta_likely(a->nstreams && a->streams[a->last].stream == stream)) return a->streams[a->last].pool[pool];
  for (size_t i = 0; i < a->nstreams; i++) {
    if (a->streams[i].stream == stream) {
      a->last = i;
      return a->streams[i].pool[pool];
    }
  }
  ta_stream_bins *s = add_stream(a, stream);
  return s ? s->pool[pool] : NULL;
}

/* Every block enters and leaves a free index through these two, so the
 * inactive_split stats follow from the block's shape at that moment. */
static inline void put_free(ta_arena *a, ta_bins *bins, ta_block *b) {
  b->state = TA_BLOCK_FREE;
  ta_bins_insert(bins, b);
  if (ta_block_is_split(b)) ta_segments_note_inactive_split(a->segments, b, +1);
}

static inline void take_free(ta_arena *a, ta_bins *bins, ta_block *b) {
  ta_bins_remove(bins, b);
  if (ta_block_is_split(b)) ta_segments_note_inactive_split(a->segments, b, -1);
}

/* Cut `b` (out of the index) after its first `keep` bytes; the rest, in the
 * descriptor `rest`, becomes a free block of the index. */
static inline void split_after(ta_arena *a, ta_bins *bins, ta_block *b, size_t keep, ta_block *rest) {
  *rest = *b;
  rest->addr = b->addr + keep;
  rest->size = b->size - keep;
  rest->prev = b;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  b->size = keep;
  put_free(a, bins, rest);
}

ta_block *ta_arena_malloc(ta_arena *a, size_t size, cudaStream_t stream) {
  size_t rounded = ta_round_size(size);
  int pool = ta_pool_for(rounded);
  ta_bins *bins = bins_for(a, stream, pool);
  if (ta_unlikely(!bins)) return NULL;
  ta_block *b = ta_bins_find(bins, rounded);
  if (b) {
    take_free(a, bins, b);
  } else {
    ta_segment *seg = ta_segments_alloc(a->segments, ta_segment_size_for(rounded), stream, pool, a, a->policy);
    if (!seg) return NULL;
    own(a, seg);
    b = seg->first;
  }
  if (ta_should_split(b->size, rounded, pool)) {
    ta_block *rest = ta_segments_block_new(a->segments);
    if (ta_likely(rest != NULL)) split_after(a, bins, b, rounded, rest); /* without host memory: whole */
  }
  b->state = TA_BLOCK_LIVE;
  return b;
}

ta_block *ta_arena_claim(ta_arena *a, ta_segment *seg, uintptr_t addr, size_t size) {
  if (seg->owner != a || size == 0 || size % 512 || addr < seg->addr || addr + size > seg->addr + seg->size) return NULL;
  ta_block *b = seg->first;
  while (b && b->addr + b->size <= addr) b = b->next;
  if (!b || b->state != TA_BLOCK_FREE || addr + size > b->addr + b->size) return NULL;
  ta_bins *bins = bins_for(a, b->stream, seg->pool);
  int free_before = addr > b->addr, free_after = addr + size < b->addr + b->size;
  /* Both descriptors first: a failure must leave the segment as it was. */
  ta_block *claimed = free_before ? ta_segments_block_new(a->segments) : b;
  ta_block *after = free_after ? ta_segments_block_new(a->segments) : NULL;
  if (!bins || !claimed || (free_after && !after)) {
    if (claimed && claimed != b) ta_segments_block_delete(a->segments, claimed);
    if (after) ta_segments_block_delete(a->segments, after);
    return NULL;
  }
  take_free(a, bins, b);
  if (free_before) { /* b keeps the free bytes before the range */
    split_after(a, bins, b, addr - b->addr, claimed);
    take_free(a, bins, claimed);
    put_free(a, bins, b); /* re-indexed: it is split now */
  }
  if (free_after) split_after(a, bins, claimed, size, after);
  claimed->state = TA_BLOCK_LIVE;
  return claimed;
}

void ta_arena_free(ta_arena *a, ta_block *b) {
  ta_bins *bins = bins_for(a, b->stream, ta_block_pool(b));
  ta_block *p = b->prev, *n = b->next;
  if (p && p->state == TA_BLOCK_FREE) {
    take_free(a, bins, p);
    b->addr = p->addr;
    b->size += p->size;
    b->prev = p->prev;
    if (p->prev) p->prev->next = b;
    else b->segment->first = b;
    ta_segments_block_delete(a->segments, p);
  }
  if (n && n->state == TA_BLOCK_FREE) {
    take_free(a, bins, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    ta_segments_block_delete(a->segments, n);
  }
  b->requested = 0;
  put_free(a, bins, b);
}

size_t ta_arena_release_cached(ta_arena *a) {
  size_t released = 0;
  for (ta_segment *s = a->owned, *next; s; s = next) {
    next = s->owner_next;
    ta_block *b = s->first;
    if (b->state != TA_BLOCK_FREE || b->next) continue;
    take_free(a, bins_for(a, s->stream, s->pool), b);
    released += s->size;
    disown(a, s);
    ta_segments_release(a->segments, s);
  }
  return released;
}

void ta_arena_destroy(ta_arena *a) {
  if (!a) return;
  ta_arena_release_cached(a);
  for (size_t i = 0; i < a->nstreams; i++) {
    free(a->streams[i].pool[TA_POOL_SMALL]);
    free(a->streams[i].pool[TA_POOL_LARGE]);
  }
  free(a->streams);
  free(a);
}
