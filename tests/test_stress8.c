/* Eight-thread stress of every feature at once, meant for ThreadSanitizer
 * (build-tsan/ in run.sh) but run in every build. test_threads.c covers
 * malloc/free with control calls from one thread on one device; here all
 * eight threads allocate and free on two sim devices, on their own stream,
 * a shared one and the default one, and hand some blocks to record_stream
 * (with event polls on, so the frees are really deferred), while four of
 * them also own one kind of control each, concurrently with everything:
 *   thread 0: stats, invariant checks of both devices, empty_cache, trim;
 *   thread 1: phases (the phase stack is process-wide: one owner keeps its
 *             depth known);
 *   thread 2: policy switches;
 *   thread 3: the log opened and closed, markers written while it is open.
 * No address may be live twice (live_set.h); at the end every block is
 * back, both devices' invariants hold, and empty_cache returns all memory.
 *
 * TA_THREAD_OPS overrides the operations per thread (default 25000). */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "live_set.h" /* 1 << 20 slots: more than every insert of 8 x 25000 ops */
#include "sim.h"
#include "thread_workload.h"

#define NTHREADS 8
#define NDEVICES 2
#define MAX_OWN 48
#define SHARED_STREAM ((cudaStream_t)0x9000)

static atomic_int control_errors; /* a control call that failed, or a check that did not hold */
static atomic_long ops_done, deferred, log_toggles, policy_switches, phase_changes, checks;
static long ops_per_thread;
static pthread_barrier_t start;
static char log_path[128];

typedef struct own_block {
  void *ptr;
  size_t size;
  int device;
  cudaStream_t stream;
} own_block;

typedef struct worker {
  int id;
  uint64_t rng;
  own_block own[MAX_OWN];
  int nown;
  int depth; /* thread 1's phase depth */
} worker;

static uint64_t next_rand(worker *w) { return workload_rand(&w->rng); }
static size_t draw_size(worker *w) { return workload_size(&w->rng); }

static cudaStream_t own_stream(int id) { return (cudaStream_t)(uintptr_t)(0x1000 * (id + 1)); }

static void failed(void) { atomic_fetch_add(&control_errors, 1); }

static void free_one(worker *w, int i) {
  own_block b = w->own[i];
  set_remove((uintptr_t)b.ptr);
  torchalloc_free(b.ptr, b.size, b.device, b.stream);
  w->own[i] = w->own[--w->nown];
}

static void malloc_one(worker *w) {
  int device = (int)(next_rand(w) % NDEVICES);
  uint64_t r = next_rand(w) % 8;
  cudaStream_t stream = r < 4 ? own_stream(w->id) : r < 7 ? SHARED_STREAM : (cudaStream_t)0;
  size_t size = draw_size(w);
  void *p = torchalloc_malloc(size, device, stream);
  if (!p) return; /* an OOM is allowed: 8 threads x 48 blocks of up to 50 MiB can exceed a device */
  set_insert((uintptr_t)p);
  w->own[w->nown++] = (own_block){p, size, device, stream};
  if (next_rand(w) % 8 == 0) { /* used on another thread's stream too: its free waits for that stream's event */
    torchalloc_record_stream(p, own_stream((w->id + 1) % NTHREADS));
    atomic_fetch_add(&deferred, 1);
  }
}

static void control_op(worker *w, long op) {
  static const char *const policies[] = {"caching", "exact", "phase_arena"};
  static const char *const phases[] = {"forward", "backward", "optimizer", "zero_grad"};
  int device = (int)(next_rand(w) % NDEVICES);
  switch (w->id) {
    case 0: {
      torchalloc_stats s;
      if (torchalloc_get_stats(device, &s) != 0 || s.allocation[ALL].current < 0 ||
          s.allocated_bytes[ALL].current > s.reserved_bytes[ALL].current)
        failed();
      if (torchalloc_check_invariants(device) != 0) {
        fprintf(stderr, "  invariants of device %d mid-run: %s\n", device, torchalloc_last_error());
        failed();
      }
      if (op % 64 == 0 && torchalloc_empty_cache(next_rand(w) % 2 ? device : -1) < 0) failed();
      if (op % 64 == 32 && torchalloc_arena_trim(device, -1) < 0) failed();
      atomic_fetch_add(&checks, 1);
      break;
    }
    case 1:
      if (w->depth < 3 && next_rand(w) % 2) {
        if (torchalloc_phase_begin(phases[op % 4]) < 0) failed();
        else w->depth++;
      } else if (w->depth > 0) {
        if (torchalloc_phase_end(NULL) != 0) failed();
        else w->depth--;
      }
      atomic_fetch_add(&phase_changes, 1);
      break;
    case 2:
      if (torchalloc_set_policy(policies[next_rand(w) % 3]) != 0) failed();
      atomic_fetch_add(&policy_switches, 1);
      break;
    case 3:
      if (torchalloc_log_path()) {
        if (next_rand(w) % 2) {
          if (torchalloc_mark("stress") != 0) failed();
        } else {
          torchalloc_log_close();
          atomic_fetch_add(&log_toggles, 1);
        }
      } else if (torchalloc_log_open(log_path) != 0) {
        fprintf(stderr, "  log_open(%s): %s\n", log_path, torchalloc_last_error());
        failed();
      } else {
        atomic_fetch_add(&log_toggles, 1);
      }
      break;
    default:
      break;
  }
}

static void *worker_main(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(&start);
  for (long op = 0; op < ops_per_thread; op++) {
    if (w->id < 4 && op % 16 == w->id) control_op(w, op);
    if (w->nown == 0 || (w->nown < MAX_OWN && next_rand(w) % 2 == 0)) malloc_one(w);
    else free_one(w, (int)(next_rand(w) % (uint64_t)w->nown));
  }
  while (w->nown > 0) free_one(w, w->nown - 1);
  while (w->id == 1 && w->depth > 0) {
    if (torchalloc_phase_end(NULL) != 0) failed();
    w->depth--;
  }
  atomic_fetch_add(&ops_done, ops_per_thread);
  return NULL;
}

TEST(eight_threads_two_devices_streams_phases_policies_and_log_concurrently) {
  const char *env = getenv("TA_THREAD_OPS");
  ops_per_thread = env && *env ? strtol(env, NULL, 10) : 25000;
  snprintf(log_path, sizeof log_path, "/tmp/torchalloc-stress8-%ld.talog", (long)getpid());
  REQUIRE(sim_reset("sim_devices:2,sim_capacity:8GiB,sim_event_polls:2,log_max:1MiB") == 0);
  set_clear();
  atomic_store(&control_errors, 0);
  atomic_store(&ops_done, 0);
  static worker workers[NTHREADS];
  RUN_WORKERS(workers, NTHREADS, worker_main, 0x8EED0000ull, start);
  if (torchalloc_log_path()) torchalloc_log_close();
  unlink(log_path);

  CHECK_EQ(atomic_load(&duplicates), 0);
  CHECK_EQ(atomic_load(&set_errors), 0);
  CHECK_EQ(atomic_load(&control_errors), 0);
  CHECK_EQ(atomic_load(&ops_done), NTHREADS * ops_per_thread);
  CHECK_EQ(torchalloc_phase_current(), 0);
  /* Every feature was really exercised, not skipped by its odds. */
  CHECK(atomic_load(&deferred) > 0);
  CHECK(atomic_load(&log_toggles) > 1);
  CHECK(atomic_load(&policy_switches) > 1);
  CHECK(atomic_load(&phase_changes) > 1);
  CHECK(torchalloc_empty_cache(-1) >= 0); /* synchronizes: deferred frees complete */
  long long allocations = 0;
  for (int d = 0; d < NDEVICES; d++) {
    if (torchalloc_check_invariants(d) != 0) {
      fprintf(stderr, "  invariants of device %d: %s\n", d, torchalloc_last_error());
      g_failures++;
    }
    torchalloc_stats s;
    REQUIRE(torchalloc_get_stats(d, &s) == 0);
    for (int pool = 0; pool < TORCHALLOC_NPOOLS; pool++) {
      CHECK_EQ(s.allocation[pool].current, 0);
      CHECK_EQ(s.allocated_bytes[pool].current, 0);
      CHECK_EQ(s.requested_bytes[pool].current, 0);
      CHECK_EQ(s.active_bytes[pool].current, 0);
    }
    CHECK_EQ(s.allocation[ALL].allocated, s.allocation[ALL].freed);
    CHECK(s.allocation[ALL].allocated > 0);
    CHECK_EQ(s.num_bad_free_unknown + s.num_bad_double_free + s.num_bad_free_size + s.num_bad_free_stream, 0);
    CHECK_EQ(s.reserved_bytes[ALL].current, 0);
    CHECK_EQ(s.segment[ALL].current, 0);
    allocations += (long long)s.allocation[ALL].allocated;
  }
  printf("     %d threads x %ld operations on %d devices: %lld allocations, %ld record_stream, %ld log opens/closes, "
         "%ld policy switches, %ld phase changes, %ld mid-run checks\n",
         NTHREADS, ops_per_thread, NDEVICES, allocations, atomic_load(&deferred), atomic_load(&log_toggles),
         atomic_load(&policy_switches), atomic_load(&phase_changes), atomic_load(&checks));
}
