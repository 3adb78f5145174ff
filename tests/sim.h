/* Helpers shared by the tests: a fresh sim device per test, stats access. */
#ifndef TA_TEST_SIM_H
#define TA_TEST_SIM_H

#include "check.h"
#include "torchalloc.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define S0 ((cudaStream_t)0)
#define S1 ((cudaStream_t)0x1000)
#define S2 ((cudaStream_t)0x2000)

/* Start from nothing on a simulated device; `extra` is appended to the conf.
 * Ordinary segments unless `extra` says otherwise: most tests pin the
 * caching policy's behaviour, PyTorch's byte for byte (expandable:0); the
 * default mode (reclaim) has its own tests (test_reclaim.c) and is among
 * the fuzzer's and the soak's configurations. */
static inline int sim_reset(const char *extra) {
  char conf[512];
  /* No OOM report files from tests (a test that wants one says oom_report:on). */
  snprintf(conf, sizeof conf, "backend:sim,warn:0,oom_report:off,expandable:off%s%s", extra && *extra ? "," : "",
           extra ? extra : "");
  torchalloc_teardown();
  if (torchalloc_init(conf) != 0) {
    fprintf(stderr, "  torchalloc_init(%s): %s\n", conf, torchalloc_last_error());
    return -1;
  }
  return 0;
}

static inline torchalloc_stats stats0(void) {
  torchalloc_stats s;
  memset(&s, 0, sizeof s);
  torchalloc_get_stats(0, &s);
  return s;
}

#define ALL TORCHALLOC_POOL_ALL
#define SMALL TORCHALLOC_POOL_SMALL
#define LARGE TORCHALLOC_POOL_LARGE

#define CHECK_INVARIANTS()                                                                 \
  do {                                                                                     \
    if (torchalloc_check_invariants(0) != 0) {                                             \
      fprintf(stderr, "  %s:%d: invariants: %s\n", __FILE__, __LINE__, torchalloc_last_error()); \
      g_failures++;                                                                        \
    }                                                                                      \
  } while (0)

#endif
