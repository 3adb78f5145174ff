/* Public phase functions (torchalloc.h): the stack is phase.c's, the
 * per-device accounting each heap's; ending a phase goes down through both
 * in a fixed order: pop the stack, close the occurrence in every heap, then
 * retire the phase (blocks freed after that count as outliving it). */
#include "base/errors.h"
#include "runtime/runtime.h"

#include <string.h>

TORCHALLOC_API int torchalloc_phase_begin(const char *name) { return ta_phase_push(name, NULL); }

static void close_occurrence(const ta_phase_ended *ended) {
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h) ta_heap_phase_ended(h, ended->id, ended->epoch);
  }
  ta_phase_retire(ended);
}

TORCHALLOC_API int torchalloc_phase_end(const char *name) {
  ta_phase_ended ended;
  if (ta_phase_pop(name, &ended)) return -1;
  close_occurrence(&ended);
  return 0;
}

/* A token is the occurrence's number above the phase's id (ids < 2^16):
 * always >= 2^16, so never -1. */
#define TOKEN_ID_BITS 16

TORCHALLOC_API int64_t torchalloc_phase_enter(const char *name, size_t len) {
  if (name && memchr(name, '\0', len)) {
    ta_set_error("phase name contains a NUL byte at offset %zu (of %zu); a name is text without NULs",
                 (size_t)((const char *)memchr(name, '\0', len) - name), len);
    return -1;
  }
  char text[TORCHALLOC_PHASE_NAME_MAX + 1];
  if (!name || len == 0 || len > TORCHALLOC_PHASE_NAME_MAX) {
    ta_set_error("phase name must be 1 to %d bytes, got %zu", TORCHALLOC_PHASE_NAME_MAX, name ? len : 0);
    return -1;
  }
  memcpy(text, name, len);
  text[len] = '\0';
  uint32_t epoch = 0;
  int id = ta_phase_push(text, &epoch);
  return id < 0 ? -1 : (int64_t)epoch << TOKEN_ID_BITS | id;
}

TORCHALLOC_API int torchalloc_phase_leave(int64_t token) {
  ta_phase_ended ended;
  if (token < ((int64_t)1 << TOKEN_ID_BITS) || (token >> TOKEN_ID_BITS) > UINT32_MAX) {
    ta_set_error("%lld is not a phase token (torchalloc_phase_enter returns them)", (long long)token);
    return -1;
  }
  int id = (int)(token & ((1 << TOKEN_ID_BITS) - 1));
  if (ta_phase_remove(id, (uint32_t)(token >> TOKEN_ID_BITS), &ended)) return -1;
  close_occurrence(&ended);
  return 0;
}

TORCHALLOC_API int torchalloc_phase_current(void) { return ta_phase_current(); }

TORCHALLOC_API int torchalloc_phase_id(const char *name) { return ta_phase_intern(name); }

TORCHALLOC_API const char *torchalloc_phase_name(int id) { return ta_phase_name(id); }

TORCHALLOC_API int torchalloc_phase_count(void) { return ta_phase_count(); }

static int phase_in_range(int phase) {
  if (phase >= 0 && phase < ta_phase_count()) return 1;
  ta_set_error("phase id %d is out of range (%d phases)", phase, ta_phase_count());
  return 0;
}

TORCHALLOC_API int torchalloc_get_phase_stats(int device, int phase, torchalloc_phase_stats *out) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || !out || !phase_in_range(phase)) return -1;
  ta_heap_get_phase_stats(h, phase, out);
  out->occurrences = ta_phase_occurrences(phase); /* counted once per process, not per heap */
  return 0;
}

TORCHALLOC_API const char *torchalloc_phase_stats_fields(void) {
  return TORCHALLOC_PHASE_STATS_FIELDS(TORCHALLOC_FIELD_LINE);
}

TORCHALLOC_API int64_t torchalloc_arena_reserved(int device, int phase) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || (phase != -1 && !phase_in_range(phase))) return -1;
  return ta_heap_arena_reserved(h, phase);
}

TORCHALLOC_API int64_t torchalloc_arena_trim(int device, int phase) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || (phase != -1 && !phase_in_range(phase))) return -1;
  return ta_heap_arena_release(h, phase);
}
