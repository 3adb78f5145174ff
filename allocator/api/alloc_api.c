/* The entry points PyTorch calls, torchalloc_malloc / torchalloc_free (and
 * the bridge's torchalloc_try_malloc / torchalloc_free_ptr), and the public
 * functions that set the library up (torchalloc.h). The rest of the public
 * API is beside it in api/: control_api.c (policies, stats, cache, hooks,
 * log), phase_api.c (phases), pool_api.c (private pools), inspect_api.c
 * (snapshots, the segment observer, OOM reports), module_api.c (module
 * records), share_api.c (peers, IPC) and replay_api.c (replay); the
 * process state they share is runtime.c's. */
#include <stdio.h>
#include <stdlib.h>

#include "base/errors.h"
#include "log/log.h"
#include "context/pystack.h"
#include "runtime/runtime.h"

/* stacks:1 with a log open: the Python stack is captured before the heap
 * lock is taken (it may wait for the GIL) and handed to the heap's log
 * record through a thread-local. */
static ta_noinline void *malloc_with_stack(ta_heap *h, size_t size, cudaStream_t stream) {
  ta_log_call_stack = ta_pystack_capture(ta_runtime_conf()->stack_depth);
  void *p = ta_heap_malloc(h, size, stream);
  ta_log_call_stack = 0;
  return p;
}

static ta_noinline void free_with_stack(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  ta_log_call_stack = ta_pystack_capture(ta_runtime_conf()->stack_depth);
  ta_heap_free(h, ptr, size, stream);
  ta_log_call_stack = 0;
}

/* The heap's malloc and free, with the Python stack when the log wants it. */
static inline void *heap_malloc(ta_heap *h, size_t size, cudaStream_t stream) {
  return ta_unlikely(ta_log_on()) && ta_runtime_conf()->stacks ? malloc_with_stack(h, size, stream)
                                                               : ta_heap_malloc(h, size, stream);
}

static inline void heap_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  if (ta_unlikely(ta_log_on()) && ta_runtime_conf()->stacks) free_with_stack(h, ptr, size, stream);
  else ta_heap_free(h, ptr, size, stream);
}

/* time_calls:1 (bench/models.py's allocator host time): the entry points'
 * time, clock to clock, into the heap's stats. Off, it costs one test. */
static ta_noinline void *timed_malloc(ta_heap *h, size_t size, cudaStream_t stream) {
  uint64_t t0 = ta_clock_gettime_ns();
  void *p = heap_malloc(h, size, stream);
  ta_heap_count_host_time(h, ta_clock_gettime_ns() - t0);
  return p;
}

static ta_noinline void timed_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  uint64_t t0 = ta_clock_gettime_ns();
  heap_free(h, ptr, size, stream);
  ta_heap_count_host_time(h, ta_clock_gettime_ns() - t0);
}

/* NULL for a request torchalloc cannot serve; never stops the process. */
static inline void *try_malloc(size_t size, int device, cudaStream_t stream) {
  ta_heap *h = ta_runtime_heap(device);
  if (ta_unlikely(!h)) {
    if (ta_runtime_state() == TA_STATE_READY) ta_runtime_report_bad_device(device);
    return NULL;
  }
  if (ta_unlikely(size > TA_MAX_REQUEST)) {
    ta_heap_report_bad_size(h, size);
    return NULL;
  }
  void *p = ta_unlikely(ta_runtime_conf()->time_calls) ? timed_malloc(h, size, stream) : heap_malloc(h, size, stream);
  if (ta_unlikely(!p)) ta_runtime_after_oom(h);
  else ta_runtime_device_in_use(device);
  return p;
}

/* PyTorch's plain pluggable route builds a tensor on whatever it gets: a
 * NULL would only crash later, in a kernel, with the CUDA context lost and
 * nothing said. So (oom:abort, the default on the real device) say why and
 * stop here. */
static ta_noinline void stop_on_failure(size_t size, int device) {
  char why[TA_OOM_SUMMARY_MAX];
  ta_heap *h = device >= 0 && device < TA_MAX_DEVICES ? ta_runtime_heap_if_any(device) : NULL;
  ta_oom_info oom;
  if (h) ta_heap_last_oom(h, &oom);
  if (h && oom.count && oom.facts.requested == size) ta_heap_format_oom(&oom, device, why, sizeof why);
  else if (ta_runtime_state() != TA_STATE_READY) snprintf(why, sizeof why, "%s", ta_runtime_broken_reason());
  else if (!h) snprintf(why, sizeof why, "device %d is not a device of this process", device);
  else snprintf(why, sizeof why, "a request of %zu bytes is beyond any device", size);
  fprintf(stderr,
          "torchalloc: fatal: cannot allocate %zu bytes on device %d: %s\n"
          "torchalloc: stopping the process: PyTorch's plain CUDAPluggableAllocator route cannot raise an error, "
          "and a NULL pointer would corrupt the CUDA context. Use torchalloc.install() (the C++ bridge raises "
          "torch.OutOfMemoryError instead), or TORCHALLOC_CONF=oom:null to get NULL back.\n",
          size, device, why);
  fflush(stderr);
  abort();
}

/* A CUDA graph capture on the plain route: PyTorch does not tell a plain
 * pluggable allocator about it, so the graph's memory would come from the
 * shared cache, and after the capture other tensors would reuse addresses
 * the graph writes on every replay. Stop, with the reason, rather than let
 * that corrupt training silently. */
static ta_noinline void stop_on_capture(int device) {
  fprintf(stderr,
          "torchalloc: fatal: a CUDA graph is being captured on device %d, and on PyTorch's plain "
          "CUDAPluggableAllocator route torchalloc is not told, so the graph's memory could not be kept private "
          "(other tensors would reuse it between replays). Use torchalloc.install(), whose C++ bridge gives each "
          "graph its own pool, as PyTorch's allocator does. Stopping the process.\n",
          device);
  fflush(stderr);
  abort();
}

TORCHALLOC_API void *torchalloc_malloc(size_t size, int device, cudaStream_t stream) {
  if (ta_unlikely(size == 0)) return NULL;
  /* Set up first (the first call configures from TORCHALLOC_CONF): the
   * config, the backend and the device count are read only once they are
   * published, and even a broken config says what a failure does. */
  (void)ta_runtime_ready();
  int plain_route = ta_config_oom_action(ta_runtime_conf()) == TA_OOM_ABORT;
  if (ta_unlikely(plain_route) && ta_runtime_stream_capturing(device, stream)) stop_on_capture(device);
  void *p = try_malloc(size, device, stream);
  if (ta_unlikely(!p) && plain_route) stop_on_failure(size, device);
  return p;
}

TORCHALLOC_API void *torchalloc_try_malloc(size_t size, int device, cudaStream_t stream) {
  return ta_likely(size != 0) ? try_malloc(size, device, stream) : NULL;
}

TORCHALLOC_API int torchalloc_free_ptr(void *ptr) {
  if (ta_unlikely(!ptr) || !ta_runtime_ready()) return -1;
  int with_stack = ta_unlikely(ta_log_on()) && ta_runtime_conf()->stacks;
  if (with_stack) ta_log_call_stack = ta_pystack_capture(ta_runtime_conf()->stack_depth);
  int found = 0;
  uint64_t t0 = ta_unlikely(ta_runtime_conf()->time_calls) ? ta_clock_gettime_ns() : 0;
  for (int d = 0; !found && d < ta_runtime_device_count(); d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    found = h && ta_heap_free_if_live(h, ptr);
    if (found && t0) ta_heap_count_host_time(h, ta_clock_gettime_ns() - t0);
  }
  if (!found) {
    ta_heap *h = ta_runtime_heap(0); /* counted on device 0: the pointer names no device */
    if (h) ta_heap_report_bad_free(h, (uintptr_t)ptr);
  }
  if (with_stack) ta_log_call_stack = 0;
  return found ? 0 : -1;
}

TORCHALLOC_API void torchalloc_free(void *ptr, size_t size, int device, cudaStream_t stream) {
  if (ta_unlikely(!ptr)) return;
  ta_heap *h = ta_runtime_heap(device);
  if (ta_unlikely(!h)) {
    if (ta_runtime_state() == TA_STATE_READY) ta_runtime_report_bad_device(device);
    return;
  }
  if (ta_unlikely(ta_runtime_conf()->time_calls)) timed_free(h, ptr, size, stream);
  else heap_free(h, ptr, size, stream);
}

/* ------------------------------------------------------------------------
 * Set-up
 * ---------------------------------------------------------------------- */

TORCHALLOC_API int torchalloc_init(const char *conf) {
  ta_clear_error();
  return ta_runtime_init(conf ? conf : getenv("TORCHALLOC_CONF"));
}

TORCHALLOC_API void torchalloc_teardown(void) { ta_runtime_teardown(); }

TORCHALLOC_API const char *torchalloc_last_error(void) {
  const char *text = ta_error_text();
  if (!text[0] && ta_runtime_state() == TA_STATE_BROKEN) return ta_runtime_broken_reason();
  return text;
}

TORCHALLOC_API const char *torchalloc_config_keys(void) { return ta_config_key_list(); }

TORCHALLOC_API const char *torchalloc_config_help(void) { return ta_config_help(); }

TORCHALLOC_API int torchalloc_device_count(void) { return ta_runtime_ready() ? ta_runtime_device_count() : 0; }
