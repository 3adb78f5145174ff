/* malloc+free pairs of mixed sizes against the simulated device.
 *
 * Each thread keeps a window of live blocks and, per iteration, frees the
 * oldest and allocates a new one, so almost every request is served from
 * cache. Sizes come from a fixed mix (60 % <= 64 KiB, 25 % <= 1 MiB, 12 %
 * 1-10 MiB, 3 % 10-100 MiB) in two patterns:
 *   - mixed: each new request takes a different size from the mix, so
 *     nearly every malloc splits a block and every free merges (worst case);
 *   - repeat: slot k always asks for the same size, as a training loop
 *     does step after step (freed blocks are reused whole).
 * Prints ns per pair for 1 thread, 2 and 4 threads on one device (one heap,
 * one lock) and 2 threads on two devices. Not a test: figures only.
 *
 *   bench_pairs [PAIRS] [EXTRA_CONF]     e.g. bench_pairs 4000000 log:/tmp/bench.talog
 *   bench_pairs --one POLICY PATTERN THREADS DEVICES [PAIRS] [EXTRA_CONF]
 *       one figure (e.g. --one caching mixed 4 1): for scripts that interleave
 *       runs of two builds (the machine is noisy: compare medians). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "torchalloc.h"

#define NSIZES 4096
#define WINDOW 64
#define MAX_THREADS 8

static size_t sizes[NSIZES];
static long pairs_per_thread = 4000000;
static int repeat_pattern; /* 0: mixed, 1: repeat */
static const char *extra_conf = "";

typedef struct worker {
  int device;
  cudaStream_t stream;
  unsigned seed;
  double ns_per_pair;
} worker;

static unsigned next_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 8;
}

static void make_sizes(void) {
  unsigned s = 42;
  for (int i = 0; i < NSIZES; i++) {
    unsigned r = next_rand(&s) % 100, v = next_rand(&s);
    if (r < 60) sizes[i] = 1 + v % (64u << 10);
    else if (r < 85) sizes[i] = 1 + v % (1u << 20);
    else if (r < 97) sizes[i] = (1u << 20) + v % (9u << 20);
    else sizes[i] = (10u << 20) + v % (90u << 20);
  }
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void *run(void *arg) {
  worker *w = arg;
  void *ptr[WINDOW];
  size_t len[WINDOW];
  unsigned s = w->seed;
  for (int i = 0; i < WINDOW; i++) {
    len[i] = repeat_pattern ? sizes[i] : sizes[next_rand(&s) % NSIZES];
    ptr[i] = torchalloc_malloc(len[i], w->device, w->stream);
  }
  /* Warm-up: reach the steady state of the cache before timing. */
  for (long i = 0; i < 200000; i++) {
    int k = (int)(i % WINDOW);
    torchalloc_free(ptr[k], len[k], w->device, w->stream);
    len[k] = repeat_pattern ? sizes[k] : sizes[next_rand(&s) % NSIZES];
    ptr[k] = torchalloc_malloc(len[k], w->device, w->stream);
  }
  double t0 = now_ns();
  for (long i = 0; i < pairs_per_thread; i++) {
    int k = (int)(i % WINDOW);
    torchalloc_free(ptr[k], len[k], w->device, w->stream);
    len[k] = repeat_pattern ? sizes[k] : sizes[(i * 7 + k) & (NSIZES - 1)];
    ptr[k] = torchalloc_malloc(len[k], w->device, w->stream);
    if (!ptr[k]) {
      fprintf(stderr, "bench: allocation failed\n");
      exit(1);
    }
  }
  w->ns_per_pair = (now_ns() - t0) / (double)pairs_per_thread;
  for (int i = 0; i < WINDOW; i++) torchalloc_free(ptr[i], len[i], w->device, w->stream);
  return NULL;
}

static double bench(const char *policy, int threads, int devices) {
  char conf[1024];
  snprintf(conf, sizeof conf, "backend:sim,sim_capacity:1TiB,sim_devices:2,policy:%s%s%s", policy,
           *extra_conf ? "," : "", extra_conf);
  torchalloc_teardown();
  if (torchalloc_init(conf)) {
    fprintf(stderr, "bench: %s\n", torchalloc_last_error());
    exit(1);
  }
  worker w[MAX_THREADS];
  pthread_t t[MAX_THREADS];
  for (int i = 0; i < threads; i++) {
    w[i] = (worker){.device = i % devices, .stream = (cudaStream_t)(uintptr_t)(0x100 * (i + 1)),
                    .seed = 7u + (unsigned)i};
    pthread_create(&t[i], NULL, run, &w[i]);
  }
  double worst = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    if (w[i].ns_per_pair > worst) worst = w[i].ns_per_pair;
  }
  torchalloc_teardown();
  return worst;
}

static const char usage[] =
    "usage: bench_pairs [PAIRS] [EXTRA_CONF]     e.g. bench_pairs 4000000 log:/tmp/bench.talog\n"
    "       bench_pairs --one POLICY mixed|repeat THREADS DEVICES [PAIRS] [EXTRA_CONF]\n"
    "PAIRS: malloc+free pairs per thread, a positive whole number\n";

/* PAIRS from the command line: a positive whole number (atol read "--help" as 0 pairs and printed "inf ns"). */
static int set_pairs(const char *text) {
  char *end = NULL;
  pairs_per_thread = strtol(text, &end, 10);
  if (end != text && *end == '\0' && pairs_per_thread > 0) return 0;
  fprintf(stderr, "bench_pairs: PAIRS %s: give a positive whole number\n%s", text, usage);
  return 2;
}

static int run_one(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: bench_pairs --one POLICY mixed|repeat THREADS DEVICES [PAIRS] [EXTRA_CONF]\n");
    return 2;
  }
  repeat_pattern = strcmp(argv[3], "repeat") == 0;
  int threads = atoi(argv[4]), devices = atoi(argv[5]);
  if (threads < 1 || threads > MAX_THREADS || devices < 1 || devices > 2) {
    fprintf(stderr, "bench_pairs: THREADS is 1-%d, DEVICES 1 or 2\n", MAX_THREADS);
    return 2;
  }
  if (argc > 6 && set_pairs(argv[6])) return 2;
  if (argc > 7) extra_conf = argv[7];
  printf("%.1f\n", bench(argv[2], threads, devices));
  return 0;
}

int main(int argc, char **argv) {
  make_sizes();
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(usage, stdout);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--one") == 0) return run_one(argc, argv);
  if (argc > 1 && set_pairs(argv[1])) return 2;
  if (argc > 2) extra_conf = argv[2];
  const char *policies[] = {"caching", "phase_arena"};
  printf("%-20s %10s %21s %21s %22s   (ns per malloc+free pair, per thread)\n", "policy / pattern", "1 thread",
         "2 threads, 1 device", "4 threads, 1 device", "2 threads, 2 devices");
  for (repeat_pattern = 0; repeat_pattern < 2; repeat_pattern++) {
    for (int p = 0; p < 2; p++) {
      double one = bench(policies[p], 1, 1);
      double two_shared = bench(policies[p], 2, 1);
      double four_shared = bench(policies[p], 4, 1);
      double two_split = bench(policies[p], 2, 2);
      char label[40];
      snprintf(label, sizeof label, "%s / %s", policies[p], repeat_pattern ? "repeat" : "mixed");
      printf("%-20s %7.1f ns %18.1f ns %18.1f ns %19.1f ns\n", label, one, two_shared, four_shared, two_split);
    }
  }
  return 0;
}
