/* Concurrency stress, meant for ThreadSanitizer (build-tsan/ in run.sh) but
 * useful everywhere: four threads malloc and free their own blocks on their
 * own stream and on one shared stream; thread 0 also reads stats, empties
 * the cache, begins/ends phases and switches policy now and then.
 *
 * Besides TSan's race reports, the test checks that no address is ever live
 * twice across threads: every returned block is entered in a lock-free set
 * of live addresses (a CAS from empty; finding the address already there is
 * a failure) and leaves it before it is freed. At the end the invariants
 * hold and every allocated-bytes stat is back to zero.
 *
 * TA_THREAD_OPS overrides the operations per thread. */
#include <pthread.h>
#include <stdatomic.h>

#include "live_set.h" /* 1 << 20 slots: more than every insert of 4 x 100000 ops */
#include "sim.h"
#include "thread_workload.h"

#define NTHREADS 4
#define MAX_OWN 64

static const cudaStream_t own_streams[NTHREADS] = {
    (cudaStream_t)0x1000, (cudaStream_t)0x2000, (cudaStream_t)0x3000, (cudaStream_t)0x4000};
#define SHARED_STREAM ((cudaStream_t)0x9000)

static atomic_int control_errors; /* a control call that failed */
static atomic_long ops_done;
static long ops_per_thread;
static pthread_barrier_t start;

typedef struct own_block {
  void *ptr;
  size_t size;
  cudaStream_t stream;
} own_block;

typedef struct worker {
  int id;
  uint64_t rng;
  own_block own[MAX_OWN];
  int nown;
  int depth; /* thread 0's phase depth */
} worker;

static uint64_t next_rand(worker *w) { return workload_rand(&w->rng); }
static size_t draw_size(worker *w) { return workload_size(&w->rng); }

static void free_one(worker *w, int i) {
  own_block b = w->own[i];
  set_remove((uintptr_t)b.ptr);
  torchalloc_free(b.ptr, b.size, 0, b.stream);
  w->own[i] = w->own[--w->nown];
}

static void control_op(worker *w, long op) {
  static const char *const policies[] = {"caching", "exact", "phase_arena"};
  static const char *const phases[] = {"forward", "backward", "optimizer"};
  switch (next_rand(w) % 5) {
    case 0: {
      torchalloc_stats s;
      if (torchalloc_get_stats(0, &s) != 0 || s.allocation[ALL].current < 0 ||
          s.allocated_bytes[ALL].current > s.reserved_bytes[ALL].current)
        atomic_fetch_add(&control_errors, 1);
      break;
    }
    case 1:
      if (torchalloc_empty_cache(0) < 0) atomic_fetch_add(&control_errors, 1);
      break;
    case 2:
      if (w->depth < 2) {
        if (torchalloc_phase_begin(phases[op % 3]) < 0) atomic_fetch_add(&control_errors, 1);
        else w->depth++;
      } else if (torchalloc_phase_end(NULL) != 0) {
        atomic_fetch_add(&control_errors, 1);
      } else {
        w->depth--;
      }
      break;
    case 3:
      if (w->depth > 0) {
        if (torchalloc_phase_end(NULL) != 0) atomic_fetch_add(&control_errors, 1);
        else w->depth--;
      }
      break;
    case 4:
      if (torchalloc_set_policy(policies[next_rand(w) % 3]) != 0) atomic_fetch_add(&control_errors, 1);
      break;
  }
}

static void *worker_main(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(&start);
  for (long op = 0; op < ops_per_thread; op++) {
    if (w->id == 0 && op % 16 == 0) control_op(w, op);
    int do_malloc = w->nown == 0 || (w->nown < MAX_OWN && next_rand(w) % 2 == 0);
    if (do_malloc) {
      size_t size = draw_size(w);
      cudaStream_t stream = next_rand(w) % 3 == 0 ? SHARED_STREAM : own_streams[w->id];
      void *p = torchalloc_malloc(size, 0, stream);
      if (p) {
        set_insert((uintptr_t)p);
        w->own[w->nown++] = (own_block){p, size, stream};
      }
    } else {
      free_one(w, (int)(next_rand(w) % (uint64_t)w->nown));
    }
  }
  while (w->nown > 0) free_one(w, w->nown - 1);
  while (w->id == 0 && w->depth > 0) {
    if (torchalloc_phase_end(NULL) != 0) atomic_fetch_add(&control_errors, 1);
    w->depth--;
  }
  atomic_fetch_add(&ops_done, ops_per_thread);
  return NULL;
}

TEST(four_threads_malloc_free_and_control_concurrently) {
  const char *env = getenv("TA_THREAD_OPS");
  ops_per_thread = env && *env ? strtol(env, NULL, 10) : 100000;
  REQUIRE(sim_reset("") == 0);
  set_clear();
  atomic_store(&control_errors, 0);
  atomic_store(&ops_done, 0);
  static worker workers[NTHREADS];
  RUN_WORKERS(workers, NTHREADS, worker_main, 0x5EED0000ull, start);

  CHECK_EQ(atomic_load(&duplicates), 0);
  CHECK_EQ(atomic_load(&set_errors), 0);
  CHECK_EQ(atomic_load(&control_errors), 0);
  CHECK_EQ(atomic_load(&ops_done), NTHREADS * ops_per_thread);
  CHECK_INVARIANTS();
  torchalloc_stats s = stats0();
  for (int pool = 0; pool < TORCHALLOC_NPOOLS; pool++) {
    CHECK_EQ(s.allocation[pool].current, 0);
    CHECK_EQ(s.allocated_bytes[pool].current, 0);
    CHECK_EQ(s.requested_bytes[pool].current, 0);
    CHECK_EQ(s.active[pool].current, 0);
    CHECK_EQ(s.active_bytes[pool].current, 0);
  }
  CHECK_EQ(s.allocation[ALL].allocated, s.allocation[ALL].freed);
  CHECK_EQ(s.num_bad_free_unknown + s.num_bad_double_free + s.num_bad_free_size, 0);
  CHECK_EQ(torchalloc_phase_current(), 0);
  CHECK(torchalloc_empty_cache(0) >= 0);
  s = stats0();
  CHECK_EQ(s.reserved_bytes[ALL].current, 0);
  CHECK_EQ(s.segment[ALL].current, 0);
  CHECK_INVARIANTS();
  printf("     %d threads x %ld operations, %lld allocations, %lld device allocations\n", NTHREADS, ops_per_thread,
         (long long)s.allocation[ALL].allocated, (long long)s.num_device_alloc);
}
