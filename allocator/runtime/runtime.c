/* The process-wide state (runtime.h): init, teardown, heaps, the log. */
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/errors.h"
#include "log/log.h"
#include "accounting/misuse.h"
#include "context/phase.h"
#include "context/pystack.h"

ta_runtime ta_rt = {.lock = TA_MUTEX_INIT};

/* ------------------------------------------------------------------------
 * Init / teardown (callers hold ta_rt.lock: each says TA_REQUIRES)
 * ---------------------------------------------------------------------- */

/* Every heap's lock taken, or released: a lock per heap, which the
 * analysis cannot count, so these two are not analysed. */
static TA_NO_THREAD_SAFETY_ANALYSIS void lock_every_heap(void) {
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h) ta_lock_acquire(&h->lock);
  }
}

static TA_NO_THREAD_SAFETY_ANALYSIS void unlock_every_heap(void) {
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h) ta_lock_release(&h->lock);
  }
}

/* Close the event log once no writer can be inside it: heap-locked
 * writers check ta_log_on() under their heap's lock, so after logging is
 * off, taking each heap lock once waits out the last of them (log_file.h). */
static void log_close_quiesced(void) TA_REQUIRES(ta_rt.lock) {
  if (!ta_log_stop()) return;
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h) {
      ta_lock_acquire(&h->lock);
      ta_lock_release(&h->lock);
    }
  }
  ta_log_close();
}

/* ------------------------------------------------------------------------
 * The log at exit. A process that exits normally (returns from main, calls
 * exit, or Python finalises) closes its log: the END record, the file cut
 * to its length, the lock released. Without this the log says "not closed"
 * like a killed one and keeps its 16 MiB preallocation. Closing touches no
 * device (PyTorch may have torn CUDA down already) and nothing in a forked
 * child (the log is its parent's). Other threads may still run: they are
 * waited for a bounded time, and one stuck holding a lock leaves the log
 * open (as a killed process would) rather than the exit hung.
 * ---------------------------------------------------------------------- */

#define EXIT_WAIT_TRIES 1000 /* of 1 ms */

static void pause_1ms(void) {
  struct timespec ms = {0, 1000000};
  nanosleep(&ms, NULL);
}

/* Taken within the bound: 1 (the analysis takes these two on trust, as
 * the locks' own functions). */
static TA_NO_THREAD_SAFETY_ANALYSIS int heap_lock_bounded(ta_lock *l) TA_TRY_ACQUIRE(1, *l) {
  for (int i = 0; i < EXIT_WAIT_TRIES; i++) {
    if (ta_lock_try(l)) return 1;
    pause_1ms();
  }
  return 0;
}

static TA_NO_THREAD_SAFETY_ANALYSIS int runtime_lock_bounded(void) TA_TRY_ACQUIRE(1, ta_rt.lock) {
  for (int i = 0; i < EXIT_WAIT_TRIES; i++) {
    if (ta_mutex_try(&ta_rt.lock)) return 1;
    pause_1ms();
  }
  return 0;
}

static void close_log_at_exit(void) {
  if (!ta_log_file_is_ours() || !runtime_lock_bounded()) return;
  int quiet = ta_log_stop(); /* 0: closed meanwhile */
  for (int d = 0; quiet && d < TA_MAX_DEVICES; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (!h) continue;
    if (heap_lock_bounded(&h->lock)) ta_lock_release(&h->lock);
    else quiet = 0;
  }
  if (quiet) ta_log_close();
  ta_mutex_unlock(&ta_rt.lock);
}

static void register_exit_close_once(void) { atexit(close_log_at_exit); }

static void register_exit_close(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_exit_close_once);
}

/* ------------------------------------------------------------------------
 * fork(). The child is a copy of the process with only the forking thread
 * in it: a lock another thread held at that moment stays held there for
 * ever, and the child's first malloc would spin on it (a DataLoader worker
 * forked while the autograd engine allocates). So the forking thread takes
 * every lock of the library first, in the order the rest of the code
 * nests them, which cannot deadlock with them: the runtime mutex (init,
 * heap creation, log open), each heap's lock by device (log_open_locked
 * holds them all while it takes the phase lock), the phase lock (it logs
 * under the log's mutex), the log's mutexes, and last the stack cache's
 * lock (a leaf). With all of them held no operation is half done, so both
 * processes just release them; the child also stops logging into its
 * parent's file (ta_log_fork_child). Registered when the library loads, so
 * a fork before first use is covered too.
 * ---------------------------------------------------------------------- */

static ta_heap *fork_held[TA_MAX_DEVICES] TA_GUARDED_BY(ta_rt.lock); /* the heaps locked by fork_prepare */

/* Every lock is left held for the handler after the fork to release: across
 * fork(), and a lock per heap, which the analysis cannot follow. */
static TA_NO_THREAD_SAFETY_ANALYSIS void fork_prepare(void) {
  ta_mutex_lock(&ta_rt.lock); /* from here no heap is created or destroyed */
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    fork_held[d] = ta_runtime_heap_if_any(d);
    if (fork_held[d]) ta_lock_acquire(&fork_held[d]->lock);
  }
  ta_phase_fork_prepare();
  ta_log_fork_prepare();
  ta_pystack_fork_prepare();
}

static TA_NO_THREAD_SAFETY_ANALYSIS void fork_release_heaps(void) {
  for (int d = TA_MAX_DEVICES - 1; d >= 0; d--)
    if (fork_held[d]) ta_lock_release(&fork_held[d]->lock);
}

static void fork_parent(void) TA_RELEASE(ta_rt.lock) {
  ta_pystack_fork_release();
  ta_log_fork_parent();
  ta_phase_fork_release();
  fork_release_heaps();
  ta_mutex_unlock(&ta_rt.lock);
}

static void fork_child(void) TA_RELEASE(ta_rt.lock) {
  ta_pystack_fork_release();
  ta_log_fork_child();
  ta_phase_fork_release();
  fork_release_heaps();
  ta_mutex_unlock(&ta_rt.lock);
}

__attribute__((constructor)) static void register_fork_handlers(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Open the log with the phases open now written first (phase.h). Block
 * writers are held off meanwhile, each heap's lock held: a record tagged
 * with an open phase's occurrence must not precede its phase_begin. */
static int log_open_locked(const char *path, size_t max_bytes, char *err, size_t errlen) TA_REQUIRES(ta_rt.lock) {
  lock_every_heap();
  int rc = ta_phase_open_log(path, max_bytes, err, errlen);
  unlock_every_heap();
  if (rc == 0) register_exit_close();
  return rc;
}

static void destroy_all_locked(void) TA_REQUIRES(ta_rt.lock) {
  log_close_quiesced();
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap_destroy(ta_runtime_heap_if_any(d));
    atomic_store(&ta_rt.heaps[d], NULL);
  }
  if (ta_rt.backend) ta_rt.backend->ops->destroy(ta_rt.backend);
  ta_rt.backend = NULL;
  ta_rt.ndevices = 0;
  ta_phase_reset();
  atomic_store(&ta_rt.state, TA_STATE_UNINIT);
}

static ta_backend *create_backend(const ta_config *conf, char *err, size_t errlen) {
  if (conf->backend != TA_BACKEND_SIM) return ta_backend_cuda_create(err, errlen);
  ta_sim_options opts = {.devices = conf->sim_devices, .capacity = conf->sim_capacity,
                         .fail_alloc_at = conf->sim_fail_alloc, .event_polls = conf->sim_event_polls,
                         .held_elsewhere = conf->sim_held_elsewhere, .no_vmm = !conf->sim_vmm,
                         .lag = conf->sim_lag};
  ta_backend *backend = ta_backend_sim_create(&opts);
  if (!backend) snprintf(err, errlen, "cannot create the sim backend");
  return backend;
}

/* Make `conf` and `backend` the process state (the old state is gone). */
static int install_locked(const ta_config *conf, ta_backend *backend, char *err, size_t errlen)
    TA_REQUIRES(ta_rt.lock) {
  if (conf->log_path[0] && log_open_locked(conf->log_path, conf->log_max, err, errlen)) {
    backend->ops->destroy(backend);
    return -1;
  }
  int n = backend->ops->device_count(backend);
  ta_rt.conf = *conf;
  ta_rt.backend = backend;
  ta_rt.ndevices = n < TA_MAX_DEVICES ? n : TA_MAX_DEVICES;
  atomic_store(&ta_rt.bad_device, 0);
  atomic_store(&ta_rt.devices_in_use, 0);
  atomic_store(&ta_rt.routing, 0);
  ta_misuse_reset();
  atomic_store(&ta_rt.state, TA_STATE_READY);
  return 0;
}

static int init_locked(const char *text, char *err, size_t errlen) TA_REQUIRES(ta_rt.lock) {
  ta_config conf;
  ta_config_defaults(&conf);
  if (ta_config_parse(&conf, text, err, errlen)) return -1;
  ta_backend *backend = create_backend(&conf, err, errlen);
  return backend ? install_locked(&conf, backend, err, errlen) : -1;
}

/* Every allocation fails from now on, for `reason`. `conf` still says how a
 * failure is answered (oom:null or abort): written before the state, so a
 * caller that saw BROKEN reads it (ta_runtime_ready). */
static void mark_broken_locked(const ta_config *conf, const char *reason) TA_REQUIRES(ta_rt.lock) {
  ta_rt.conf = *conf;
  snprintf(ta_rt.broken_reason, sizeof ta_rt.broken_reason, "%s", reason);
  atomic_store(&ta_rt.state, TA_STATE_BROKEN);
}

/* A bad config is printed once and every allocation refused, never guessed
 * at; the keys that say how to fail (oom, backend) are still obeyed. */
ta_noinline int ta_runtime_ensure_ready_slow(void) {
  ta_mutex_lock(&ta_rt.lock);
  if (atomic_load(&ta_rt.state) == TA_STATE_UNINIT) {
    char err[512];
    const char *text = getenv("TORCHALLOC_CONF");
    if (init_locked(text, err, sizeof err)) {
      ta_config failing;
      ta_config_defaults(&failing);
      ta_config_salvage(&failing, text);
      mark_broken_locked(&failing, err);
      fprintf(stderr, "torchalloc: error: %s; every allocation will fail until this is fixed\n", err);
    }
  }
  int ok = atomic_load(&ta_rt.state) == TA_STATE_READY;
  ta_mutex_unlock(&ta_rt.lock);
  return ok;
}

/* peers:all: device `peer` may reach `h`'s memory when it has a path to
 * it at all (without one, copies go through the host: nothing to grant). */
static void grant_if_reachable_locked(ta_heap *h, int peer) TA_REQUIRES(ta_rt.lock) {
  char why[256];
  if (peer != h->device && ta_rt.backend->ops->peer_capable(ta_rt.backend, h->device, peer) &&
      ta_heap_grant_peer(h, peer, why, sizeof why))
    fprintf(stderr, "torchalloc: warning: %s\n", why);
}

/* peers:all: every device in use may reach `h`'s memory. */
static void grant_in_use_locked(ta_heap *h) TA_REQUIRES(ta_rt.lock) {
  uint64_t in_use = atomic_load(&ta_rt.devices_in_use);
  for (int d = 0; d < ta_rt.ndevices; d++)
    if (in_use >> d & 1) grant_if_reachable_locked(h, d);
}

/* The first memory handed out on `device`: granted access to every other
 * device's memory, then marked, all under the runtime's lock, so no thread
 * sees it marked before its grants are done (a copy to another GPU may
 * follow the allocation at once). */
ta_noinline void ta_runtime_device_in_use_slow(int device) {
  if (device < 0 || device >= TA_MAX_DEVICES || ta_rt.conf.peers != TA_PEERS_ALL) {
    if (device >= 0 && device < TA_MAX_DEVICES) atomic_fetch_or(&ta_rt.devices_in_use, (unsigned long long)1 << device);
    return;
  }
  ta_mutex_lock(&ta_rt.lock);
  if (!(atomic_load(&ta_rt.devices_in_use) >> device & 1)) {
    for (int d = 0; d < ta_rt.ndevices; d++) {
      ta_heap *h = ta_runtime_heap_if_any(d);
      if (h) grant_if_reachable_locked(h, device);
    }
    atomic_fetch_or(&ta_rt.devices_in_use, (unsigned long long)1 << device);
    ta_heap *own = ta_runtime_heap_if_any(device);
    if (own) grant_in_use_locked(own);
  }
  ta_mutex_unlock(&ta_rt.lock);
}

ta_noinline ta_heap *ta_runtime_heap_slow(int device) {
  if (!ta_runtime_ready()) return NULL;
  if (device < 0 || device >= ta_rt.ndevices) return NULL;
  ta_mutex_lock(&ta_rt.lock);
  ta_heap *h = atomic_load(&ta_rt.heaps[device]);
  if (!h && atomic_load(&ta_rt.state) == TA_STATE_READY) {
    char err[256];
    h = ta_heap_create(ta_rt.backend, device, &ta_rt.conf, &(ta_heap_options){.logged = 1}, err, sizeof err);
    if (h) h->routing_anywhere = &ta_rt.routing;
    if (h && ta_rt.conf.peers == TA_PEERS_ALL) grant_in_use_locked(h); /* no mapping yet: it only names them */
    if (h) atomic_store_explicit(&ta_rt.heaps[device], h, memory_order_release);
    else fprintf(stderr, "torchalloc: error: cannot create the heap of device %d: %s\n", device, err);
  }
  ta_mutex_unlock(&ta_rt.lock);
  return h;
}

ta_noinline void ta_runtime_report_bad_device(int device) {
  atomic_fetch_add(&ta_rt.bad_device, 1);
  int warn = atomic_load(&ta_rt.state) == TA_STATE_READY ? ta_rt.conf.warn : 1;
  ta_misuse_report(warn, TA_MISUSE_BAD_DEVICE, "device index %d is out of range (this process has %d devices)",
                   device, ta_rt.ndevices);
}

ta_heap *ta_runtime_heap_for_control(int device) {
  if (!ta_runtime_ready()) {
    ta_set_error("%s", ta_rt.broken_reason);
    return NULL;
  }
  ta_heap *h = device >= 0 && device < ta_rt.ndevices ? ta_runtime_heap(device) : NULL;
  if (!h) ta_set_error("device index %d is out of range (this process has %d devices)", device, ta_rt.ndevices);
  return h;
}

int ta_runtime_stream_capturing(int device, cudaStream_t stream) {
  ta_backend *b = ta_rt.backend;
  return b && (unsigned)device < (unsigned)ta_rt.ndevices && b->ops->stream_capturing(b, device, stream);
}

/* ------------------------------------------------------------------------
 * Settings every heap takes, and heaps made later with them
 * ---------------------------------------------------------------------- */

int ta_runtime_set_policy(const char *name) {
  if (!name || !ta_policy_by_name(name, NULL)) {
    ta_set_error("unknown policy '%s' (expected %s)", name ? name : "(null)", ta_policy_choices());
    return -1;
  }
  if (!ta_runtime_ready()) return -1;
  ta_mutex_lock(&ta_rt.lock);
  snprintf(ta_rt.conf.policy, sizeof ta_rt.conf.policy, "%s", name); /* heaps made later start with it */
  int rc = 0;
  for (int d = 0; d < ta_rt.ndevices; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h && ta_heap_set_policy(h, name)) rc = -1;
  }
  ta_mutex_unlock(&ta_rt.lock);
  if (rc) ta_set_error("out of host memory while creating the policy");
  return rc;
}

int ta_runtime_set_allocator_settings(const char *settings) {
  if (!ta_runtime_ready()) return -1;
  char err[256];
  ta_mutex_lock(&ta_rt.lock);
  ta_roundup r;
  int reuse = ta_rt.conf.capture_reuse;
  int rc = ta_roundup_from_pytorch_settings(settings, &r, &reuse, err, sizeof err);
  if (rc == 0) {
    ta_rt.conf.roundup = r; /* heaps made later start with them */
    ta_rt.conf.capture_reuse = reuse;
    for (int d = 0; d < ta_rt.ndevices; d++) {
      ta_heap *h = ta_runtime_heap_if_any(d);
      if (h) ta_heap_set_pytorch_settings(h, &r, reuse);
    }
  }
  ta_mutex_unlock(&ta_rt.lock);
  if (rc) ta_set_error("%s", err);
  return rc;
}

void ta_runtime_routing_begin(ta_heap *h) {
  atomic_fetch_add(&ta_rt.routing, 1); /* before the heap's: no device free slips in between */
  ta_heap_routing_begin(h);
}

int ta_runtime_routing_end(ta_heap *h) {
  atomic_fetch_sub(&ta_rt.routing, 1); /* first: the heap hands back what waited for the last capture to end */
  if (ta_heap_routing_end(h)) {
    atomic_fetch_add(&ta_rt.routing, 1);
    ta_set_error("torchalloc_routing_end(%d) without a matching torchalloc_routing_begin", h->device);
    return -1;
  }
  return 0;
}

static int any_live_locked(void) TA_REQUIRES(ta_rt.lock) {
  for (int d = 0; d < TA_MAX_DEVICES; d++) {
    ta_heap *h = ta_runtime_heap_if_any(d);
    if (h && ta_heap_live_blocks(h)) return 1;
  }
  return 0;
}

int ta_runtime_init(const char *text) {
  char err[512];
  ta_config next;
  ta_config_defaults(&next);
  if (ta_config_parse(&next, text, err, sizeof err)) {
    ta_set_error("%s", err);
    return -1;
  }
  ta_mutex_lock(&ta_rt.lock);
  if (any_live_locked()) {
    ta_mutex_unlock(&ta_rt.lock);
    ta_set_error("torchalloc_init: blocks are still allocated; free them (or call torchalloc_teardown) first");
    return -1;
  }
  /* Build the new backend before tearing the old state down: a failure
   * (no GPU for backend:cuda, say) leaves what worked in place. */
  ta_backend *backend = create_backend(&next, err, sizeof err);
  int rc = -1;
  if (backend) {
    destroy_all_locked();
    rc = install_locked(&next, backend, err, sizeof err);
    /* The old state is gone (the log could not be opened, say): fail every
     * allocation with this reason rather than fall back, at the next one,
     * to whatever $TORCHALLOC_CONF says. */
    if (rc) mark_broken_locked(&next, err);
  }
  ta_mutex_unlock(&ta_rt.lock);
  if (rc) ta_set_error("%s", err);
  return rc;
}

void ta_runtime_teardown(void) {
  ta_mutex_lock(&ta_rt.lock);
  destroy_all_locked();
  ta_mutex_unlock(&ta_rt.lock);
}

/* The report goes into the directory oom_report names when it names one;
 * else beside the log when there is one (a user who has the log of a
 * crashed job finds it there); else into the working directory. When the
 * chosen place cannot be written, a new file of a unique name in /tmp
 * (never a predictable path another user could plant a link at). */
static void oom_report_path(int device, int fallback, char *buf, size_t len) {
  const char *log = ta_log_path(), *dir = ta_rt.conf.oom_report;
  int n;
  if (fallback) n = snprintf(buf, len, "/tmp/torchalloc-oom-%ld-cuda%d-XXXXXX.txt", (long)getpid(), device);
  else if (dir[0]) n = snprintf(buf, len, "%s/torchalloc-oom-%ld-cuda%d.txt", dir, (long)getpid(), device);
  else if (log) n = snprintf(buf, len, "%s.oom-cuda%d.txt", log, device);
  else n = snprintf(buf, len, "torchalloc-oom-%ld-cuda%d.txt", (long)getpid(), device);
  /* A path cut short would name some other file: "" cannot be opened, so
   * the caller falls back to /tmp. */
  if (n < 0 || (size_t)n >= len) buf[0] = '\0';
}

ta_noinline void ta_runtime_after_oom(ta_heap *h) {
  ta_oom_info oom;
  ta_heap_last_oom(h, &oom);
  if (!oom.count) return;
  char path[1024];
  for (int fallback = 0; fallback < 2 && !oom.report_path[0] && strcmp(ta_rt.conf.oom_report, "off") != 0;
       fallback++) {
    oom_report_path(h->device, fallback, path, sizeof path);
    ta_heap_write_oom_report(h, path);
    ta_heap_last_oom(h, &oom);
  }
  if (ta_rt.conf.warn && ta_config_oom_action(&ta_rt.conf) == TA_OOM_NULL) {
    char text[TA_OOM_SUMMARY_MAX];
    ta_heap_format_oom(&oom, h->device, text, sizeof text);
    fprintf(stderr, "torchalloc: %s\n", text);
  }
}

int ta_runtime_log_open(const char *path) {
  char err[512];
  ta_mutex_lock(&ta_rt.lock);
  log_close_quiesced();
  size_t max = atomic_load(&ta_rt.state) == TA_STATE_READY ? ta_rt.conf.log_max : 0;
  int rc = log_open_locked(path, max, err, sizeof err);
  ta_mutex_unlock(&ta_rt.lock);
  if (rc) ta_set_error("%s", err);
  return rc;
}

void ta_runtime_log_close(void) {
  ta_mutex_lock(&ta_rt.lock);
  log_close_quiesced();
  ta_mutex_unlock(&ta_rt.lock);
}
