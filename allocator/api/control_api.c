/* Public control functions (torchalloc.h): policies, stats, the cache, the
 * hooks PyTorch calls through CUDAPluggableAllocator, the checker, the log
 * and markers. Each finds its heap through the runtime and asks the heap. */
#include <stdio.h>
#include <stdlib.h>

#include "base/errors.h"
#include "log/log.h"
#include "runtime/runtime.h"

/* ------------------------------------------------------------------------
 * Policies
 * ---------------------------------------------------------------------- */

TORCHALLOC_API int torchalloc_set_policy(const char *name) { return ta_runtime_set_policy(name); }

/* PyTorch's settings string, as PyTorch itself accepted it: the options
 * torchalloc honours (roundup_power2_divisions, graph_capture_record_stream_reuse) take effect on every device
 * and on heaps made later; the rest configure PyTorch's own allocator. */
TORCHALLOC_API int torchalloc_set_allocator_settings(const char *settings) {
  return ta_runtime_set_allocator_settings(settings);
}

TORCHALLOC_API const char *torchalloc_policy_name(void) { return ta_runtime_ready() ? ta_runtime_conf()->policy : ""; }

TORCHALLOC_API const char *torchalloc_policy_names(void) { return ta_policy_names(); }

/* ------------------------------------------------------------------------
 * Stats and the cache
 * ---------------------------------------------------------------------- */

TORCHALLOC_API size_t torchalloc_stats_size(void) { return sizeof(torchalloc_stats); }

TORCHALLOC_API int torchalloc_get_stats(int device, torchalloc_stats *out) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || !out) return -1;
  ta_heap_get_stats(h, out);
  out->num_bad_device = ta_runtime_bad_devices();
  return 0;
}

TORCHALLOC_API int torchalloc_reset_peak_stats(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_heap_reset_peak_stats(h);
  return 0;
}

TORCHALLOC_API int torchalloc_reset_accumulated_stats(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_heap_reset_accumulated_stats(h);
  return 0;
}

TORCHALLOC_API int64_t torchalloc_empty_cache(int device) {
  if (device == -1) {
    if (!ta_runtime_ready()) return -1;
    int64_t total = 0;
    for (int d = 0; d < ta_runtime_device_count(); d++) {
      ta_heap *h = ta_runtime_heap_if_any(d);
      if (h) total += (int64_t)ta_heap_release_cached(h);
    }
    return total;
  }
  ta_heap *h = ta_runtime_heap_for_control(device);
  return h ? (int64_t)ta_heap_release_cached(h) : -1;
}

TORCHALLOC_API int torchalloc_check_invariants(int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  char err[512];
  if (ta_heap_check(h, err, sizeof err)) {
    ta_set_error("%s", err);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------------
 * Hooks PyTorch calls
 * ---------------------------------------------------------------------- */

TORCHALLOC_API void torchalloc_record_stream(void *ptr, cudaStream_t stream) {
  if (!ptr || !ta_runtime_ready()) return;
  for (int d = 0; d < ta_runtime_device_count(); d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h && ta_heap_record_stream(h, ptr, stream)) return;
  }
  ta_heap *h = ta_runtime_heap(0); /* counted on device 0: the pointer names no device */
  if (h) ta_heap_report_bad_record_stream(h, ptr);
}

/* `x` in the fewest digits that read back as `x`: %g's six made 1.0000001
 * "1", and a message refusing it then said "1 is outside [0, 1]". */
static void shortest_digits(double x, char *out, size_t len) {
  for (int digits = 6; digits <= 17; digits++) {
    snprintf(out, len, "%.*g", digits, x);
    if (strtod(out, NULL) == x) return;
  }
}

TORCHALLOC_API void torchalloc_set_memory_fraction(double fraction, int device) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) {
    fprintf(stderr, "torchalloc: error: set_memory_fraction: %s\n", ta_error_text());
    return;
  }
  if (!(fraction >= 0.0 && fraction <= 1.0)) { /* 0 as PyTorch takes it: nothing may be allocated */
    char shown[32];
    shortest_digits(fraction, shown, sizeof shown);
    ta_set_error("memory fraction %s is outside [0, 1]", shown);
    fprintf(stderr, "torchalloc: error: %s\n", ta_error_text());
    return;
  }
  size_t free_b = 0, total = 0;
  ta_backend *backend = ta_runtime_backend();
  if (backend->ops->mem_info(backend, device, &free_b, &total) != TA_OK) {
    ta_set_error("cannot read the memory size of device %d", device);
    fprintf(stderr, "torchalloc: error: %s\n", ta_error_text());
    return;
  }
  /* A limit that rounds to 0 bytes (fraction 0 included) must still be a limit (0 means none): 1 byte
   * holds no block. */
  size_t limit = (size_t)(fraction * (double)total);
  ta_heap_set_limit(h, limit ? limit : 1, fraction);
}

TORCHALLOC_API void torchalloc_reset(void) { torchalloc_empty_cache(-1); }

TORCHALLOC_API void torchalloc_init_devices(int device_count) {
  if (!ta_runtime_ready()) return;
  for (int d = 0; d < device_count && d < ta_runtime_device_count(); d++)
    if (!ta_runtime_heap(d)) fprintf(stderr, "torchalloc: error: cannot prepare the heap of device %d\n", d);
}

/* ------------------------------------------------------------------------
 * The event log and markers
 * ---------------------------------------------------------------------- */

TORCHALLOC_API int torchalloc_log_open(const char *path) { return ta_runtime_log_open(path); }

TORCHALLOC_API void torchalloc_log_close(void) { ta_runtime_log_close(); }

TORCHALLOC_API const char *torchalloc_log_path(void) { return ta_log_path(); }

TORCHALLOC_API int torchalloc_mark(const char *label) {
  if (!label) return -1;
  ta_log_marker(label, ta_phase_current()); /* nothing to mark when no log is open */
  return 0;
}
