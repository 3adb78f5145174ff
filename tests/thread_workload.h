/* What the thread stress tests (test_threads, test_stress8) draw: a
 * splitmix64 stream per worker, and request sizes shaped like a training
 * run's (mostly small, some up to 10 MiB, a few up to 50 MiB). One copy, so
 * both tests stress the same size mix. */
#ifndef TORCHALLOC_TESTS_THREAD_WORKLOAD_H
#define TORCHALLOC_TESTS_THREAD_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

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

#endif
