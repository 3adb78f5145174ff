/* Public replay functions (torchalloc_replay.h): a recorded trace driven
 * through one policy on a private simulated device, whole or fed in pieces.
 * runtime/replay.c does the work; these only name it, and torchalloc_replay
 * is begin, feed and end in one call. */
#include "base/errors.h"
#include "runtime/replay.h"
#include "torchalloc_replay.h"

/* The struct sizes, for callers that mirror them (the Python tools' numpy
 * dtypes check theirs against these). */
TORCHALLOC_API size_t torchalloc_replay_event_size(void) { return sizeof(torchalloc_replay_event); }
TORCHALLOC_API size_t torchalloc_replay_result_size(void) { return sizeof(torchalloc_replay_result); }

TORCHALLOC_API const char *torchalloc_replay_result_fields(void) {
  return TORCHALLOC_REPLAY_RESULT_FIELDS(TORCHALLOC_FIELD_LINE);
}

TORCHALLOC_API torchalloc_replay_run *torchalloc_replay_begin(const char *policy, uint64_t capacity, size_t n_total,
                                                              int64_t *reserved_series, size_t series_len) {
  return ta_replay_begin(policy, capacity, n_total, reserved_series, series_len);
}

TORCHALLOC_API int torchalloc_replay_feed(torchalloc_replay_run *run, const torchalloc_replay_event *events,
                                          size_t n) {
  return ta_replay_feed(run, events, n);
}

TORCHALLOC_API int torchalloc_replay_end(torchalloc_replay_run *run, torchalloc_replay_result *out) {
  return ta_replay_end(run, out);
}

TORCHALLOC_API int torchalloc_replay(const torchalloc_replay_event *events, size_t n, const char *policy,
                                     uint64_t capacity, torchalloc_replay_result *out, int64_t *reserved_series,
                                     size_t series_len) {
  if (!out || (!events && n) || !policy || (reserved_series && series_len == 0)) {
    ta_set_error("torchalloc_replay: bad arguments");
    return -1;
  }
  torchalloc_replay_run *run = ta_replay_begin(policy, capacity, n, reserved_series, series_len);
  if (!run) return -1;
  if (ta_replay_feed(run, events, n) < 0) {
    ta_replay_end(run, NULL); /* frees it; the feed's reason stays the message */
    return -1;
  }
  return ta_replay_end(run, out);
}
