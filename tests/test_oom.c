/* Out of memory on the simulated device: the verdict for each cause, the
 * report's contents and file, and an allocator that keeps working after. */
#include <unistd.h>

#include "sim.h"
#include "torchalloc_oom.h"

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
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:120MiB,oom_report:/tmp") == 0);
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
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:64MiB") == 0);
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
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:64MiB,sim_held_elsewhere:40MiB") == 0);
  CHECK(torchalloc_try_malloc(30 * MiB, 0, S0) == NULL); /* fits the device, not what is left of it */
  torchalloc_oom_facts f;
  CHECK_EQ(verdict_now(&f), TORCHALLOC_OOM_HELD_ELSEWHERE);
  CHECK(f.device_free == 24 * MiB && f.reserved == 0);
  torchalloc_oom_report(0, report, sizeof report);
  CHECK(strstr(report, "40.00 MiB held outside torchalloc") != NULL);
}

TEST(held_elsewhere_when_a_memory_fraction_caps_the_request) {
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:64MiB") == 0);
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
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:120MiB") == 0);
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

/* ------------------------------------------------------------------------
 * The advice: computed from the numbers at the failure (oom_advice.c)
 * ---------------------------------------------------------------------- */

static char summary_text[8192];

static const char *summary_now(void) {
  int n = torchalloc_oom_summary(0, summary_text, sizeof summary_text);
  CHECK(n > 0 && (size_t)n < sizeof summary_text);
  return summary_text;
}

/* The first advice line of a summary ("  1. ..."), NULL when none. */
static const char *first_advice(const char *text) {
  const char *p = strstr(text, "\n  1. ");
  return p ? p + 6 : NULL;
}

static void mib_text(char *out, size_t len, uint64_t bytes) {
  snprintf(out, len, "%.2f MiB", (double)bytes / (double)MiB);
}

/* Bytes of free blocks lying in whole aligned 2 MiB granules, in segments
 * that also hold live blocks: computed here from the snapshot, apart from
 * the heap's own pass. */
static uint64_t free_granules_from_snapshot(void) {
  static torchalloc_segment_info segs[256];
  static torchalloc_block_info blocks[4096];
  size_t ns = 0, nb = 0;
  if (torchalloc_snapshot(0, segs, 256, blocks, 4096, &ns, &nb) != 0) return 0; /* the caller's CHECK fails */
  uint64_t total = 0, g = 2 * MiB;
  for (size_t s = 0; s < ns; s++) {
    const torchalloc_block_info *b = &blocks[segs[s].first_block];
    int live = 0;
    uint64_t granules = 0;
    for (uint32_t k = 0; k < segs[s].nblocks; k++) {
      if (b[k].state != TORCHALLOC_BLOCK_FREE) {
        live = 1;
        continue;
      }
      uint64_t lo = (b[k].addr + g - 1) / g * g, hi = (b[k].addr + b[k].size) / g * g;
      if (hi > lo) granules += hi - lo;
    }
    if (live) total += granules;
  }
  return total;
}

TEST(fragmentation_advice_names_expandable_with_the_free_granules) {
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:120MiB") == 0);
  void *blocks[64];
  int n = fill_and_free_alternate(blocks, 64);
  REQUIRE(n >= 15);
  CHECK(torchalloc_try_malloc(16 * MiB, 0, S0) == NULL);
  torchalloc_oom_facts f;
  CHECK_EQ(verdict_now(&f), TORCHALLOC_OOM_FRAGMENTATION);
  torchalloc_oom_detail d = {.struct_size = sizeof d};
  CHECK_EQ(torchalloc_last_oom_detail(0, &d), 0);
  CHECK(d.struct_size == sizeof d && d.granule == 2 * MiB && d.expandable == 0 && d.flags == 0);
  uint64_t expected = free_granules_from_snapshot();
  CHECK(expected >= 16 * MiB); /* every 6 MiB hole is three whole granules */
  CHECK_EQ(d.free_granules, expected);
  CHECK_EQ(d.free_segments, 0);
  CHECK(d.pinned_segments > 0 && d.pinned_free == f.reserved - f.allocated && d.pinning == f.allocated);
  CHECK_EQ(d.pinning_other, 0); /* one phase: nothing for phase_arena */
  const char *s = summary_now();
  char want[160], g[32];
  mib_text(g, sizeof g, expected);
  snprintf(want, sizeof want, "expandable:reclaim would have served this request: %s in whole free 2 MiB granules", g);
  const char *first = first_advice(s);
  CHECK(first != NULL && strncmp(first, want, strlen(want)) == 0);
  CHECK(strstr(s, ">= 16.00 MiB requested [based on ") != NULL);
  CHECK(strstr(s, "policy:phase_arena") == NULL);
  int len = torchalloc_oom_report(0, report, sizeof report);
  CHECK(len > 0 && strstr(report, want) != NULL && strstr(report, "What the advice rests on") != NULL);
  CHECK(strstr(report, "arenas per phase would not keep them apart") != NULL);
  for (int i = 1; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);

  /* Followed: the same requests with expandable:reclaim serve the 16 MiB. */
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:120MiB,expandable:reclaim") == 0);
  n = fill_and_free_alternate(blocks, 64);
  REQUIRE(n >= 15);
  void *big = torchalloc_try_malloc(16 * MiB, 0, S0);
  CHECK(big != NULL);
  torchalloc_free(big, 16 * MiB, 0, S0);
  for (int i = 1; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

/* Pin 6 MiB holes with blocks allocated in `pin_phase`, then ask for 16 MiB
 * in "forward" (freed at once when served; *served says whether it was). */
static int pinned_by(const char *pin_phase, void **blocks, int *served) {
  int n = 0;
  for (; n < 64; n++) {
    const char *phase = n % 2 ? pin_phase : "forward";
    torchalloc_phase_begin(phase);
    blocks[n] = torchalloc_malloc(6 * MiB, 0, S0);
    torchalloc_phase_end(phase);
    if (!blocks[n]) break;
  }
  for (int i = 0; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);
  torchalloc_phase_begin("forward");
  void *big = torchalloc_try_malloc(16 * MiB, 0, S0);
  torchalloc_phase_end("forward");
  *served = big != NULL;
  if (big) torchalloc_free(big, 16 * MiB, 0, S0);
  return n;
}

TEST(phase_arena_advice_only_when_another_phase_pins_the_segments) {
  void *blocks[64];
  int served = 0;
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:120MiB") == 0);
  int n = pinned_by("forward", blocks, &served); /* the pinning blocks come from the request's phase */
  CHECK(!served);
  torchalloc_oom_detail d = {.struct_size = sizeof d};
  CHECK_EQ(torchalloc_last_oom_detail(0, &d), 0);
  CHECK(d.pinning > 0 && d.pinning_other == 0);
  CHECK(strstr(summary_now(), "policy:phase_arena") == NULL);
  for (int i = 1; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);

  REQUIRE(sim_reset("handle:2MiB,sim_capacity:120MiB") == 0);
  n = pinned_by("cache", blocks, &served); /* now from another phase */
  CHECK(!served);
  CHECK_EQ(torchalloc_last_oom_detail(0, &d), 0);
  CHECK(d.pinning_other == d.pinning && d.other_bytes[0] == d.pinning && d.other_bytes[1] == 0);
  CHECK_EQ(d.other_phases[0], torchalloc_phase_id("cache"));
  CHECK_EQ(d.phase, torchalloc_phase_id("forward"));
  const char *s = summary_now();
  const char *line = strstr(s, "policy:phase_arena");
  CHECK(line != NULL);
  CHECK(line && strstr(line, "allocated in phase 'cache' (") != NULL);
  CHECK(line && strstr(line, "the request in phase 'forward' [based on ") != NULL);
  CHECK(strncmp(first_advice(s), "expandable:reclaim would have served", 36) == 0); /* still first: its figures cover it */
  for (int i = 1; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);

  /* Followed: phase_arena keeps 'cache' out of the forward's segments, and the request is served. */
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:120MiB,policy:phase_arena") == 0);
  n = pinned_by("cache", blocks, &served);
  CHECK(served);
  for (int i = 1; i < n; i += 2) torchalloc_free(blocks[i], 6 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(capacity_and_held_elsewhere_advice_name_their_figures) {
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:64MiB") == 0);
  void *a = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(a);
  CHECK(torchalloc_try_malloc(40 * MiB, 0, S0) == NULL);
  const char *s = summary_now(); /* 40 live + 40 asked = 80 > 64: 16 must go */
  CHECK(strstr(s, "  1. shrink live tensors by at least 16.00 MiB") != NULL);
  CHECK(strstr(s, "40.00 MiB live + 40.00 MiB requested = 80.00 MiB > the 64.00 MiB torchalloc could use") != NULL);
  CHECK(strstr(s, "expandable:") == NULL);
  torchalloc_free(a, 40 * MiB, 0, S0);

  REQUIRE(sim_reset("handle:2MiB,sim_capacity:64MiB,sim_held_elsewhere:40MiB") == 0);
  CHECK(torchalloc_try_malloc(30 * MiB, 0, S0) == NULL);
  s = summary_now(); /* others hold 40 of 64: 24 left, 6 short */
  CHECK(strstr(s, "  1. free what other processes (or allocators, or the CUDA context) hold: 40.00 MiB of the "
                  "device; this request needs 6.00 MiB more than the 24.00 MiB torchalloc could use") != NULL);
  CHECK(strstr(s, "so 40.00 MiB held by others]") != NULL);

  REQUIRE(sim_reset("handle:2MiB,sim_capacity:64MiB") == 0);
  torchalloc_set_memory_fraction(0.25, 0); /* 16 MiB; 20 asked: 20/64 = 0.3125 */
  CHECK(torchalloc_try_malloc(20 * MiB, 0, S0) == NULL);
  s = summary_now();
  CHECK(strstr(s, "  1. raise the memory fraction to at least 0.32 (torch.cuda.set_per_process_memory_fraction): "
                  "it caps torchalloc at 16.00 MiB, 4.00 MiB short of the 20.00 MiB live + requested") != NULL);
  CHECK(strstr(s, "free what other processes") == NULL);
}

TEST(the_advice_rule_alone) {
  char buf[4096];
  /* 100 MiB device, 80 reserved, 50 live, 20 free on the device: 30 MiB asked. */
  torchalloc_oom_facts f = {.requested = 30 * MiB, .allocated = 50 * MiB, .reserved = 80 * MiB,
                            .device_total = 100 * MiB, .device_free = 20 * MiB, .largest_free = 8 * MiB};
  torchalloc_oom_detail d = {.struct_size = sizeof d, .granule = 2 * MiB, .free_granules = 10 * MiB,
                             .pinned_segments = 3, .pinned_free = 30 * MiB, .pinning = 50 * MiB};
  CHECK(torchalloc_oom_advice(&f, &d, NULL, 0, buf, sizeof buf) > 0); /* 10 + 20 headroom >= 30 */
  CHECK(strncmp(buf, "1. expandable:reclaim would have served this request: 10.00 MiB in whole free 2 MiB granules + "
                     "20.00 MiB not yet reserved >= 30.00 MiB requested [based on the free blocks of the 3 segments",
                102) == 0);
  f.device_free = 18 * MiB; /* 10 + 18 < 30: the line says it would not have, last */
  torchalloc_oom_advice(&f, &d, NULL, 0, buf, sizeof buf);
  CHECK(strncmp(buf, "1. allocate long-lived tensors", 30) == 0);
  CHECK(strstr(buf, "\n2. expandable:reclaim would not have served this request: 10.00 MiB in whole free 2 MiB granules + "
                    "18.00 MiB not yet reserved < 30.00 MiB requested") != NULL);
  f.device_free = 20 * MiB;
  f.requested = 29 * MiB + 1; /* rounded to whole granules: 30 MiB */
  torchalloc_oom_advice(&f, &d, NULL, 0, buf, sizeof buf);
  CHECK(strstr(buf, "requested (30.00 MiB in whole granules)") != NULL && strstr(buf, "would have served") != NULL);
  f.requested = 30 * MiB;

  /* Where expandable segments cannot change anything, no line names them. */
  const uint8_t flags[] = {TORCHALLOC_OOM_ROUTING, TORCHALLOC_OOM_FREES_TO_DEVICE};
  for (size_t k = 0; k < sizeof flags; k++) {
    torchalloc_oom_detail x = d;
    x.flags = flags[k];
    torchalloc_oom_advice(&f, &x, NULL, 0, buf, sizeof buf);
    CHECK(strstr(buf, "expandable") == NULL);
  }
  torchalloc_oom_detail on = d, no_vmm = d;
  on.expandable = 1;
  no_vmm.granule = 0;
  torchalloc_oom_advice(&f, &on, NULL, 0, buf, sizeof buf);
  CHECK(strstr(buf, "expandable:") == NULL);
  torchalloc_oom_advice(&f, &no_vmm, NULL, 0, buf, sizeof buf);
  CHECK(strstr(buf, "expandable:") == NULL);

  /* Phases by the caller's names; "phase N" where it has none. */
  torchalloc_oom_detail p = d;
  p.phase = 1;
  p.pinning_other = 12 * MiB;
  p.other_phases[0] = 2, p.other_bytes[0] = 8 * MiB;
  p.other_phases[1] = 7, p.other_bytes[1] = 4 * MiB;
  const char *names[] = {"default", "forward", "optimizer"};
  torchalloc_oom_advice(&f, &p, names, 3, buf, sizeof buf);
  CHECK(strstr(buf, "2. policy:phase_arena, with torchalloc.phase()") != NULL);
  CHECK(strstr(buf, "12.00 MiB of the 50.00 MiB of live blocks pinning the 3 segments that hold free memory (30.00 "
                    "MiB free in them) were allocated in phase 'optimizer' (8.00 MiB), phase 'phase 7' (4.00 MiB), "
                    "the request in phase 'forward'") != NULL);
  p.flags = TORCHALLOC_OOM_PHASE_ARENAS;
  torchalloc_oom_advice(&f, &p, names, 3, buf, sizeof buf);
  CHECK(strstr(buf, "phase_arena") == NULL);

  /* An older caller's shorter struct: the library reads no byte past its size. */
  torchalloc_oom_detail older = d;
  older.struct_size = 16; /* struct_size and granule only */
  torchalloc_oom_advice(&f, &older, NULL, 0, buf, sizeof buf);
  CHECK(strstr(buf, "2. expandable:reclaim would not have served this request: 0 bytes in whole free 2 MiB granules + "
                    "20.00 MiB not yet reserved < 30.00 MiB") != NULL);

  /* Without a detail the advice rests on the facts alone; NULL facts are refused; a short buffer is cut. */
  int full = torchalloc_oom_advice(&f, NULL, NULL, 0, buf, sizeof buf);
  CHECK(full > 0 && strncmp(buf, "1. allocate long-lived tensors", 30) == 0);
  char tiny[8];
  CHECK_EQ(torchalloc_oom_advice(&f, NULL, NULL, 0, tiny, sizeof tiny), full);
  CHECK(strlen(tiny) == sizeof tiny - 1);
  CHECK_EQ(torchalloc_oom_advice(NULL, &d, NULL, 0, buf, sizeof buf), -1);
}

TEST(last_oom_detail_writes_no_byte_past_the_callers_size) {
  REQUIRE(sim_reset("handle:2MiB,sim_capacity:64MiB") == 0);
  struct {
    torchalloc_oom_detail d;
    uint64_t canary;
  } in = {.canary = 0x5eed};
  memset(&in.d, 0xab, sizeof in.d);
  in.d.struct_size = 4; /* too small to say even its size */
  CHECK_EQ(torchalloc_last_oom_detail(0, &in.d), -1);
  in.d.struct_size = 16;
  CHECK_EQ(torchalloc_last_oom_detail(0, &in.d), 0); /* no failure yet: zeros */
  CHECK(in.d.struct_size == 16 && in.d.granule == 0);
  CHECK(in.d.free_granules == 0xababababababababull); /* past its 16 bytes: untouched */
  CHECK(torchalloc_try_malloc(100 * MiB, 0, S0) == NULL);
  in.d.struct_size = 16;
  CHECK_EQ(torchalloc_last_oom_detail(0, &in.d), 0);
  CHECK(in.d.granule == 2 * MiB && in.d.free_granules == 0xababababababababull);
  CHECK_EQ(torchalloc_last_oom_detail(7, &in.d), -1);
  CHECK_EQ(torchalloc_last_oom_detail(0, NULL), -1);
  CHECK(in.canary == 0x5eed);
}

/* Under a launcher ($RANK, $WORLD_SIZE) the summary and the report say
 * which rank failed: a job's output interleaves every rank's. */
TEST(the_summary_and_report_name_the_rank) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  REQUIRE(sim_reset("sim_capacity:64MiB") == 0);
  CHECK(torchalloc_malloc(200 * MiB, 0, S0) == NULL);
  char summary[8192], report[1 << 16];
  CHECK(torchalloc_oom_summary(0, summary, sizeof summary) > 0);
  CHECK(strstr(summary, "torchalloc (rank 1 of 2, stream") != NULL);
  CHECK(torchalloc_oom_report(0, report, sizeof report) > 0);
  CHECK(strstr(report, "torchalloc out-of-memory report: device 0, rank 1 of 2, pid") == report);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  REQUIRE(sim_reset("sim_capacity:64MiB") == 0);
  CHECK(torchalloc_malloc(200 * MiB, 0, S0) == NULL);
  CHECK(torchalloc_oom_report(0, report, sizeof report) > 0);
  CHECK(strstr(report, "rank") == NULL || strstr(report, "rank") > strchr(report, '\n')); /* no rank in the header */
}

/* "%.2f MiB"-style figure right after `label` in `text`, in bytes; -1 when absent. */
static double figure_after(const char *text, const char *label) {
  const char *p = strstr(text, label);
  if (!p) return -1;
  double v = 0;
  char unit[8] = "";
  if (sscanf(p + strlen(label), "%lf %7[A-Za-z]", &v, unit) != 2) return -1;
  const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  for (int i = 0; i < 5; i++, v *= 1024)
    if (strcmp(unit, units[i]) == 0) return v;
  return -1;
}

/* Found on an H100 under expandable:2: the summary said "97.70 MiB cached
 * but free; the largest free cached block is 500.00 MiB". A free block of
 * an expandable segment may span granules given back to the device; the
 * largest free block counts only what is mapped, so the figures add up. */
TEST(the_summary_figures_add_up_when_free_granules_went_back) {
  const char *modes[] = {"expandable:1", "expandable:2", "expandable:3", "expandable:off"};
  for (int m = 0; m < 4; m++) {
    char conf[128];
    snprintf(conf, sizeof conf, "handle:2MiB,sim_capacity:100MiB,%s", modes[m]);
    REQUIRE(sim_reset(conf) == 0);
    void *a = torchalloc_malloc(60 * MiB, 0, S0), *b = torchalloc_malloc(2 * MiB, 0, S0);
    REQUIRE(a && b);
    torchalloc_free(a, 60 * MiB, 0, S0); /* the failure below gives its granules back, its block stays */
    CHECK(torchalloc_try_malloc(120 * MiB, 0, S0) == NULL);
    char summary[8192];
    REQUIRE(torchalloc_oom_summary(0, summary, sizeof summary) > 0);
    double reserved = figure_after(summary, "reserves "), allocated = figure_after(summary, ": ");
    double cached = figure_after(summary, "allocated to tensors and "),
           largest = figure_after(summary, "the largest free cached block is ");
    const char *after = strstr(summary, "the largest free cached block is ");
    double on_stream = after ? figure_after(after, "(") : -1; /* "(X on this stream)" */
    CHECK(reserved >= 0 && cached >= 0 && largest >= 0 && on_stream >= 0);
    CHECK(allocated + cached <= reserved + 0.01 * MiB);
    CHECK(largest <= cached);
    CHECK(on_stream <= largest);
    if (largest > cached) fprintf(stderr, "  %s: %.400s\n", modes[m], summary);
    torchalloc_free(b, 2 * MiB, 0, S0);
  }
}
