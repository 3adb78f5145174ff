/* What the reclaim tests share (test_reclaim.c, test_reclaim_layout.c): the
 * sim device with its lag model, a program's malloc and free whose kernels
 * touch the block on its stream, and the counters they check. */
#ifndef TA_TEST_RECLAIM_SIM_H
#define TA_TEST_RECLAIM_SIM_H

#include "sim.h"
#include "torchalloc_oom.h"
#include "torchalloc_sim.h"

#define GRANULE (2 * MiB)

static inline int64_t reserved(void) { return stats0().reserved_bytes[ALL].current; }
static inline int64_t syncs(void) { return stats0().num_synchronizes; }
static inline int64_t violations(void) {
  char why[160] = "";
  int64_t v = torchalloc_sim_capture_violations(0, why, sizeof why);
  if (v) fprintf(stderr, "  sim violation: %s\n", why);
  return v;
}

/* A program's malloc and free: its kernels touch the block on its stream. */
static inline void *use_malloc(size_t size, cudaStream_t stream) {
  void *p = torchalloc_malloc(size, 0, stream);
  if (p) torchalloc_sim_use(0, stream, p, size);
  return p;
}
static inline void use_free(void *p, size_t size, cudaStream_t stream) {
  torchalloc_sim_use(0, stream, p, size); /* its last kernel, queued before the free */
  torchalloc_free(p, size, 0, stream);
}
static inline uint64_t phys(const void *p) {
  uint64_t x = 0;
  return torchalloc_sim_physical(0, p, &x) == 0 ? x : 0;
}
static inline int overlaps(const void *a, size_t an, const void *b, size_t bn) {
  return (const char *)a < (const char *)b + bn && (const char *)b < (const char *)a + an;
}

#endif
