/* Public phase functions (torchalloc.h): the stack is phase.c's, the
 * per-device accounting each heap's; ending a phase goes down through both
 * in a fixed order: pop the stack, close the occurrence in every heap, then
 * retire the phase (blocks freed after that count as outliving it). */
#include "base/errors.h"
#include "runtime/runtime.h"

TORCHALLOC_API int torchalloc_phase_begin(const char *name) { return ta_phase_push(name); }

TORCHALLOC_API int torchalloc_phase_end(const char *name) {
  ta_phase_ended ended;
  if (ta_phase_pop(name, &ended)) return -1;
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h) ta_heap_phase_ended(h, ended.id, ended.epoch);
  }
  ta_phase_retire(&ended);
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
