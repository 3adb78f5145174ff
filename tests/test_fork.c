/* fork() while other threads allocate (issue 23, finding 1).
 *
 * A forked child holds only the forking thread; a lock another thread held
 * at the fork stays held in the child for ever. Before the fork handler took
 * every lock of the library, a child forked while workers allocated spun
 * for ever in its first torchalloc_malloc (a heap lock copied held).
 *
 * Here three workers allocate, free, empty the cache, begin and end phases
 * and write markers into an open log, while the main thread forks again and
 * again. Each child allocates and frees, checks the heap's invariants and
 * stats, uses the phase stack and the log's mutex, and exits. The parent
 * waits for each child a bounded time (a hang is killed and fails the test
 * instead of hanging it); at the end the parent's log holds no record
 * written by any child and every worker's marker. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log_reader.h"

#define WORKERS 3
#define FORKS 50
#define MAX_WAIT_MS 60000 /* a healthy child exits in milliseconds; this only bounds a hang */

static atomic_int stop;
static atomic_long progress;  /* operations the workers have done */
static atomic_long budget;    /* operations they may do so far (the log stays tens of MB) */
static atomic_long markers;   /* markers they wrote */
static atomic_int worker_errors;

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  cudaStream_t stream = (cudaStream_t)(uintptr_t)(0x1000 * (id + 1));
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
  while (!atomic_load(&stop)) {
    if (atomic_load(&progress) >= atomic_load(&budget)) {
      sched_yield();
      continue;
    }
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    size_t size = (size_t)512 << (rng >> 60) % 14; /* 512 B .. 4 MiB: small and large pools, new segments */
    void *p = torchalloc_malloc(size, 0, stream);
    if (!p) atomic_fetch_add(&worker_errors, 1);
    else torchalloc_free(p, size, 0, stream);
    long n = atomic_fetch_add(&progress, 1);
    if (id == 0 && n % 64 == 0) { /* only one thread nests phases: the stack stays in order */
      if (torchalloc_phase_begin("work") < 0 || torchalloc_phase_end("work") != 0)
        atomic_fetch_add(&worker_errors, 1);
    }
    if (id == 1 && n % 97 == 0) {
      torchalloc_mark("worker");
      atomic_fetch_add(&markers, 1);
    }
    if (id == 2) { /* a segment of its own every time: the observer below runs, under the heap lock */
      void *big = torchalloc_malloc(24 * MiB, 0, stream);
      if (big) torchalloc_free(big, 24 * MiB, 0, stream);
      torchalloc_empty_cache(0);
    }
  }
  return NULL;
}

/* Called under the heap lock for each device allocation and release: it
 * holds the lock a while, so that a fork often finds it held (the main
 * thread forks when it sees this running). Only the odds of catching the
 * bug depend on how long; the test passes or fails the same either way. */
static atomic_int in_observer;
static void hold_the_heap_lock(void *ctx, int device, int event, uint64_t addr, uint64_t size, uint64_t stream) {
  (void)ctx, (void)device, (void)event, (void)addr, (void)size, (void)stream;
  atomic_store(&in_observer, 1);
  for (volatile int i = 0; i < 100000; i++) {
  }
  atomic_store(&in_observer, 0);
}

/* What a child checks; its exit status says which step failed. */
static int child_body(void) {
  torchalloc_set_segment_observer(NULL, NULL);
  torchalloc_stats before, after;
  if (torchalloc_get_stats(0, &before) != 0) return 2;
  for (int i = 0; i < 200; i++) {
    size_t size = (size_t)512 << i % 14;
    void *p = torchalloc_malloc(size, 0, S0);
    if (!p) return 3;
    torchalloc_free(p, size, 0, S0);
  }
  if (torchalloc_check_invariants(0) != 0) return 4;
  if (torchalloc_get_stats(0, &after) != 0) return 5;
  /* The workers' blocks that were live at the fork stay live (their threads are gone); ours are all freed. */
  if (after.allocated_bytes[ALL].current != before.allocated_bytes[ALL].current) return 6;
  if (torchalloc_phase_begin("child") < 0 || torchalloc_phase_end("child") != 0) return 7;
  if (torchalloc_mark("child") != 0) return 8; /* the log's mutex is free; the record is not written */
  return 0;
}

/* Waits for `pid`; after MAX_WAIT_MS without an exit the child is killed. */
static int wait_bounded(pid_t pid, int *status) {
  for (int ms = 0; ms < MAX_WAIT_MS; ms++) {
    if (waitpid(pid, status, WNOHANG) == pid) return 0;
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return -1;
}

TEST(fork_while_threads_allocate) {
  char path[256];
  temp_path(path, sizeof path, "fork-threads");
  REQUIRE(log_reset(path, "sim_capacity:8GiB") == 0);
  atomic_store(&stop, 0);
  atomic_store(&budget, 0);
  torchalloc_set_segment_observer(hold_the_heap_lock, NULL);
  pthread_t threads[WORKERS];
  for (int i = 0; i < WORKERS; i++) REQUIRE(pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)i) == 0);
  pid_t children[FORKS];
  int forked = 0;
  for (int i = 0; i < FORKS; i++) {
    /* Fork while the workers are busy: they hold locks often, at a time nobody chooses. */
    long until = atomic_fetch_add(&budget, 1000) + 1000;
    while (atomic_load(&progress) < until - 500) sched_yield();
    while (!atomic_load(&in_observer) && atomic_load(&progress) < until) sched_yield();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) break;
    if (pid == 0) _exit(child_body());
    children[forked++] = pid;
    int status = 0;
    if (wait_bounded(pid, &status) != 0) {
      fprintf(stderr, "  child %d of %d still running after %d s: killed (a lock copied held?)\n", i + 1, FORKS,
              MAX_WAIT_MS / 1000);
      CHECK(!"the child hung");
      break;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      fprintf(stderr, "  child %d: %s %d\n", i + 1, WIFEXITED(status) ? "exit status" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < WORKERS; i++) pthread_join(threads[i], NULL);
  torchalloc_set_segment_observer(NULL, NULL);
  CHECK_EQ(forked, FORKS);
  CHECK_EQ(atomic_load(&worker_errors), 0);
  CHECK_INVARIANTS();
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 0);
  torchalloc_teardown(); /* closes the log */

  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_CLOSED);
  CHECK(seq_contiguous(&p));
  CHECK_EQ(p.slots[p.nslots - 1].kind, TA_LOG_END);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), atomic_load(&markers)); /* none from a child, none lost */
  CHECK_EQ(count_kind(&p, TA_LOG_ALLOC), count_kind(&p, TA_LOG_FREE));
  size_t from_children = 0;
  for (size_t i = 0; i < p.nslots; i++)
    for (int c = 0; c < forked; c++) from_children += p.slots[i].tid == (uint32_t)children[c];
  CHECK_EQ(from_children, 0);
  free(p.data);
  unlink(path);
}

/* A fork before the library's first use, and one with no heap yet: the
 * handler has nothing to hold but must not trip over the missing state. */
TEST(fork_before_any_heap_exists) {
  torchalloc_teardown();
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (sim_reset("") != 0) _exit(2);
    void *p = torchalloc_malloc(4096, 0, S0);
    if (!p) _exit(3);
    torchalloc_free(p, 4096, 0, S0);
    _exit(torchalloc_check_invariants(0) == 0 ? 0 : 4);
  }
  int status = 0;
  CHECK(wait_bounded(pid, &status) == 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
