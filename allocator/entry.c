/* The exported C ABI: torchalloc_malloc/free and the control functions.
 *
 * Process-wide state is the config, the backend and one heap per device.
 * Initialisation is lazy (first call) and guarded by one mutex; after that
 * the fast path reads an atomic heap pointer and goes straight to the heap. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/bins.h"
#include "../policies/size_classes.h"
#include "heap.h"
#include "errors.h"
#include "log.h"
#include "misuse.h"
#include "phase.h"
#include "pystack.h"
#include "stats.h"

#define TA_MAX_DEVICES 64
/* Larger requests are bad input: (size_t)-1 and friends would overflow the
 * rounding, and no device has a terabyte. */
#define TA_MAX_REQUEST (((size_t)1 << 40) - TA_ROUND_LARGE)

enum { STATE_UNINIT = 0, STATE_READY = 1, STATE_BROKEN = -1 };

typedef struct ta_global {
  pthread_mutex_t lock; /* init, teardown, heap creation */
  atomic_int state;
  ta_config conf;
  ta_backend *backend;
  int ndevices;
  _Atomic(ta_heap *) heaps[TA_MAX_DEVICES];
  atomic_llong bad_device; /* no heap to count it in */
  char broken_reason[512];
} ta_global;

static ta_global g = {.lock = PTHREAD_MUTEX_INITIALIZER};
static _Thread_local char last_error[512];

static void set_error(const char *msg) { snprintf(last_error, sizeof last_error, "%s", msg); }

void ta_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
}

const char *torchalloc_last_error(void) {
  if (!last_error[0] && atomic_load(&g.state) == STATE_BROKEN) return g.broken_reason;
  return last_error;
}

const char *torchalloc_config_keys(void) { return ta_config_key_list(); }

/* ------------------------------------------------------------------------
 * Init / teardown (callers hold g.lock)
 * ---------------------------------------------------------------------- */

/* Close the event log once no writer can be inside it: heap-locked
 * writers check ta_log_on() under their heap's lock, so after logging is
 * off, taking each heap lock once waits out the last of them (log.h). */
static void log_close_quiesced(void) {
  if (!ta_log_stop()) return;
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = atomic_load(&g.heaps[d]);
    if (h) {
      ta_lock_acquire(&h->lock);
      ta_lock_release(&h->lock);
    }
  }
  ta_log_close();
}

static void destroy_all_locked(void) {
  log_close_quiesced();
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap_destroy(atomic_load(&g.heaps[d]));
    atomic_store(&g.heaps[d], NULL);
  }
  if (g.backend) g.backend->ops->destroy(g.backend);
  g.backend = NULL;
  g.ndevices = 0;
  ta_phase_reset();
  atomic_store(&g.state, STATE_UNINIT);
}

static ta_backend *create_backend(const ta_config *conf, char *err, size_t errlen) {
  if (conf->backend != TA_BACKEND_SIM) return ta_backend_cuda_create(err, errlen);
  ta_sim_options opts = {.devices = conf->sim_devices, .capacity = conf->sim_capacity,
                         .fail_alloc_at = conf->sim_fail_alloc, .event_polls = conf->sim_event_polls};
  ta_backend *backend = ta_backend_sim_create(&opts);
  if (!backend) snprintf(err, errlen, "cannot create the sim backend");
  return backend;
}

/* Make `conf` and `backend` the process state (the old state is gone). */
static int install_locked(const ta_config *conf, ta_backend *backend, char *err, size_t errlen) {
  if (conf->log_path[0] && ta_log_open(conf->log_path, conf->log_max, err, errlen)) {
    backend->ops->destroy(backend);
    return -1;
  }
  int n = backend->ops->device_count(backend);
  g.conf = *conf;
  g.backend = backend;
  g.ndevices = n < TA_MAX_DEVICES ? n : TA_MAX_DEVICES;
  atomic_store(&g.bad_device, 0);
  ta_misuse_reset();
  atomic_store(&g.state, STATE_READY);
  return 0;
}

static int init_locked(const char *text, char *err, size_t errlen) {
  ta_config conf;
  ta_config_defaults(&conf);
  if (ta_config_parse(&conf, text, err, errlen)) return -1;
  ta_backend *backend = create_backend(&conf, err, errlen);
  return backend ? install_locked(&conf, backend, err, errlen) : -1;
}

/* First use without torchalloc_init(): configure from TORCHALLOC_CONF. A bad
 * config is printed once and every allocation refused, never guessed at. */
static ta_noinline int ensure_ready_slow(void) {
  pthread_mutex_lock(&g.lock);
  if (atomic_load(&g.state) == STATE_UNINIT) {
    char err[512];
    if (init_locked(getenv("TORCHALLOC_CONF"), err, sizeof err)) {
      snprintf(g.broken_reason, sizeof g.broken_reason, "%s", err);
      atomic_store(&g.state, STATE_BROKEN);
      fprintf(stderr, "torchalloc: error: %s; every allocation will fail until this is fixed\n", err);
    }
  }
  int ok = atomic_load(&g.state) == STATE_READY;
  pthread_mutex_unlock(&g.lock);
  return ok;
}

static inline int ensure_ready(void) {
  return ta_likely(atomic_load_explicit(&g.state, memory_order_acquire) == STATE_READY) || ensure_ready_slow();
}

static ta_noinline ta_heap *heap_create_slow(int device) {
  if (!ensure_ready()) return NULL;
  if (device < 0 || device >= g.ndevices) return NULL;
  pthread_mutex_lock(&g.lock);
  ta_heap *h = atomic_load(&g.heaps[device]);
  if (!h && atomic_load(&g.state) == STATE_READY) {
    char err[256];
    h = ta_heap_create(g.backend, device, &g.conf, err, sizeof err);
    if (h) {
      h->logged = 1;
      atomic_store_explicit(&g.heaps[device], h, memory_order_release);
    } else {
      fprintf(stderr, "torchalloc: error: cannot create the heap of device %d: %s\n", device, err);
    }
  }
  pthread_mutex_unlock(&g.lock);
  return h;
}

/* The heap of `device`, created on first use; NULL for a bad device. */
static inline ta_heap *heap_for(int device) {
  if (ta_likely((unsigned)device < TA_MAX_DEVICES)) {
    ta_heap *h = atomic_load_explicit(&g.heaps[device], memory_order_acquire);
    if (ta_likely(h != NULL)) return h;
  }
  return heap_create_slow(device);
}

static ta_noinline void report_bad_device(int device) {
  atomic_fetch_add(&g.bad_device, 1);
  int warn = atomic_load(&g.state) == STATE_READY ? g.conf.warn : 1;
  ta_misuse_report(warn, TA_MISUSE_BAD_DEVICE, "device index %d is out of range (this process has %d devices)",
                   device, g.ndevices);
}

/* A heap for a control call, or -1 with a message. */
static ta_heap *heap_for_control(int device) {
  if (!ensure_ready()) {
    set_error(g.broken_reason);
    return NULL;
  }
  ta_heap *h = device >= 0 && device < g.ndevices ? heap_for(device) : NULL;
  if (!h) {
    char msg[128];
    snprintf(msg, sizeof msg, "device index %d is out of range (this process has %d devices)", device, g.ndevices);
    set_error(msg);
  }
  return h;
}

/* ------------------------------------------------------------------------
 * The two entry points
 * ---------------------------------------------------------------------- */

/* stacks:1 with a log open: the Python stack is captured before the heap
 * lock is taken (it may wait for the GIL) and handed to the heap's log
 * record through a thread-local. */
static ta_noinline void *malloc_with_stack(ta_heap *h, size_t size, cudaStream_t stream) {
  ta_log_call_stack = ta_pystack_capture(g.conf.stack_depth);
  void *p = ta_heap_malloc(h, size, stream);
  ta_log_call_stack = 0;
  return p;
}

static ta_noinline void free_with_stack(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  ta_log_call_stack = ta_pystack_capture(g.conf.stack_depth);
  ta_heap_free(h, ptr, size, stream);
  ta_log_call_stack = 0;
}

TORCHALLOC_API void *torchalloc_malloc(size_t size, int device, cudaStream_t stream) {
  if (ta_unlikely(size == 0)) return NULL;
  ta_heap *h = heap_for(device);
  if (ta_unlikely(!h)) {
    if (atomic_load(&g.state) == STATE_READY) report_bad_device(device);
    return NULL;
  }
  if (ta_unlikely(size > TA_MAX_REQUEST)) {
    ta_lock_acquire(&h->lock);
    h->stats.num_bad_size++;
    ta_lock_release(&h->lock);
    ta_misuse_report(g.conf.warn, TA_MISUSE_BAD_SIZE,
                     "request of %zu bytes on device %d is beyond any device (limit %zu); returning NULL", size,
                     device, (size_t)TA_MAX_REQUEST);
    return NULL;
  }
  if (ta_unlikely(ta_log_on()) && g.conf.stacks) return malloc_with_stack(h, size, stream);
  return ta_heap_malloc(h, size, stream);
}

TORCHALLOC_API void torchalloc_free(void *ptr, size_t size, int device, cudaStream_t stream) {
  if (ta_unlikely(!ptr)) return;
  ta_heap *h = heap_for(device);
  if (ta_unlikely(!h)) {
    if (atomic_load(&g.state) == STATE_READY) report_bad_device(device);
    return;
  }
  if (ta_unlikely(ta_log_on()) && g.conf.stacks) free_with_stack(h, ptr, size, stream);
  else ta_heap_free(h, ptr, size, stream);
}

/* ------------------------------------------------------------------------
 * Control
 * ---------------------------------------------------------------------- */

static int any_live_locked(void) {
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = atomic_load(&g.heaps[d]);
    if (h && ta_heap_live_blocks(h)) return 1;
  }
  return 0;
}

TORCHALLOC_API int torchalloc_init(const char *conf) {
  last_error[0] = '\0';
  char err[512];
  const char *text = conf ? conf : getenv("TORCHALLOC_CONF");
  ta_config next;
  ta_config_defaults(&next);
  if (ta_config_parse(&next, text, err, sizeof err)) {
    set_error(err);
    return -1;
  }
  pthread_mutex_lock(&g.lock);
  if (any_live_locked()) {
    pthread_mutex_unlock(&g.lock);
    set_error("torchalloc_init: blocks are still allocated; free them (or call torchalloc_teardown) first");
    return -1;
  }
  /* Build the new backend before tearing the old state down: a failure
   * (no GPU for backend:cuda, say) leaves what worked in place. */
  ta_backend *backend = create_backend(&next, err, sizeof err);
  int rc = -1;
  if (backend) {
    destroy_all_locked();
    rc = install_locked(&next, backend, err, sizeof err);
  }
  pthread_mutex_unlock(&g.lock);
  if (rc) set_error(err);
  return rc;
}

TORCHALLOC_API void torchalloc_teardown(void) {
  pthread_mutex_lock(&g.lock);
  destroy_all_locked();
  pthread_mutex_unlock(&g.lock);
}

TORCHALLOC_API int torchalloc_device_count(void) { return ensure_ready() ? g.ndevices : 0; }

TORCHALLOC_API int torchalloc_set_policy(const char *name) {
  if (!name || !ta_policy_by_name(name, NULL)) {
    char msg[128];
    snprintf(msg, sizeof msg, "unknown policy '%s' (expected caching, exact or phase_arena)", name ? name : "(null)");
    set_error(msg);
    return -1;
  }
  if (!ensure_ready()) return -1;
  pthread_mutex_lock(&g.lock);
  snprintf(g.conf.policy, sizeof g.conf.policy, "%s", name); /* heaps made later start with it */
  int rc = 0;
  for (int d = 0; d < g.ndevices; d++) {
    ta_heap *h = atomic_load(&g.heaps[d]);
    if (h && ta_heap_set_policy(h, name)) rc = -1;
  }
  pthread_mutex_unlock(&g.lock);
  if (rc) set_error("out of host memory while creating the policy");
  return rc;
}

TORCHALLOC_API const char *torchalloc_policy_name(void) { return ensure_ready() ? g.conf.policy : ""; }

TORCHALLOC_API size_t torchalloc_stats_size(void) { return sizeof(torchalloc_stats); }

TORCHALLOC_API int torchalloc_get_stats(int device, torchalloc_stats *out) {
  ta_heap *h = heap_for_control(device);
  if (!h || !out) return -1;
  ta_heap_get_stats(h, out);
  out->num_bad_device = atomic_load(&g.bad_device);
  return 0;
}

TORCHALLOC_API int torchalloc_reset_peak_stats(int device) {
  ta_heap *h = heap_for_control(device);
  if (!h) return -1;
  ta_heap_reset_peak_stats(h);
  return 0;
}

TORCHALLOC_API int torchalloc_reset_accumulated_stats(int device) {
  ta_heap *h = heap_for_control(device);
  if (!h) return -1;
  ta_heap_reset_accumulated_stats(h);
  return 0;
}

TORCHALLOC_API int64_t torchalloc_empty_cache(int device) {
  if (device == -1) {
    if (!ensure_ready()) return -1;
    int64_t total = 0;
    for (int d = 0; d < g.ndevices; d++) {
      ta_heap *h = atomic_load(&g.heaps[d]);
      if (h) total += (int64_t)ta_heap_release_cached(h);
    }
    return total;
  }
  ta_heap *h = heap_for_control(device);
  return h ? (int64_t)ta_heap_release_cached(h) : -1;
}

TORCHALLOC_API void torchalloc_record_stream(void *ptr, cudaStream_t stream) {
  if (!ptr || !ensure_ready()) return;
  for (int d = 0; d < g.ndevices; d++) {
    ta_heap *h = atomic_load(&g.heaps[d]);
    if (h && ta_heap_record_stream(h, ptr, stream)) return;
  }
  ta_heap *h = heap_for(0); /* counted on device 0: the pointer names no device */
  if (h) ta_heap_report_bad_record_stream(h, ptr);
}

TORCHALLOC_API void torchalloc_set_memory_fraction(double fraction, int device) {
  ta_heap *h = heap_for_control(device);
  if (!h) {
    fprintf(stderr, "torchalloc: error: set_memory_fraction: %s\n", last_error);
    return;
  }
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    ta_set_error("memory fraction %g is outside (0, 1]", fraction);
    fprintf(stderr, "torchalloc: error: %s\n", last_error);
    return;
  }
  size_t free_b = 0, total = 0;
  if (g.backend->ops->mem_info(g.backend, device, &free_b, &total) != TA_OK) {
    ta_set_error("cannot read the memory size of device %d", device);
    fprintf(stderr, "torchalloc: error: %s\n", last_error);
    return;
  }
  ta_heap_set_limit(h, (size_t)(fraction * (double)total));
}

TORCHALLOC_API void torchalloc_reset(void) { torchalloc_empty_cache(-1); }

TORCHALLOC_API void torchalloc_init_devices(int device_count) {
  if (!ensure_ready()) return;
  for (int d = 0; d < device_count && d < g.ndevices; d++)
    if (!heap_for(d)) fprintf(stderr, "torchalloc: error: cannot prepare the heap of device %d\n", d);
}

TORCHALLOC_API int torchalloc_check_invariants(int device) {
  ta_heap *h = heap_for_control(device);
  if (!h) return -1;
  char err[512];
  if (ta_heap_check(h, err, sizeof err)) {
    set_error(err);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------------
 * Phases (the stack lives in phase.c; accounting in each heap)
 * ---------------------------------------------------------------------- */

void ta_heaps_phase_ended(int phase, uint32_t epoch) {
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = atomic_load(&g.heaps[d]);
    if (h) ta_heap_phase_ended(h, phase, epoch);
  }
}

static int phase_in_range(int phase) {
  if (phase >= 0 && phase < torchalloc_phase_count()) return 1;
  ta_set_error("phase id %d is out of range (%d phases)", phase, torchalloc_phase_count());
  return 0;
}

TORCHALLOC_API int torchalloc_get_phase_stats(int device, int phase, torchalloc_phase_stats *out) {
  ta_heap *h = heap_for_control(device);
  if (!h || !out || !phase_in_range(phase)) return -1;
  ta_heap_get_phase_stats(h, phase, out);
  out->occurrences = ta_phase_occurrences(phase); /* counted once per process, not per heap */
  return 0;
}

TORCHALLOC_API int64_t torchalloc_arena_reserved(int device, int phase) {
  ta_heap *h = heap_for_control(device);
  if (!h || (phase != -1 && !phase_in_range(phase))) return -1;
  return ta_heap_arena_reserved(h, phase);
}

TORCHALLOC_API int64_t torchalloc_arena_trim(int device, int phase) {
  ta_heap *h = heap_for_control(device);
  if (!h || (phase != -1 && !phase_in_range(phase))) return -1;
  return ta_heap_arena_release(h, phase);
}

/* ------------------------------------------------------------------------
 * Event log (the writer is log.c; here because closing needs the heaps)
 * ---------------------------------------------------------------------- */

TORCHALLOC_API int torchalloc_log_open(const char *path) {
  char err[512];
  pthread_mutex_lock(&g.lock);
  log_close_quiesced();
  size_t max = atomic_load(&g.state) == STATE_READY ? g.conf.log_max : 0;
  int rc = ta_log_open(path, max, err, sizeof err);
  pthread_mutex_unlock(&g.lock);
  if (rc) set_error(err);
  return rc;
}

TORCHALLOC_API void torchalloc_log_close(void) {
  pthread_mutex_lock(&g.lock);
  log_close_quiesced();
  pthread_mutex_unlock(&g.lock);
}

TORCHALLOC_API const char *torchalloc_log_path(void) { return ta_log_path(); }
