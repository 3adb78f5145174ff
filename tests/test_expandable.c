/* Expandable segments (expandable:1, and compact: expandable:2) on the
 * simulated device, which models the CUDA driver's virtual memory: reserved
 * addresses, 2 MiB granules mapped and unmapped one by one, violations
 * counted. */
#include "sim.h"
#include "torchalloc_sim.h"

#define GRANULE (2 * MiB)

static int64_t reserved(void) { return stats0().reserved_bytes[ALL].current; }
static int64_t violations(void) {
  char why[128] = "";
  int64_t v = torchalloc_sim_capture_violations(0, why, sizeof why);
  if (v) fprintf(stderr, "  sim violation: %s\n", why);
  return v;
}

TEST(one_segment_per_stream_and_pool_grows_by_granules) {
  REQUIRE(sim_reset("handle:2MiB,expandable:1") == 0);
  void *a = torchalloc_malloc(30 * MiB, 0, S0);
  void *b = torchalloc_malloc(3 * MiB + 512, 0, S0); /* a 1-10 MiB request: no 20 MiB segment */
  void *c = torchalloc_malloc(700 * KiB, 0, S0);     /* small pool: its own range */
  REQUIRE(a && b && c);
  CHECK_EQ((char *)b - (char *)a, 30 * MiB); /* carved right after a: one range */
  torchalloc_stats s = stats0();
  CHECK_EQ(s.segment[LARGE].current, 1);
  CHECK_EQ(s.segment[SMALL].current, 1);
  CHECK_EQ(s.reserved_bytes[LARGE].current, 34 * MiB); /* 33 MiB + 512 rounded up to granules */
  CHECK_EQ(s.reserved_bytes[SMALL].current, 2 * MiB);
  CHECK_EQ(s.allocated_bytes[LARGE].current, 33 * MiB + 512); /* split whenever 512 B remain, as PyTorch does */
  void *d = torchalloc_malloc(1 * MiB, 0, S1); /* another stream: another range */
  REQUIRE(d);
  CHECK_EQ(stats0().segment[ALL].current, 3);
  CHECK_INVARIANTS();
  torchalloc_free(a, 30 * MiB, 0, S0);
  torchalloc_free(b, 3 * MiB + 512, 0, S0);
  torchalloc_free(c, 700 * KiB, 0, S0);
  torchalloc_free(d, 1 * MiB, 0, S1);
  CHECK(torchalloc_empty_cache(0) > 0);
  CHECK_EQ(reserved(), 0);
  CHECK_EQ(stats0().segment[ALL].current, 0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

/* The case an ordinary segment cannot serve without more memory: the free
 * bytes are there but not in one hole. */
TEST(growing_past_the_peak_gives_back_free_granules_first) {
  REQUIRE(sim_reset("handle:2MiB,expandable:2") == 0);
  void *a = torchalloc_malloc(30 * MiB, 0, S0);
  void *b = torchalloc_malloc(30 * MiB, 0, S0);
  REQUIRE(a && b);
  CHECK_EQ(reserved(), 60 * MiB);
  torchalloc_free(a, 30 * MiB, 0, S0); /* a 30 MiB hole below b */
  void *c = torchalloc_malloc(40 * MiB, 0, S0); /* fits no hole: the range grows by 40 MiB */
  REQUIRE(c);
  CHECK_EQ((char *)c - (char *)b, 30 * MiB);
  /* the hole's 30 MiB went back before the range grew: 30 (b) + 40 (c) */
  CHECK_EQ(reserved(), 70 * MiB);
  CHECK_EQ(stats0().reserved_bytes[ALL].peak, 70 * MiB);
  CHECK_INVARIANTS();
  /* The hole is used again: mapped as the block is handed out. */
  void *d = torchalloc_malloc(20 * MiB, 0, S0);
  CHECK(d == a);
  CHECK_EQ(reserved(), 90 * MiB);
  CHECK_INVARIANTS();
  /* the caching policy needs a third segment for c: 30 + 30 + 40 */
  REQUIRE(sim_reset("handle:2MiB") == 0);
  a = torchalloc_malloc(30 * MiB, 0, S0);
  b = torchalloc_malloc(30 * MiB, 0, S0);
  torchalloc_free(a, 30 * MiB, 0, S0);
  REQUIRE(torchalloc_malloc(40 * MiB, 0, S0));
  CHECK_EQ(reserved(), 100 * MiB);
}

TEST(without_compaction_growing_unmaps_nothing) {
  REQUIRE(sim_reset("handle:2MiB,expandable:1") == 0);
  void *a = torchalloc_malloc(30 * MiB, 0, S0);
  void *b = torchalloc_malloc(30 * MiB, 0, S0);
  REQUIRE(a && b);
  torchalloc_free(a, 30 * MiB, 0, S0);
  REQUIRE(torchalloc_malloc(40 * MiB, 0, S0));
  CHECK_EQ(reserved(), 100 * MiB); /* a's hole stays mapped: no synchronize on the way */
  CHECK_EQ(stats0().num_device_free, 0);
  CHECK_EQ(torchalloc_empty_cache(0), 30 * MiB); /* until the cache is released */
  CHECK_INVARIANTS();
}

TEST(below_the_peak_it_grows_without_unmapping) {
  REQUIRE(sim_reset("handle:2MiB,expandable:2") == 0);
  void *a = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(a);
  torchalloc_free(a, 40 * MiB, 0, S0);
  torchalloc_empty_cache(0); /* reserved 0; the most ever reserved stays 40 MiB */
  void *b = torchalloc_malloc(10 * MiB, 0, S0);
  void *c = torchalloc_malloc(10 * MiB, 0, S0);
  REQUIRE(b && c);
  torchalloc_free(b, 10 * MiB, 0, S0);
  int64_t frees = stats0().num_device_free;
  void *d = torchalloc_malloc(15 * MiB, 0, S0); /* grows by 16 MiB: 36 MiB, under the 40 MiB high-water mark */
  REQUIRE(d);
  CHECK_EQ(stats0().num_device_free, frees); /* b's hole stays mapped for the next request */
  CHECK_EQ(reserved(), 36 * MiB);
  void *e = torchalloc_malloc(30 * MiB, 0, S0); /* past it: b's hole goes back first (36 - 10 + 30) */
  REQUIRE(e);
  CHECK_EQ(stats0().num_device_free, frees + 1);
  CHECK_EQ(reserved(), 56 * MiB);
  CHECK_INVARIANTS();
}

TEST(empty_cache_unmaps_free_granules_between_live_blocks) {
  REQUIRE(sim_reset("handle:2MiB,expandable:1") == 0);
  void *p[4];
  for (int i = 0; i < 4; i++) REQUIRE((p[i] = torchalloc_malloc(16 * MiB, 0, S0)) != NULL);
  torchalloc_free(p[1], 16 * MiB, 0, S0);
  torchalloc_free(p[3], 16 * MiB, 0, S0);
  CHECK_EQ(reserved(), 64 * MiB);
  CHECK_EQ(torchalloc_empty_cache(0), 32 * MiB); /* the hole between p[0] and p[2], and the free end */
  CHECK_EQ(reserved(), 32 * MiB);
  CHECK_EQ(stats0().segment[ALL].current, 1);
  CHECK_INVARIANTS();
  /* an unaligned live block keeps the granules it touches */
  void *q = torchalloc_malloc(3 * MiB, 0, S0); /* into the unmapped hole: two granules mapped again */
  CHECK(q == p[1]);
  CHECK_EQ(reserved(), 36 * MiB);
  CHECK_INVARIANTS();
  torchalloc_free(p[0], 16 * MiB, 0, S0);
  torchalloc_free(p[2], 16 * MiB, 0, S0);
  torchalloc_free(q, 3 * MiB, 0, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), 0);
  CHECK_EQ(violations(), 0);
}

TEST(memory_fraction_and_capacity_bound_the_growth) {
  REQUIRE(sim_reset("handle:2MiB,expandable:2,sim_capacity:100MiB") == 0);
  torchalloc_set_memory_fraction(0.5, 0);
  void *a = torchalloc_malloc(30 * MiB, 0, S0);
  REQUIRE(a);
  CHECK(torchalloc_malloc(30 * MiB, 0, S0) == NULL); /* 60 MiB > 50 MiB */
  CHECK_EQ(reserved(), 30 * MiB);
  torchalloc_set_memory_fraction(1.0, 0);
  void *b = torchalloc_malloc(30 * MiB, 0, S0);
  void *x = torchalloc_malloc(30 * MiB, 0, S0);
  REQUIRE(b && x);
  torchalloc_free(a, 30 * MiB, 0, S0);
  /* 40 MiB fits no hole and the device has 10 MiB left: a's memory is
   * unmapped and mapped again at the end */
  void *c = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(c);
  CHECK_EQ(reserved(), 100 * MiB);
  CHECK(torchalloc_malloc(2 * MiB, 0, S0) == NULL); /* the device is full of live blocks */
  CHECK_EQ(reserved(), 100 * MiB);
  CHECK_INVARIANTS();
  torchalloc_free(b, 30 * MiB, 0, S0);
  /* a's (unmapped) and b's (mapped) addresses are one free block now; 30
   * MiB there need a's granules mapped, so b's are unmapped first */
  void *d = torchalloc_malloc(30 * MiB, 0, S0);
  CHECK(d == a);
  CHECK_EQ(reserved(), 100 * MiB);
  CHECK_INVARIANTS();
  CHECK_EQ(violations(), 0);
}

/* A large-pool segment has four times the device's bytes of addresses, but
 * a request larger than the device fails as it did when it had as many:
 * nothing is mapped for it, and the memory is there for the next one. */
TEST(a_request_larger_than_the_device_maps_nothing) {
  REQUIRE(sim_reset("expandable:reclaim,sim_capacity:1GiB") == 0);
  void *a = torchalloc_malloc(64 * MiB, 0, S0);
  REQUIRE(a);
  int64_t maps = stats0().num_device_alloc;
  CHECK(torchalloc_malloc((size_t)2 << 30, 0, S0) == NULL);
  CHECK_EQ(stats0().num_device_alloc, maps); /* not one piece of it mapped first */
  CHECK_EQ(reserved(), 64 * MiB);
  void *b = torchalloc_malloc(900 * MiB, 0, S0);
  CHECK(b != NULL);
  CHECK_INVARIANTS();
  CHECK_EQ(violations(), 0);
  if (b) torchalloc_free(b, 900 * MiB, 0, S0);
  torchalloc_free(a, 64 * MiB, 0, S0);
}

TEST(no_unmapping_while_a_capture_may_be_underway) {
  REQUIRE(sim_reset("handle:2MiB,expandable:2") == 0);
  void *a = torchalloc_malloc(30 * MiB, 0, S0);
  void *b = torchalloc_malloc(30 * MiB, 0, S0);
  REQUIRE(a && b);
  torchalloc_free(a, 30 * MiB, 0, S0);
  REQUIRE(torchalloc_routing_begin(0) == 0);
  REQUIRE(torchalloc_sim_capture(0, S1, 1) == 0);
  void *c = torchalloc_malloc(40 * MiB, 0, S0); /* past the peak, but no synchronize allowed: grows */
  REQUIRE(c);
  CHECK_EQ(reserved(), 100 * MiB);
  CHECK_EQ(violations(), 0);
  REQUIRE(torchalloc_sim_capture(0, S1, 0) == 0);
  REQUIRE(torchalloc_routing_end(0) == 0);
  CHECK_INVARIANTS();
}

TEST(without_virtual_memory_it_falls_back_to_ordinary_segments) {
  REQUIRE(sim_reset("handle:2MiB,expandable:1,sim_vmm:0") == 0);
  void *a = torchalloc_malloc(3 * MiB, 0, S0);
  REQUIRE(a);
  CHECK_EQ(reserved(), 20 * MiB); /* the caching policy's 20 MiB segment */
  CHECK_INVARIANTS();
}

TEST(a_failed_map_leaves_the_allocator_consistent) {
  for (int n = 1; n <= 6; n++) {
    char conf[64];
    snprintf(conf, sizeof conf, "expandable:1,sim_fail_alloc:%d", n);
    REQUIRE(sim_reset(conf) == 0);
    void *p[6] = {0};
    for (int i = 0; i < 6; i++) {
      p[i] = torchalloc_malloc((size_t)(i + 1) * 5 * MiB, 0, i % 2 ? S1 : S0);
      if (i % 3 == 2 && p[i - 1]) {
        torchalloc_free(p[i - 1], (size_t)i * 5 * MiB, 0, (i - 1) % 2 ? S1 : S0);
        p[i - 1] = NULL;
      }
      CHECK_INVARIANTS();
    }
    CHECK_EQ(stats0().num_ooms, 0); /* the injected failure is retried after releasing the cache */
    for (int i = 0; i < 6; i++)
      if (p[i]) torchalloc_free(p[i], (size_t)(i + 1) * 5 * MiB, 0, i % 2 ? S1 : S0);
    torchalloc_empty_cache(0);
    CHECK_EQ(reserved(), 0);
    CHECK_EQ(violations(), 0);
  }
}

TEST(phase_arena_arenas_share_the_devices_memory) {
  REQUIRE(sim_reset("handle:2MiB,expandable:2,policy:phase_arena") == 0);
  REQUIRE(torchalloc_phase_begin("forward") >= 0);
  void *act = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(act);
  REQUIRE(torchalloc_phase_end("forward") == 0);
  torchalloc_free(act, 40 * MiB, 0, S0);
  REQUIRE(torchalloc_phase_begin("optimizer") >= 0);
  void *state = torchalloc_malloc(30 * MiB, 0, S0); /* its own arena: a new range, forward's memory unmapped first */
  REQUIRE(state);
  REQUIRE(torchalloc_phase_end("optimizer") == 0);
  CHECK_EQ(reserved(), 30 * MiB); /* forward's 40 MiB given back before the optimizer's 30 were mapped */
  CHECK_EQ(stats0().reserved_bytes[ALL].peak, 40 * MiB);
  CHECK_INVARIANTS();
  CHECK_EQ(violations(), 0);
}
