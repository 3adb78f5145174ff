/* Out of memory on the simulated device: the verdict for each cause, the
 * report's contents and file, and an allocator that keeps working after. */
#include <unistd.h>

#include "sim.h"

static char report[65536];

static int verdict_now(torchalloc_oom_facts *facts) {
  int verdict = -1;
  CHECK_EQ(torchalloc_last_oom(0, facts, &verdict), 0);
  return verdict;
}

/* Fill with 6 MiB blocks until the device says no, free every other. */
static int fill_and_free_alternate(void **blocks, int cap) {
  int n = 0;
  while (n < cap && (blocks[n] = torchalloc_malloc(6 * MiB, 0, S0)) != NULL) n++;
  for (int i = 0; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);
  return n;
}

TEST(fragmentation_names_the_blocks_that_pin_the_segments) {
  REQUIRE(sim_reset("sim_capacity:120MiB,oom_report:/tmp") == 0);
  void *blocks[64];
  int n = fill_and_free_alternate(blocks, 64);
  REQUIRE(n >= 15);
  CHECK(torchalloc_try_malloc(16 * MiB, 0, S0) == NULL);
  torchalloc_oom_facts f;
  CHECK_EQ(verdict_now(&f), TORCHALLOC_OOM_FRAGMENTATION);
  CHECK(f.requested == 16 * MiB && f.device_total == 120 * MiB);
  CHECK(f.reserved - f.allocated >= 16 * MiB); /* the bytes were there ... */
  CHECK(f.largest_free < 16 * MiB);            /* ... but in pieces */
  int len = torchalloc_oom_report(0, report, sizeof report);
  CHECK(len > 0 && (size_t)len < sizeof report);
  CHECK(strstr(report, "Verdict: fragmentation") != NULL);
  CHECK(strstr(report, "Segments, most free first") != NULL);
  CHECK(strstr(report, "[###") != NULL || strstr(report, "[...") != NULL); /* an occupancy bar */
  CHECK(strstr(report, "Live blocks pinning") != NULL);
  char live[32];
  snprintf(live, sizeof live, "%p", blocks[1]); /* a block left live between two freed ones */
  CHECK(strstr(report, live) != NULL);
  char summary[2048];
  CHECK(torchalloc_oom_summary(0, summary, sizeof summary) > 0);
  CHECK(strstr(summary, "Verdict: fragmentation") != NULL);
  CHECK(strstr(summary, "Full report: /tmp/torchalloc-oom-") != NULL);
  unlink(torchalloc_oom_report_path(0));
  for (int i = 1; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(capacity_when_live_tensors_alone_exceed_the_device) {
  REQUIRE(sim_reset("sim_capacity:64MiB") == 0);
  void *a = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(a);
  CHECK(torchalloc_try_malloc(40 * MiB, 0, S0) == NULL);
  torchalloc_oom_facts f;
  CHECK_EQ(verdict_now(&f), TORCHALLOC_OOM_CAPACITY);
  torchalloc_oom_report(0, report, sizeof report);
  CHECK(strstr(report, "Verdict: capacity") != NULL);
  torchalloc_free(a, 40 * MiB, 0, S0);
}

TEST(held_elsewhere_when_another_user_took_the_device) {
  REQUIRE(sim_reset("sim_capacity:64MiB,sim_held_elsewhere:40MiB") == 0);
  CHECK(torchalloc_try_malloc(30 * MiB, 0, S0) == NULL); /* fits the device, not what is left of it */
  torchalloc_oom_facts f;
  CHECK_EQ(verdict_now(&f), TORCHALLOC_OOM_HELD_ELSEWHERE);
  CHECK(f.device_free == 24 * MiB && f.reserved == 0);
  torchalloc_oom_report(0, report, sizeof report);
  CHECK(strstr(report, "40.00 MiB held outside torchalloc") != NULL);
}

TEST(held_elsewhere_when_a_memory_fraction_caps_the_request) {
  REQUIRE(sim_reset("sim_capacity:64MiB") == 0);
  torchalloc_set_memory_fraction(0.25, 0); /* 16 MiB */
  CHECK(torchalloc_try_malloc(20 * MiB, 0, S0) == NULL);
  torchalloc_oom_facts f;
  CHECK_EQ(verdict_now(&f), TORCHALLOC_OOM_HELD_ELSEWHERE);
  CHECK(f.limit == 16 * MiB);
}

TEST(the_verdict_rule_alone) {
  torchalloc_oom_facts f = {.requested = 10, .allocated = 50, .reserved = 80, .device_total = 100, .device_free = 20};
  CHECK_EQ(torchalloc_oom_verdict(&f), TORCHALLOC_OOM_FRAGMENTATION); /* 60 needed, 100 usable */
  f.requested = 60;
  CHECK_EQ(torchalloc_oom_verdict(&f), TORCHALLOC_OOM_CAPACITY); /* 110 > 100 */
  f = (torchalloc_oom_facts){.requested = 10, .allocated = 20, .reserved = 20, .device_total = 100, .device_free = 5};
  CHECK_EQ(torchalloc_oom_verdict(&f), TORCHALLOC_OOM_HELD_ELSEWHERE); /* 75 held by others */
  f = (torchalloc_oom_facts){.requested = 10, .allocated = 20, .reserved = 20, .device_total = 100, .device_free = 80,
                             .limit = 25};
  CHECK_EQ(torchalloc_oom_verdict(&f), TORCHALLOC_OOM_HELD_ELSEWHERE); /* the fraction */
  f = (torchalloc_oom_facts){.requested = 10, .allocated = 20, .reserved = 40}; /* an old log: no device numbers */
  CHECK_EQ(torchalloc_oom_verdict(&f), TORCHALLOC_OOM_FRAGMENTATION);
  f.reserved = 25;
  CHECK_EQ(torchalloc_oom_verdict(&f), TORCHALLOC_OOM_CAPACITY);
  CHECK_EQ(torchalloc_oom_verdict(NULL), -1);
}

TEST(the_allocator_keeps_working_after_an_oom) {
  REQUIRE(sim_reset("sim_capacity:120MiB") == 0);
  void *blocks[64];
  int n = fill_and_free_alternate(blocks, 64);
  for (int k = 0; k < 3; k++) CHECK(torchalloc_try_malloc(32 * MiB, 0, S0) == NULL); /* again and again */
  CHECK_EQ(stats0().num_ooms, 4); /* the fill ended in one */
  CHECK_INVARIANTS();
  void *small = torchalloc_malloc(6 * MiB, 0, S0); /* smaller requests still succeed: a freed hole fits */
  CHECK(small != NULL);
  for (int i = 1; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0); /* frees succeed */
  torchalloc_free(small, 6 * MiB, 0, S0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 0);
  CHECK_INVARIANTS();
  torchalloc_empty_cache(0);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0); /* no reserved memory leaks after trim */
  void *big = torchalloc_malloc(100 * MiB, 0, S0);   /* and the whole device is usable again */
  CHECK(big != NULL);
  torchalloc_free(big, 100 * MiB, 0, S0);
}

TEST(the_report_file_lands_beside_the_log) {
  char log[256], expected[300];
  snprintf(log, sizeof log, "/tmp/talog-oom-%d.talog", (int)getpid());
  char conf[400];
  snprintf(conf, sizeof conf, "sim_capacity:64MiB,oom_report:on,log:%s", log);
  REQUIRE(sim_reset(conf) == 0);
  CHECK(torchalloc_try_malloc(100 * MiB, 0, S0) == NULL);
  snprintf(expected, sizeof expected, "%s.oom-cuda0.txt", log);
  CHECK(strcmp(torchalloc_oom_report_path(0), expected) == 0);
  FILE *f = fopen(expected, "r");
  REQUIRE(f);
  size_t got = fread(report, 1, sizeof report - 1, f);
  report[got] = '\0';
  fclose(f);
  CHECK(strstr(report, "torchalloc out-of-memory report: device 0") != NULL);
  CHECK(strstr(report, "Verdict: capacity") != NULL);
  torchalloc_teardown();
  unlink(expected);
  unlink(log);
}
