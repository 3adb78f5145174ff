/* Soak: a long run of random operations through the fuzzer's API driver
 * (tests/fuzz/api_driver.h), across every policy and configuration, meant
 * for the ASan+UBSan build (build-asan/tests/soak). ctest runs a short one
 * (soak_short, 5 x 10^4 operations); 10^8 take about an hour under ASan on two
 * cores, so that run is made by hand.
 *
 * Episodes of --episode operations each start a fresh allocator; episode e
 * uses policy e % 3 and segment mode e % 4 (ordinary, expandable, compact,
 * reclaim: every pair in 12 episodes) and cycles through devices,
 * capacities, injected failures, memory held elsewhere, event polls, the
 * device's lag behind the host and logging. Every
 * operation checks that a new block overlaps no live one and that a
 * capture told to the core was not violated, every free that the block's
 * canary words are intact; every --check-every
 * operations (and at each episode's end) the invariants of every device,
 * the snapshot against the shadow map, every live block's canary, the
 * stats and the misuse counters are checked. Any violation aborts with the operation's bytes, the
 * configuration and the seed.
 *
 *   soak [--ops N] [--seed S] [--episode M] [--check-every K]
 * defaults: 100000000 operations, seed 1, 1000000 per episode, check every 1000. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_driver.h"

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t arg_u64(int argc, char **argv, const char *name, uint64_t fallback) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return strtoull(argv[i + 1], NULL, 10);
  return fallback;
}

int main(int argc, char **argv) {
  uint64_t total = arg_u64(argc, argv, "--ops", 100000000), seed = arg_u64(argc, argv, "--seed", 1);
  uint64_t episode = arg_u64(argc, argv, "--episode", 1000000);
  unsigned check_every = (unsigned)arg_u64(argc, argv, "--check-every", 1000);
  if (!episode || !check_every) {
    fprintf(stderr, "soak: --episode and --check-every must be positive\n");
    return 2;
  }
  static const char *const policy_names[3] = {"caching", "exact", "phase_arena"}; /* drv_start's config[0] % 3 */
  uint64_t rng = seed, done = 0, next_report = 10000000, episodes[3] = {0, 0, 0}, reclaim_episodes = 0;
  double start = now_s();
  printf("soak: %" PRIu64 " operations, seed %" PRIu64 ", %" PRIu64 " per episode, full check every %u\n", total, seed,
         episode, check_every);
  for (uint64_t e = 0; done < total; e++) {
    uint64_t r = splitmix64(&rng);
    uint8_t config[DRV_CONFIG_BYTES];
    memcpy(config, &r, sizeof config);
    config[0] = (uint8_t)(e % 3);        /* policy: each in turn (op_policy switches within an episode too) */
    episodes[e % 3]++;
    config[1] = (uint8_t)(e / 3 % 2);    /* one device or two */
    config[2] = (uint8_t)(e / 6 % 6);    /* every capacity */
    config[7] = (uint8_t)((config[7] & 1) | (e % 4) << 1); /* segment mode e % 4 (drv_start's (config[7] >> 1) % 4) */
    reclaim_episodes += e % 4 == 3;
    drv_start(config, check_every);
    fprintf(stderr, "soak: episode %" PRIu64 " (seed %" PRIu64 "): %s\n", e, seed, drv_conf());
    uint64_t n = total - done < episode ? total - done : episode;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t bytes = splitmix64(&rng);
      drv_step((const uint8_t *)&bytes);
    }
    drv_finish();
    done += n;
    if (done >= next_report || done == total) {
      double t = now_s() - start;
      printf("soak: %" PRIu64 " operations in %.0f s (%.0f ops/s)\n", done, t, (double)done / t);
      fflush(stdout);
      next_report += 10000000;
    }
  }
  const drv_counts *c = drv_totals();
  printf("soak: done: %" PRIu64 " operations in %.1f s: %" PRIu64 " blocks handed out and freed, %" PRIu64
         " OOMs, %" PRIu64 " bad calls refused, %" PRIu64 " captures, %" PRIu64 " full checks; 0 violations\n",
         c->ops, now_s() - start, c->mallocs, c->ooms, c->misuse, c->captures, c->checks);
  printf("soak: episodes starting under each policy: %s %" PRIu64 ", %s %" PRIu64 ", %s %" PRIu64 "\n",
         policy_names[0], episodes[0], policy_names[1], episodes[1], policy_names[2], episodes[2]);
  printf("soak: %" PRIu64 " device synchronizes, %" PRIu64 " of them in the %" PRIu64
         " reclaim episodes (empty_cache, OOM retries, arena trims: never to serve a request)\n",
         c->synchronizes, c->reclaim_synchronizes, reclaim_episodes);
  printf("1 passed, 0 failed\n"); /* run.sh's count, as every test program prints (a violation aborts instead) */
  return 0;
}
