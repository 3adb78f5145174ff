/* Per-stream progress markers (services.h, reclaim): how the allocator knows,
 * without waiting, that the device is past the last use of freed memory.
 *
 * Why: unmapping memory does not wait for the kernels queued on it (measured
 * on the H100: cuMemUnmap returns while a kernel runs), so memory freed by
 * the program may be unmapped or handed to another stream only once the
 * device got past the work queued before the free. A device synchronize
 * tells that by waiting for everything; a marker tells it for one stream at
 * the cost of an event, asked without waiting.
 *
 * Each stream has an epoch. A free stamps the block with it; every
 * TA_MARK_EVERY frees (and at each reclaim pass) an event is recorded on the
 * stream, covering every stamp so far, and the epoch moves on. When the
 * event completes, `done` reaches the epoch it covered: a block stamped at
 * or below is past. One event in flight per stream keeps the cost bounded.
 * No event is recorded or queried while a capture may be underway (either
 * would invalidate it).
 *
 * A program may use tens of thousands of streams, most once: the markers
 * are found by a hash of the stream, a reclaim pass asks only the streams
 * freed on or waiting for a marker (the active list), and a stream's
 * markers go with the last segment that uses them. */
#include <stdlib.h>

#include "segments/segments.h"

/* ------------------------------------------------------------------------
 * The index: open addressing on the stream, backward-shift deletion.
 * ---------------------------------------------------------------------- */

/* The slot holding `stream`'s markers, or the empty slot where they would go. */
static ta_stream_marks **slot_of(const ta_segments *s, cudaStream_t stream) {
  size_t i = ta_stream_home(stream, s->marks_mask);
  while (s->marks[i] && s->marks[i]->stream != stream) i = (i + 1) & s->marks_mask;
  return &s->marks[i];
}

static void erase_slot(ta_segments *s, ta_stream_marks **slot) {
  size_t i = (size_t)(slot - s->marks);
  for (size_t j = (i + 1) & s->marks_mask; s->marks[j]; j = (j + 1) & s->marks_mask) {
    size_t home = ta_stream_home(s->marks[j]->stream, s->marks_mask);
    if (((j - home) & s->marks_mask) >= ((j - i) & s->marks_mask)) { /* j may move to i */
      s->marks[i] = s->marks[j];
      i = j;
    }
  }
  s->marks[i] = NULL;
}

/* `slots` slots (a power of two above twice the count), the entries put back. -1 without host memory. */
static int rehash(ta_segments *s, size_t slots) {
  ta_stream_marks **old = s->marks;
  size_t old_slots = old ? s->marks_mask + 1 : 0;
  ta_stream_marks **fresh = calloc(slots, sizeof *fresh);
  if (!fresh) return -1;
  s->marks = fresh;
  s->marks_mask = slots - 1;
  for (size_t i = 0; i < old_slots; i++)
    if (old[i]) *slot_of(s, old[i]->stream) = old[i];
  free(old);
  return 0;
}

ta_stream_marks *ta_segments_marks_find(const ta_segments *s, cudaStream_t stream) {
  return s->nmarks ? *slot_of(s, stream) : NULL;
}

ta_stream_marks *ta_segments_marks_for(ta_segments *s, cudaStream_t stream) {
  ta_stream_marks *found = ta_segments_marks_find(s, stream);
  if (found) return found;
  if (!s->marks || 2 * (s->nmarks + 1) > s->marks_mask + 1) {
    size_t slots = s->marks ? 2 * (s->marks_mask + 1) : 16;
    if (rehash(s, slots)) return NULL;
  }
  ta_stream_marks *m = calloc(1, sizeof *m); /* one allocation each: segments keep pointers to it */
  if (!m) return NULL;
  m->stream = stream;
  m->epoch = 1; /* done 0: nothing stamped is past yet */
  m->order = s->marks_made++;
  *slot_of(s, stream) = m;
  s->nmarks++;
  return m;
}

/* ------------------------------------------------------------------------
 * The active list: markers freed on since their last, or with one in flight.
 * ---------------------------------------------------------------------- */

void ta_segments_marks_activate(ta_segments *s, ta_stream_marks *m) {
  if (m->active) return;
  if (ta_grow(&s->active, &s->cap_active, s->nactive + 1, 16))
    return; /* unlisted, its stamps wait for the next free on it, or a synchronize */
  if (s->nactive && s->active[s->nactive - 1]->order > m->order) s->active_unsorted = 1;
  s->active[s->nactive++] = m;
  m->active = 1;
}

static int idle(const ta_stream_marks *m) { return !m->event && m->frees == m->frees_marked; }

/* Drop the idle ones, keeping the others' order. */
static void settle_active(ta_segments *s) {
  size_t kept = 0;
  for (size_t i = 0; i < s->nactive; i++) {
    ta_stream_marks *m = s->active[i];
    if (idle(m)) m->active = 0;
    else s->active[kept++] = m;
  }
  s->nactive = kept;
}

static int by_order(const void *pa, const void *pb) {
  const ta_stream_marks *a = *(ta_stream_marks *const *)pa, *b = *(ta_stream_marks *const *)pb;
  return a->order < b->order ? -1 : a->order > b->order;
}

/* ------------------------------------------------------------------------
 * Markers
 * ---------------------------------------------------------------------- */

static void drop_event(ta_segments *s, ta_stream_marks *m) {
  s->backend->ops->event_release(s->backend, s->device, m->event);
  m->event = NULL;
}

static void poll_one(ta_segments *s, ta_stream_marks *m) {
  if (m->event && s->backend->ops->event_done(s->backend, s->device, m->event)) {
    m->done = m->event_epoch;
    drop_event(s, m);
  }
}

/* A marker on `m`'s stream covering every free stamped so far, when there
 * were frees since the last and none is in flight. */
static void record_one(ta_segments *s, ta_stream_marks *m) {
  if (m->event || m->frees == m->frees_marked) return;
  m->event = s->backend->ops->event_record(s->backend, s->device, m->stream);
  if (!m->event) return; /* no event to be had: the stamps wait for the next try or a synchronize */
  m->event_epoch = m->epoch++;
  m->frees_marked = m->frees;
}

void ta_segments_marks_progress(ta_segments *s, ta_stream_marks *m) {
  if (s->no_sync) return;
  poll_one(s, m);
  record_one(s, m);
}

void ta_segments_marks_poll(ta_segments *s) {
  if (s->no_sync) return;
  for (size_t i = 0; i < s->nactive; i++) poll_one(s, s->active[i]);
  settle_active(s);
}

void ta_segments_marks_record(ta_segments *s) {
  if (s->no_sync) return;
  if (s->active_unsorted) { /* in the order the streams came: the events the same every run */
    qsort(s->active, s->nactive, sizeof *s->active, by_order);
    s->active_unsorted = 0;
  }
  for (size_t i = 0; i < s->nactive; i++) record_one(s, s->active[i]);
  settle_active(s);
}

void ta_segments_synchronize(ta_segments *s) {
  s->backend->ops->synchronize(s->backend, s->device);
  s->stats->num_synchronizes++;
  for (size_t i = 0; s->nmarks && i <= s->marks_mask; i++) { /* everything stamped so far is past; later frees
                                                              * get a new epoch */
    ta_stream_marks *m = s->marks[i];
    if (!m) continue;
    if (m->event) drop_event(s, m);
    m->done = m->epoch++;
    m->frees_marked = m->frees;
  }
  settle_active(s);
}

void ta_segments_marks_release(ta_segments *s, ta_stream_marks *m) {
  if (!m || --m->segments) return;
  if (m->event) drop_event(s, m);
  if (m->active) {
    m->frees_marked = m->frees; /* idle: the next settle drops it */
    settle_active(s);
  }
  erase_slot(s, slot_of(s, m->stream));
  s->nmarks--;
  free(m);
}

void ta_segments_marks_destroy(ta_segments *s) {
  for (size_t i = 0; s->marks && i <= s->marks_mask; i++) {
    ta_stream_marks *m = s->marks[i];
    if (!m) continue;
    if (m->event) drop_event(s, m);
    free(m);
  }
  free(s->marks);
  s->marks = NULL;
  s->nmarks = s->marks_mask = 0;
  free(s->active);
  s->active = NULL;
  s->nactive = s->cap_active = 0;
  free(s->donors.handles);
  free(s->donors.stamps);
  free(s->donors.lengths);
  s->donors = (ta_donors){0};
  free(s->past); /* take_past's scratch */
  s->past = NULL;
  s->cap_past = 0;
}
