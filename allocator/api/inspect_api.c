/* Public inspection functions (torchalloc.h): snapshots, the segment around
 * a pointer, the largest cached block, stacks, the segment observer, the
 * last OOM and the rules its report rests on (verdict, advice), and the
 * simulated device's capture model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accounting/observer.h"
#include "accounting/oom_advice.h"
#include "accounting/oom_verdict.h"
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
  for (int d = 0; d < ta_rt.ndevices; d++) {
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

TORCHALLOC_API int torchalloc_oom_summary(int device, char *buf, size_t len) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_oom_info oom;
  ta_heap_last_oom(h, &oom);
  if (!oom.count) {
    if (buf && len) buf[0] = '\0';
    return 0;
  }
  return ta_heap_format_oom(&oom, device, buf, len);
}

TORCHALLOC_API int torchalloc_last_oom(int device, torchalloc_oom_facts *facts, int *verdict) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_oom_info oom;
  ta_heap_last_oom(h, &oom);
  if (facts) *facts = oom.count ? oom.facts : (torchalloc_oom_facts){0};
  if (verdict) *verdict = oom.count ? oom.verdict : TORCHALLOC_OOM_NONE;
  return 0;
}

TORCHALLOC_API int torchalloc_last_oom_detail(int device, torchalloc_oom_detail *detail) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || !detail || detail->struct_size < sizeof(uint64_t)) return -1;
  ta_oom_info oom;
  ta_heap_last_oom(h, &oom);
  torchalloc_oom_detail d = oom.count ? oom.detail : (torchalloc_oom_detail){0};
  /* No byte past what the caller's struct has: an older caller's is shorter. */
  size_t n = detail->struct_size < sizeof d ? (size_t)detail->struct_size : sizeof d;
  d.struct_size = n;
  memcpy(detail, &d, n);
  return 0;
}

TORCHALLOC_API int torchalloc_oom_report(int device, char *buf, size_t len) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  char *text = ta_heap_oom_report_copy(h);
  int n = snprintf(buf, buf ? len : 0, "%s", text ? text : "");
  free(text);
  return n;
}

TORCHALLOC_API const char *torchalloc_oom_report_path(int device) {
  static _Thread_local char path[1024];
  ta_heap *h = ta_runtime_heap_for_control(device);
  path[0] = '\0';
  if (h) {
    ta_oom_info oom;
    ta_heap_last_oom(h, &oom);
    snprintf(path, sizeof path, "%s", oom.report_path);
  }
  return path;
}

TORCHALLOC_API int torchalloc_oom_verdict(const torchalloc_oom_facts *facts) {
  return facts ? ta_oom_verdict(facts) : -1;
}

/* torchalloc_oom_advice's phase names come from an array (a log's names,
 * from Python): ta_oom_advice_write asks for each through this. */
typedef struct name_table {
  const char *const *names;
  size_t n;
} name_table;

static const char *from_table(void *ctx, int phase) {
  const name_table *t = ctx;
  return t->names && phase >= 0 && (size_t)phase < t->n ? t->names[phase] : NULL;
}

TORCHALLOC_API int torchalloc_oom_advice(const torchalloc_oom_facts *facts, const torchalloc_oom_detail *detail,
                                         const char *const *phase_names, size_t nnames, char *buf, size_t len) {
  if (!facts) return -1;
  torchalloc_oom_detail d = {0};
  if (detail) { /* only the bytes the caller's struct has; the rest stays 0 */
    size_t n = detail->struct_size < sizeof d ? (size_t)detail->struct_size : sizeof d;
    memcpy(&d, detail, n);
  }
  name_table t = {phase_names, nnames};
  return ta_oom_advice_write(facts, detail ? &d : NULL, from_table, &t, "", buf, len);
}

TORCHALLOC_API int torchalloc_sim_capture(int device, cudaStream_t stream, int capturing) {
  if (!ta_runtime_ready()) return -1;
  ta_heap *h = device >= 0 && device < ta_rt.ndevices ? ta_runtime_heap(device) : NULL;
  if (h) ta_lock_acquire(&h->lock); /* the capture's topology is read under it (heap_streams.c) */
  int rc = ta_backend_sim_capture(ta_rt.backend, device, stream, capturing);
  if (h) ta_lock_release(&h->lock);
  if (rc) {
    ta_set_error("torchalloc_sim_capture: needs backend:sim, a device in range, and a capture to end");
    return -1;
  }
  return 0;
}

TORCHALLOC_API int torchalloc_sim_stream_wait(int device, cudaStream_t waiter, cudaStream_t waited) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_stream_wait(ta_rt.backend, device, waiter, waited);
  ta_lock_release(&h->lock);
  if (rc) ta_set_error("torchalloc_sim_stream_wait: needs backend:sim");
  return rc;
}

TORCHALLOC_API int64_t torchalloc_sim_capture_violations(int device, char *buf, size_t len) {
  return ta_runtime_ready() ? ta_backend_sim_violations(ta_rt.backend, device, buf, len) : -1;
}

/* The sim's state is the heap's (its lock guards every backend call). */
TORCHALLOC_API int torchalloc_sim_use(int device, cudaStream_t stream, const void *ptr, size_t size) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_use(ta_rt.backend, device, stream, (uintptr_t)ptr, size);
  ta_lock_release(&h->lock);
  return rc;
}

TORCHALLOC_API int torchalloc_sim_advance(int device, uint64_t ticks) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_advance(ta_rt.backend, device, ticks);
  ta_lock_release(&h->lock);
  return rc;
}

TORCHALLOC_API int torchalloc_sim_physical(int device, const void *ptr, uint64_t *phys) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || !phys) return -1;
  ta_lock_acquire(&h->lock);
  int rc = ta_backend_sim_physical(ta_rt.backend, device, (uintptr_t)ptr, phys);
  ta_lock_release(&h->lock);
  return rc;
}

TORCHALLOC_API void torchalloc_sim_on_copy(torchalloc_sim_copy_fn fn) { ta_backend_sim_on_copy(fn); }

TORCHALLOC_API int torchalloc_segment_mode(int device, int *configured) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  if (configured) *configured = h->conf->expandable;
  return h->seg.granule ? h->conf->expandable : 0; /* both fixed when the heap was made */
}
