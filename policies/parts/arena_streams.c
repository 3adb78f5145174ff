/* The arena's stream entries (arena.h's ta_stream_bins): one per stream
 * with segments in the arena, found through a hash index (a trace may name
 * tens of thousands of streams, most used once), dropped once the stream
 * has no segment here. */
#include "arena_streams.h"

#include <stdlib.h>


/* The index slot of `stream`'s entry, or the empty slot where it would go. */
static uint32_t *index_slot(const ta_arena *a, cudaStream_t stream) {
  size_t i = ta_stream_home(stream, a->index_mask);
  while (a->index[i] && a->streams[a->index[i] - 1].stream != stream) i = (i + 1) & a->index_mask;
  return &a->index[i];
}

/* Backward-shift deletion (no tombstones: entries come and go all the time). */
static void index_erase(ta_arena *a, uint32_t *slot) {
  size_t i = (size_t)(slot - a->index);
  for (size_t j = (i + 1) & a->index_mask; a->index[j]; j = (j + 1) & a->index_mask) {
    size_t home = ta_stream_home(a->streams[a->index[j] - 1].stream, a->index_mask);
    if (((j - home) & a->index_mask) >= ((j - i) & a->index_mask)) { /* j may move to i */
      a->index[i] = a->index[j];
      i = j;
    }
  }
  a->index[i] = 0;
}

/* Room for `cap` entries (> nstreams), the index rebuilt at twice that.
 * -1 without host memory (nothing changed). */
static int resize_streams(ta_arena *a, size_t cap) {
  uint32_t *index = calloc(2 * cap, sizeof *index);
  if (!index) return -1;
  if (ta_resize(&a->streams, cap)) {
    free(index);
    return -1;
  }
  a->cap_streams = cap;
  free(a->index);
  a->index = index;
  a->index_mask = 2 * cap - 1;
  for (size_t i = 0; i < a->nstreams; i++) *index_slot(a, a->streams[i].stream) = (uint32_t)i + 1;
  return 0;
}

ta_stream_bins *ta_arena_add_stream(ta_arena *a, cudaStream_t stream) {
  if (a->nstreams == a->cap_streams && resize_streams(a, a->cap_streams ? a->cap_streams * 2 : 4)) return NULL;
  ta_stream_bins *s = &a->streams[a->nstreams];
  *s = (ta_stream_bins){.stream = stream}; /* bins made on a pool's first use */
  *index_slot(a, stream) = (uint32_t)a->nstreams + 1;
  a->last = a->nstreams++;
  return s;
}

/* The index of `stream`'s entry; nstreams when it has none. */
size_t ta_arena_find_stream(const ta_arena *a, cudaStream_t stream) {
  if (a->nstreams && a->streams[a->last].stream == stream) return a->last;
  uint32_t slot = a->nstreams ? *index_slot(a, stream) : 0;
  return slot ? slot - 1 : a->nstreams;
}

/* Entry `i`'s stream has no segment here, so no block: its (empty) bins go
 * and the last entry takes its place; a burst of streams gone, the arrays
 * shrink. */
static void drop_stream(ta_arena *a, size_t i) {
  ta_stream_bins *s = &a->streams[i];
  ta_bins_destroy(s->pool[TA_POOL_SMALL]);
  ta_bins_destroy(s->pool[TA_POOL_LARGE]);
  index_erase(a, index_slot(a, s->stream));
  size_t moved = --a->nstreams;
  if (i != moved) {
    *s = a->streams[moved];
    *index_slot(a, s->stream) = (uint32_t)i + 1; /* found by its stream, at its old place */
  }
  if (a->last == i) a->last = 0;
  else if (a->last == moved) a->last = i;
  if (a->cap_streams > 64 && a->nstreams * 8 <= a->cap_streams) resize_streams(a, a->cap_streams / 2);
}

/* A stream that got bins but no segment (the device said no) leaves none behind. */
void ta_arena_drop_if_unused(ta_arena *a, cudaStream_t stream) {
  size_t i = ta_arena_find_stream(a, stream);
  if (i < a->nstreams && a->streams[i].segments == 0) drop_stream(a, i);
}

void ta_arena_own(ta_arena *a, ta_segment *s) {
  s->owner_prev = NULL;
  s->owner_next = a->owned;
  if (a->owned) a->owned->owner_prev = s;
  a->owned = s;
  size_t i = ta_arena_find_stream(a, s->stream); /* there: its request made it */
  if (i < a->nstreams) a->streams[i].segments++;
}

/* The caller is done with the segment's stream entry: it may go. */
void ta_arena_disown(ta_arena *a, ta_segment *s) {
  if (s->owner_prev) s->owner_prev->owner_next = s->owner_next;
  else a->owned = s->owner_next;
  if (s->owner_next) s->owner_next->owner_prev = s->owner_prev;
  size_t i = ta_arena_find_stream(a, s->stream);
  if (i < a->nstreams && --a->streams[i].segments == 0) drop_stream(a, i);
}
