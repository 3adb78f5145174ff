/* What the thread stress tests (test_threads, test_stress8) share: a
 * splitmix64 stream per worker, request sizes shaped like a training run's
 * (mostly small, some up to 10 MiB, a few up to 50 MiB), and the start and
 * join of their workers. One copy, so both tests stress the same size mix.
 * Include after check.h (RUN_WORKERS uses REQUIRE). */
#ifndef TORCHALLOC_TESTS_THREAD_WORKLOAD_H
#define TORCHALLOC_TESTS_THREAD_WORKLOAD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define WORKLOAD_MiB ((size_t)1 << 20)

static inline uint64_t workload_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline size_t workload_size(uint64_t *state) {
  uint64_t r = workload_rand(state) % 100;
  if (r < 60) return 1 + workload_rand(state) % 4096;
  if (r < 85) return 4097 + workload_rand(state) % WORKLOAD_MiB;
  if (r < 97) return WORKLOAD_MiB + 1 + workload_rand(state) % (9 * WORKLOAD_MiB);
  return 10 * WORKLOAD_MiB + workload_rand(state) % (40 * WORKLOAD_MiB);
}

/* Run fn on each of workers[0..n) in a thread of its own and wait for all:
 * each worker zeroed, then .id = its index and .rng = seed + index; the
 * workers wait on `barrier` (initialised here for n) so they start together. */
#define RUN_WORKERS(workers, n, fn, seed, barrier)                              \
  do {                                                                         \
    pthread_t threads_[n];                                                     \
    REQUIRE(pthread_barrier_init(&(barrier), NULL, (n)) == 0);                  \
    for (int i_ = 0; i_ < (n); i_++) {                                         \
      memset(&(workers)[i_], 0, sizeof(workers)[i_]);                           \
      (workers)[i_].id = i_;                                                   \
      (workers)[i_].rng = (seed) + (uint64_t)i_;                               \
      REQUIRE(pthread_create(&threads_[i_], NULL, (fn), &(workers)[i_]) == 0);  \
    }                                                                          \
    for (int i_ = 0; i_ < (n); i_++) pthread_join(threads_[i_], NULL);         \
    pthread_barrier_destroy(&(barrier));                                       \
  } while (0)

#endif
