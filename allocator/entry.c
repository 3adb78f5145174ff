/* The two entry points PyTorch calls, torchalloc_malloc / torchalloc_free,
 * and the public functions that set the library up (torchalloc.h). The
 * rest of the public API is in control.c (stats, hooks, log) and
 * phase_api.c (phases); the process state they share is runtime.c's. */
#include <stdio.h>
#include <stdlib.h>

#include "errors.h"
#include "log.h"
#include "misuse.h"
#include "pystack.h"
#include "runtime.h"

/* stacks:1 with a log open: the Python stack is captured before the heap
 * lock is taken (it may wait for the GIL) and handed to the heap's log
 * record through a thread-local. */
static ta_noinline void *malloc_with_stack(ta_heap *h, size_t size, cudaStream_t stream) {
  ta_log_call_stack = ta_pystack_capture(ta_rt.conf.stack_depth);
  void *p = ta_heap_malloc(h, size, stream);
  ta_log_call_stack = 0;
  return p;
}

static ta_noinline void free_with_stack(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  ta_log_call_stack = ta_pystack_capture(ta_rt.conf.stack_depth);
  ta_heap_free(h, ptr, size, stream);
  ta_log_call_stack = 0;
}

static ta_noinline void *refuse_size(ta_heap *h, size_t size, int device) {
  ta_lock_acquire(&h->lock);
  h->stats.num_bad_size++;
  ta_lock_release(&h->lock);
  ta_misuse_report(ta_rt.conf.warn, TA_MISUSE_BAD_SIZE,
                   "request of %zu bytes on device %d is beyond any device (limit %zu); returning NULL", size, device,
                   (size_t)TA_MAX_REQUEST);
  return NULL;
}

TORCHALLOC_API void *torchalloc_malloc(size_t size, int device, cudaStream_t stream) {
  if (ta_unlikely(size == 0)) return NULL;
  ta_heap *h = ta_runtime_heap(device);
  if (ta_unlikely(!h)) {
    if (atomic_load(&ta_rt.state) == TA_STATE_READY) ta_runtime_report_bad_device(device);
    return NULL;
  }
  if (ta_unlikely(size > TA_MAX_REQUEST)) return refuse_size(h, size, device);
  if (ta_unlikely(ta_log_on()) && ta_rt.conf.stacks) return malloc_with_stack(h, size, stream);
  return ta_heap_malloc(h, size, stream);
}

TORCHALLOC_API void torchalloc_free(void *ptr, size_t size, int device, cudaStream_t stream) {
  if (ta_unlikely(!ptr)) return;
  ta_heap *h = ta_runtime_heap(device);
  if (ta_unlikely(!h)) {
    if (atomic_load(&ta_rt.state) == TA_STATE_READY) ta_runtime_report_bad_device(device);
    return;
  }
  if (ta_unlikely(ta_log_on()) && ta_rt.conf.stacks) free_with_stack(h, ptr, size, stream);
  else ta_heap_free(h, ptr, size, stream);
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
  if (!text[0] && atomic_load(&ta_rt.state) == TA_STATE_BROKEN) return ta_rt.broken_reason;
  return text;
}

TORCHALLOC_API const char *torchalloc_config_keys(void) { return ta_config_key_list(); }

TORCHALLOC_API int torchalloc_device_count(void) { return ta_runtime_ready() ? ta_rt.ndevices : 0; }
