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
 * would invalidate it). */
#include <stdlib.h>

#include "segments/segments.h"

ta_stream_marks *ta_segments_marks_find(const ta_segments *s, cudaStream_t stream) {
  for (size_t i = 0; i < s->nmarks; i++)
    if (s->marks[i]->stream == stream) return s->marks[i];
  return NULL;
}

ta_stream_marks *ta_segments_marks_for(ta_segments *s, cudaStream_t stream) {
  ta_stream_marks *found = ta_segments_marks_find(s, stream);
  if (found) return found;
  if (s->nmarks == s->cap_marks) {
    size_t cap = s->cap_marks ? s->cap_marks * 2 : 4;
    ta_stream_marks **grown = realloc(s->marks, cap * sizeof *grown);
    if (!grown) return NULL;
    s->marks = grown;
    s->cap_marks = cap;
  }
  ta_stream_marks *m = calloc(1, sizeof *m); /* one allocation each: segments keep pointers to it */
  if (!m) return NULL;
  m->stream = stream;
  m->epoch = 1; /* done 0: nothing stamped is past yet */
  s->marks[s->nmarks++] = m;
  return m;
}

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
  for (size_t i = 0; i < s->nmarks; i++) poll_one(s, s->marks[i]);
}

void ta_segments_marks_record(ta_segments *s) {
  if (s->no_sync) return;
  for (size_t i = 0; i < s->nmarks; i++) record_one(s, s->marks[i]);
}

void ta_segments_synchronize(ta_segments *s) {
  s->backend->ops->synchronize(s->backend, s->device);
  s->stats->num_synchronizes++;
  for (size_t i = 0; i < s->nmarks; i++) { /* everything stamped so far is past; later frees get a new epoch */
    ta_stream_marks *m = s->marks[i];
    if (m->event) drop_event(s, m);
    m->done = m->epoch++;
    m->frees_marked = m->frees;
  }
}

void ta_segments_marks_destroy(ta_segments *s) {
  for (size_t i = 0; i < s->nmarks; i++) {
    if (s->marks[i]->event) drop_event(s, s->marks[i]);
    free(s->marks[i]);
  }
  free(s->marks);
  s->marks = NULL;
  s->nmarks = s->cap_marks = 0;
  free(s->donors.handles);
  free(s->donors.stamps);
  s->donors = (ta_donors){0};
  free(s->past); /* take_past's scratch */
  s->past = NULL;
  s->cap_past = 0;
}
