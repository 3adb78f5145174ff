/* The cost of many streams on the simulated device: each of N streams is
 * used once (malloc 512 B, free), as a program that makes a stream per
 * request or per batch does. Runs the default (reclaim) and `expandable:off`
 * (ordinary segments: a stream's state is an arena entry and its cached
 * segment) in interleaved rounds and prints each one's time and their
 * ratio. Not a test: figures only.
 *
 *   bench_streams [STREAMS] [ROUNDS]        (default 100000 streams, 5 rounds) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "torchalloc.h"

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Seconds for `streams` streams used once under `conf`; -1 on failure. */
static double run(const char *conf, long streams) {
  if (torchalloc_init(conf) != 0) {
    fprintf(stderr, "torchalloc_init(%s): %s\n", conf, torchalloc_last_error());
    return -1;
  }
  double t0 = seconds();
  for (long i = 0; i < streams; i++) {
    cudaStream_t stream = (cudaStream_t)(uintptr_t)(0x10000 + (uintptr_t)i * 16);
    void *p = torchalloc_malloc(512, 0, stream);
    if (!p) {
      fprintf(stderr, "%s: malloc failed at stream %ld\n", conf, i);
      torchalloc_teardown();
      return -1;
    }
    torchalloc_free(p, 512, 0, stream);
  }
  double t = seconds() - t0;
  torchalloc_teardown();
  return t;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  long streams = argc > 1 ? atol(argv[1]) : 100000;
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (streams <= 0 || rounds <= 0 || rounds > 1000) {
    fprintf(stderr, "usage: bench_streams [STREAMS > 0] [ROUNDS 1-1000]\n");
    return 2;
  }
  const char *confs[2] = {"backend:sim,warn:0,oom_report:off,sim_capacity:80GiB",
                          "backend:sim,warn:0,oom_report:off,sim_capacity:80GiB,expandable:off"};
  const char *names[2] = {"default (reclaim)", "expandable:off"};
  double *t[2] = {calloc((size_t)rounds, sizeof(double)), calloc((size_t)rounds, sizeof(double))};
  double *ratio = calloc((size_t)rounds, sizeof(double));
  if (!t[0] || !t[1] || !ratio) return 1;
  for (int r = 0; r < rounds; r++) { /* interleaved: A B A B ... */
    for (int k = 0; k < 2; k++)
      if ((t[k][r] = run(confs[k], streams)) < 0) return 1;
    ratio[r] = t[0][r] / t[1][r];
  }
  printf("%ld streams used once (malloc 512 B + free each), %d interleaved rounds, seconds: median (min-max)\n",
         streams, rounds);
  for (int k = 0; k < 2; k++) {
    qsort(t[k], (size_t)rounds, sizeof(double), by_value);
    printf("  %-18s %.3f (%.3f-%.3f)\n", names[k], t[k][rounds / 2], t[k][0], t[k][rounds - 1]);
  }
  qsort(ratio, (size_t)rounds, sizeof(double), by_value);
  printf("  default / expandable:off, per round: median %.2fx (%.2f-%.2f)\n", ratio[rounds / 2], ratio[0],
         ratio[rounds - 1]);
  free(t[0]);
  free(t[1]);
  free(ratio);
  return 0;
}
