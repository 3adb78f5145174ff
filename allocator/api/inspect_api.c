/* Public inspection functions (torchalloc.h): snapshots, the segment around
 * a pointer, the largest cached block, stacks, the segment observer, and
 * the fields of the stats struct. */
#include "accounting/observer.h"
#include "base/errors.h"
#include "log/log_intern.h"
#include "runtime/runtime.h"

TORCHALLOC_API int torchalloc_snapshot(int device, torchalloc_segment_info *segments, size_t segments_cap,
                                       torchalloc_block_info *blocks, size_t blocks_cap, size_t *nsegments,
                                       size_t *nblocks) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || !nsegments || !nblocks || (!segments && segments_cap) || (!blocks && blocks_cap)) return -1;
  return ta_heap_snapshot(h, segments, segments_cap, blocks, blocks_cap, nsegments, nblocks);
}

TORCHALLOC_API int torchalloc_segment_of(const void *ptr, void **base, size_t *size, int *device) {
  if (!ptr || !ta_runtime_ready()) return -1;
  for (int d = 0; d < ta_runtime_device_count(); d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    uintptr_t b = 0;
    size_t s = 0;
    if (h && ta_heap_segment_of(h, (uintptr_t)ptr, &b, &s)) {
      if (base) *base = (void *)b;
      if (size) *size = s;
      if (device) *device = d;
      return 0;
    }
  }
  ta_set_error("%p is in no torchalloc segment", ptr);
  return -1;
}

TORCHALLOC_API int64_t torchalloc_largest_cached_block(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  return h ? (int64_t)ta_heap_largest_free(h) : -1;
}

TORCHALLOC_API double torchalloc_get_memory_fraction(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1.0;
  double f = ta_heap_fraction(h);
  return f >= 0.0 ? f : 1.0; /* none set: the whole device, as PyTorch says */
}

TORCHALLOC_API int torchalloc_stack_frames(uint32_t stack, torchalloc_frame_visitor visit, void *ctx) {
  if (!visit) return 0;
  return ta_log_intern_visit_stack(stack, visit, ctx);
}

TORCHALLOC_API void torchalloc_set_segment_observer(torchalloc_segment_observer fn, void *ctx) {
  ta_observer_set(fn, ctx);
}

TORCHALLOC_API const char *torchalloc_stats_fields(void) {
  return TORCHALLOC_STATS_FIELDS(TORCHALLOC_FIELD_LINE);
}
