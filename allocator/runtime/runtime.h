/* The process-wide state behind the public API: the config, the backend
 * and one heap per device.
 *
 * Initialisation is lazy (first call) and guarded by one mutex; after that
 * the fast path reads an atomic heap pointer and goes straight to the heap.
 * The public functions (allocator/api/) sit above this file; the heaps,
 * the log and the phases below it. */
#ifndef TA_RUNTIME_H
#define TA_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>

#include "heap/heap.h"

#define TA_MAX_DEVICES 64

enum { TA_STATE_UNINIT = 0, TA_STATE_READY = 1, TA_STATE_BROKEN = -1 };

typedef struct ta_runtime {
  ta_mutex lock; /* init, teardown, heap creation, log open/close */
  atomic_int state;
  ta_config conf;
  ta_backend *backend;
  int ndevices;
  _Atomic(ta_heap *) heaps[TA_MAX_DEVICES];
  atomic_llong bad_device; /* no heap to count it in */
  /* Devices this process has allocated on (bit d: device d), each set once
   * the other devices' memory grants it access (peers:all): a device
   * that never holds memory of this process never runs its kernels or
   * copies, and access for it would only make every map and unmap dearer
   * (bench/vmm_costs.c --peers: twice to three times a handle). */
  atomic_ullong devices_in_use;
  atomic_int routing; /* routing contexts open on every heap (heap_state.h, routing_anywhere) */
  char broken_reason[512];
} ta_runtime;

ta_internal extern ta_runtime ta_rt;

/* The functions below that may take the runtime's lock say TA_EXCLUDES: a
 * caller holding it (the runtime's own *_locked functions) would wait on
 * itself for ever. */

/* First use without torchalloc_init(): configure from TORCHALLOC_CONF. */
ta_internal int ta_runtime_ensure_ready_slow(void) TA_EXCLUDES(ta_rt.lock);

static inline int ta_runtime_ready(void) TA_EXCLUDES(ta_rt.lock);
static inline int ta_runtime_ready(void) {
  return ta_likely(atomic_load_explicit(&ta_rt.state, memory_order_acquire) == TA_STATE_READY) ||
         ta_runtime_ensure_ready_slow();
}

ta_internal ta_heap *ta_runtime_heap_slow(int device) TA_EXCLUDES(ta_rt.lock);

/* The heap of `device`, created on first use; NULL for a bad device. */
static inline ta_heap *ta_runtime_heap(int device) TA_EXCLUDES(ta_rt.lock);
static inline ta_heap *ta_runtime_heap(int device) {
  if (ta_likely((unsigned)device < TA_MAX_DEVICES)) {
    ta_heap *h = atomic_load_explicit(&ta_rt.heaps[device], memory_order_acquire);
    if (ta_likely(h != NULL)) return h;
  }
  return ta_runtime_heap_slow(device);
}

/* The heap if it exists already (walks over devices), else NULL. */
static inline ta_heap *ta_runtime_heap_if_any(int device) { return atomic_load(&ta_rt.heaps[device]); }

ta_internal void ta_runtime_device_in_use_slow(int device) TA_EXCLUDES(ta_rt.lock);

/* After memory was handed out on `device`: under peers:all, the first time,
 * every other device's memory (its mappings, old and new) becomes
 * reachable from it, and its own from every device in use. */
static inline void ta_runtime_device_in_use(int device) TA_EXCLUDES(ta_rt.lock);
static inline void ta_runtime_device_in_use(int device) {
  if (ta_likely(atomic_load_explicit(&ta_rt.devices_in_use, memory_order_acquire) >> device & 1)) return;
  ta_runtime_device_in_use_slow(device);
}

/* What the public functions read of the process state. The configuration,
 * the backend and the device count are written under the runtime's lock and
 * published by the state (ta_runtime_ready's acquire): read them after it. */
static inline int ta_runtime_state(void) { return atomic_load(&ta_rt.state); }
static inline const ta_config *ta_runtime_conf(void) { return &ta_rt.conf; }
static inline ta_backend *ta_runtime_backend(void) { return ta_rt.backend; }
static inline int ta_runtime_device_count(void) { return ta_rt.ndevices; }
/* Why every allocation fails (TA_STATE_BROKEN): the configuration's error. */
static inline const char *ta_runtime_broken_reason(void) { return ta_rt.broken_reason; }
/* Requests for devices this process does not have, counted here: there is no heap to count them in. */
static inline int64_t ta_runtime_bad_devices(void) { return atomic_load(&ta_rt.bad_device); }
/* 1 when `stream` of `device` captures a CUDA graph now (0 before set-up). */
ta_internal int ta_runtime_stream_capturing(int device, cudaStream_t stream);

/* torchalloc_set_policy: the policy of every heap, and of heaps made later.
 * 0, or -1 with ta_set_error. */
ta_internal int ta_runtime_set_policy(const char *name) TA_EXCLUDES(ta_rt.lock);
/* torchalloc_set_allocator_settings: PyTorch's settings string, on every
 * heap and on heaps made later. 0, or -1 with ta_set_error. */
ta_internal int ta_runtime_set_allocator_settings(const char *settings) TA_EXCLUDES(ta_rt.lock);
/* A routing context (a graph capture or use_mem_pool) opens / closes on
 * `h`: counted process-wide too (routing_anywhere). The end is -1, with
 * ta_set_error, when no context is open on `h`. */
ta_internal void ta_runtime_routing_begin(ta_heap *h);
ta_internal int ta_runtime_routing_end(ta_heap *h);

/* A heap for a control call, or NULL with ta_set_error. */
ta_internal ta_heap *ta_runtime_heap_for_control(int device) TA_EXCLUDES(ta_rt.lock);
/* Counted process-wide and printed once: there is no heap to count it in. */
ta_internal void ta_runtime_report_bad_device(int device);

/* torchalloc_init / torchalloc_teardown (runtime.c says what they keep). */
ta_internal int ta_runtime_init(const char *conf_text) TA_EXCLUDES(ta_rt.lock);
ta_internal void ta_runtime_teardown(void) TA_EXCLUDES(ta_rt.lock);
/* After a request of `h` failed: write the OOM report file (beside the log,
 * else in the working directory, else /tmp) and, with warn and oom:null,
 * print the summary. Outside any lock. */
ta_internal void ta_runtime_after_oom(ta_heap *h);

/* Open / close the event log once no writer can be inside it. */
ta_internal int ta_runtime_log_open(const char *path) TA_EXCLUDES(ta_rt.lock);
ta_internal void ta_runtime_log_close(void) TA_EXCLUDES(ta_rt.lock);

#endif
