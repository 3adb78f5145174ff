/* The caching policy against PyTorch's documented behaviour, on the sim device. */
#include "sim.h"

TEST(rounds_to_512_bytes) {
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(1, 0, S0);
  void *b = torchalloc_malloc(513, 0, S0);
  REQUIRE(a && b);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 512 + 1024);
  CHECK_EQ(s.requested_bytes[ALL].current, 1 + 513);
  CHECK_EQ(s.allocation[ALL].current, 2);
  CHECK_EQ((char *)b - (char *)a, 512); /* carved one after the other from the same segment */
  torchalloc_free(a, 1, 0, S0);
  torchalloc_free(b, 513, 0, S0);
  CHECK_INVARIANTS();
}

TEST(size_zero_returns_null_and_counts_nothing) {
  REQUIRE(sim_reset("") == 0);
  CHECK(torchalloc_malloc(0, 0, S0) == NULL);
  CHECK_EQ(stats0().allocation[ALL].allocated, 0);
}

TEST(pool_and_segment_size_follow_pytorch) {
  static const struct {
    size_t request, block, reserved;
    int pool;
  } cases[] = {
      {1 * MiB, 1 * MiB, 2 * MiB, SMALL},                    /* <= 1 MiB: small pool, 2 MiB segment */
      {1 * MiB + 1, 1 * MiB + 512, 20 * MiB, LARGE},         /* 1-10 MiB: 20 MiB segment */
      {10 * MiB - 512, 10 * MiB - 512, 20 * MiB, LARGE},     /* remainder 10 MiB + 512 > 1 MiB: split */
      {10 * MiB, 10 * MiB, 10 * MiB, LARGE},                 /* >= 10 MiB: own segment */
      {11 * MiB + 1, 12 * MiB, 12 * MiB, LARGE},             /* segment 12 MiB; remainder < 1 MiB: whole block */
      {10 * MiB + 512, 10 * MiB + 512, 12 * MiB, LARGE},     /* remainder 2 MiB - 512 > 1 MiB: split */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    REQUIRE(sim_reset("") == 0);
    void *p = torchalloc_malloc(cases[i].request, 0, S0);
    REQUIRE(p);
    torchalloc_stats s = stats0();
    CHECK_EQ(s.reserved_bytes[cases[i].pool].current, cases[i].reserved);
    CHECK_EQ(s.reserved_bytes[ALL].current, cases[i].reserved);
    CHECK_EQ(s.segment[cases[i].pool].current, 1);
    CHECK_EQ(s.allocated_bytes[cases[i].pool].current, cases[i].block);
    CHECK_INVARIANTS();
  }
}

TEST(large_block_is_split_only_when_remainder_exceeds_1MiB) {
  REQUIRE(sim_reset("") == 0);
  /* One 20 MiB segment: 9 MiB + 9 MiB leave 2 MiB (> 1 MiB: split); then a
   * 1.5 MiB request leaves 0.5 MiB, so it gets the whole 2 MiB block. */
  void *a = torchalloc_malloc(9 * MiB, 0, S0);
  void *b = torchalloc_malloc(9 * MiB, 0, S0);
  void *c = torchalloc_malloc(3 * MiB / 2, 0, S0);
  REQUIRE(a && b && c);
  CHECK_EQ((char *)b - (char *)a, 9 * MiB);
  CHECK_EQ((char *)c - (char *)b, 9 * MiB);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.segment[ALL].current, 1);
  CHECK_EQ(s.allocated_bytes[LARGE].current, 20 * MiB);
  CHECK_EQ(s.requested_bytes[LARGE].current, 18 * MiB + 3 * MiB / 2);
  CHECK_EQ(s.inactive_split[ALL].current, 0);
  CHECK_INVARIANTS();
  torchalloc_free(a, 9 * MiB, 0, S0);
  torchalloc_free(b, 9 * MiB, 0, S0);
  torchalloc_free(c, 3 * MiB / 2, 0, S0);
}

TEST(split_creates_inactive_split_and_coalescing_removes_it) {
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(4096, 0, S0);
  void *b = torchalloc_malloc(4096, 0, S0);
  void *c = torchalloc_malloc(4096, 0, S0);
  REQUIRE(a && b && c);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.inactive_split[SMALL].current, 1); /* the tail of the 2 MiB segment */
  CHECK_EQ(s.inactive_split_bytes[SMALL].current, 2 * MiB - 3 * 4096);
  torchalloc_free(a, 4096, 0, S0);
  torchalloc_free(c, 4096, 0, S0); /* merges with the tail */
  s = stats0();
  CHECK_EQ(s.inactive_split[SMALL].current, 2);
  CHECK_EQ(s.inactive_split_bytes[SMALL].current, 2 * MiB - 4096);
  CHECK_INVARIANTS();
  torchalloc_free(b, 4096, 0, S0); /* all three merge into the whole segment */
  s = stats0();
  CHECK_EQ(s.inactive_split[ALL].current, 0);
  CHECK_EQ(s.inactive_split_bytes[ALL].current, 0);
  CHECK_EQ(s.reserved_bytes[ALL].current, 2 * MiB); /* cached, not released */
  CHECK_EQ(s.allocated_bytes[ALL].current, 0);
  /* The coalesced segment serves a 1 MiB request from its start. */
  void *d = torchalloc_malloc(1 * MiB, 0, S0);
  CHECK(d == a);
  CHECK_EQ(stats0().segment[ALL].allocated, 1);
  torchalloc_free(d, 1 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(best_fit_prefers_the_smallest_fitting_block) {
  REQUIRE(sim_reset("") == 0);
  /* Free holes of 8 KiB and 4 KiB separated by live blocks; a 4 KiB request
   * takes the 4 KiB hole, not the first or larger one. */
  void *h8 = torchalloc_malloc(8192, 0, S0);
  void *x = torchalloc_malloc(512, 0, S0);
  void *h4 = torchalloc_malloc(4096, 0, S0);
  void *y = torchalloc_malloc(512, 0, S0);
  REQUIRE(h8 && x && h4 && y);
  torchalloc_free(h8, 8192, 0, S0);
  torchalloc_free(h4, 4096, 0, S0);
  void *p = torchalloc_malloc(4000, 0, S0);
  CHECK(p == h4);
  torchalloc_free(p, 4000, 0, S0);
  torchalloc_free(x, 512, 0, S0);
  torchalloc_free(y, 512, 0, S0);
  CHECK_INVARIANTS();
}

TEST(freed_blocks_are_reused_only_on_their_stream) {
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(3 * MiB, 0, S1);
  REQUIRE(a);
  torchalloc_free(a, 3 * MiB, 0, S1);
  void *b = torchalloc_malloc(3 * MiB, 0, S2);
  REQUIRE(b);
  CHECK(b != a);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 40 * MiB); /* a second segment for S2 */
  void *c = torchalloc_malloc(3 * MiB, 0, S1);
  CHECK(c == a); /* S1's cached block */
  CHECK_EQ(stats0().segment[ALL].allocated, 2);
  torchalloc_free(b, 3 * MiB, 0, S2);
  torchalloc_free(c, 3 * MiB, 0, S1);
  CHECK_INVARIANTS();
}

TEST(oom_releases_cached_segments_and_retries_once) {
  REQUIRE(sim_reset("sim_capacity:40MiB") == 0);
  void *a = torchalloc_malloc(2 * MiB, 0, S1);
  void *b = torchalloc_malloc(2 * MiB, 0, S2);
  REQUIRE(a && b);
  torchalloc_free(a, 2 * MiB, 0, S1);
  torchalloc_free(b, 2 * MiB, 0, S2);
  /* 40 MiB reserved in two cached segments; 30 MiB fits only after both go. */
  void *c = torchalloc_malloc(30 * MiB, 0, S1);
  REQUIRE(c);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.num_alloc_retries, 1);
  CHECK_EQ(s.num_ooms, 0);
  CHECK_EQ(s.num_device_free, 2);
  CHECK_EQ(s.reserved_bytes[ALL].current, 30 * MiB);
  /* Nothing cached is left to release: the second request fails cleanly. */
  CHECK(torchalloc_malloc(30 * MiB, 0, S1) == NULL);
  s = stats0();
  CHECK_EQ(s.num_alloc_retries, 2);
  CHECK_EQ(s.num_ooms, 1);
  CHECK_EQ(s.allocation[ALL].current, 1);
  CHECK_INVARIANTS();
  torchalloc_free(c, 30 * MiB, 0, S1);
}

TEST(fault_injection_fails_the_nth_device_allocation) {
  REQUIRE(sim_reset("sim_fail_alloc:2") == 0);
  void *a = torchalloc_malloc(512, 0, S0);      /* device alloc 1: a small segment */
  void *b = torchalloc_malloc(12 * MiB, 0, S0); /* 2 fails, the retry (3) succeeds */
  REQUIRE(a && b);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.num_alloc_retries, 1);
  CHECK_EQ(s.num_ooms, 0);
  CHECK_EQ(s.num_device_alloc, 2);
  torchalloc_free(a, 512, 0, S0);
  torchalloc_free(b, 12 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(stats_follow_torch_semantics_exactly) {
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(1000, 0, S0);      /* 1024 B small */
  void *b = torchalloc_malloc(5 * MiB, 0, S0);   /* 5 MiB large in a 20 MiB segment */
  void *c = torchalloc_malloc(100 * MiB, 0, S0); /* own 100 MiB segment */
  REQUIRE(a && b && c);
  torchalloc_free(b, 5 * MiB, 0, S0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocation[ALL].current, 2);
  CHECK_EQ(s.allocation[ALL].peak, 3);
  CHECK_EQ(s.allocation[ALL].allocated, 3);
  CHECK_EQ(s.allocation[ALL].freed, 1);
  CHECK_EQ(s.allocation[SMALL].current, 1);
  CHECK_EQ(s.allocation[LARGE].current, 1);
  CHECK_EQ(s.allocated_bytes[ALL].current, 1024 + 100 * MiB);
  CHECK_EQ(s.allocated_bytes[ALL].peak, 1024 + 105 * MiB);
  CHECK_EQ(s.allocated_bytes[LARGE].freed, 5 * MiB);
  CHECK_EQ(s.requested_bytes[ALL].current, 1000 + 100 * MiB);
  CHECK_EQ(s.active_bytes[ALL].current, 1024 + 100 * MiB);
  CHECK_EQ(s.reserved_bytes[ALL].current, 2 * MiB + 20 * MiB + 100 * MiB);
  CHECK_EQ(s.reserved_bytes[SMALL].current, 2 * MiB);
  CHECK_EQ(s.segment[ALL].current, 3);
  CHECK_EQ(s.segment[LARGE].current, 2);
  CHECK_EQ(s.inactive_split[SMALL].current, 1); /* small segment tail; the 20 MiB one is whole again */
  CHECK_EQ(s.inactive_split_bytes[SMALL].current, 2 * MiB - 1024);
  CHECK_EQ(s.inactive_split[LARGE].current, 0);
  CHECK_EQ(s.num_device_alloc, 3);
  CHECK_EQ(s.num_device_free, 0);
  /* Peak reset keeps current, drops history. */
  CHECK_EQ(torchalloc_reset_peak_stats(0), 0);
  s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].peak, 1024 + 100 * MiB);
  CHECK_EQ(s.allocation[ALL].peak, 2);
  CHECK_EQ(torchalloc_reset_accumulated_stats(0), 0);
  s = stats0();
  CHECK_EQ(s.allocation[ALL].allocated, 0);
  CHECK_EQ(s.num_device_alloc, 0);
  CHECK_EQ(s.allocation[ALL].current, 2);
  /* empty_cache releases only fully free segments: the 20 MiB one. */
  CHECK_EQ(torchalloc_empty_cache(0), 20 * MiB);
  s = stats0();
  CHECK_EQ(s.reserved_bytes[ALL].current, 102 * MiB);
  CHECK_EQ(s.num_device_free, 1);
  torchalloc_free(a, 1000, 0, S0);
  torchalloc_free(c, 100 * MiB, 0, S0);
  CHECK_EQ(torchalloc_empty_cache(-1), 102 * MiB);
  s = stats0();
  CHECK_EQ(s.reserved_bytes[ALL].current, 0);
  CHECK_EQ(s.allocated_bytes[ALL].current, 0);
  CHECK_INVARIANTS();
}

/* A reset of the accumulated stats zeroes torch's counters, torchalloc's
 * own and every pooled stat's allocated and freed, and keeps the misuse
 * counters (a reset must not hide misuse) and the version: the kinds
 * TORCHALLOC_STATS_FIELDS gives the fields, walked here field by field. */
TEST(reset_accumulated_stats_goes_by_each_fields_kind) {
  REQUIRE(sim_reset("sim_capacity:64MiB,time_calls:1") == 0);
  void *a = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(a);
  CHECK(torchalloc_malloc(40 * MiB, 0, S0) == NULL); /* past the capacity: a retry and an OOM */
  torchalloc_free(a, 40 * MiB, 0, S0);
  torchalloc_free(a, 40 * MiB, 0, S0); /* a double free */
  CHECK_EQ(torchalloc_empty_cache(0), 40 * MiB);
  torchalloc_stats before = stats0(), after;
  CHECK(before.num_ooms == 1 && before.num_device_free == 1 && before.timed_calls > 0);
  CHECK_EQ(before.num_bad_double_free, 1);
  CHECK_EQ(torchalloc_reset_accumulated_stats(0), 0);
  after = stats0();
#define KEPT(name) CHECK_EQ(after.name, before.name);
#define ZEROED(name) CHECK_EQ(after.name, 0);
#define RESET_version(name) KEPT(name)
#define RESET_misuse(name) KEPT(name)
#define RESET_torch(name) ZEROED(name)
#define RESET_torchalloc(name) ZEROED(name)
#define RESET_pooled(name)                                 \
  for (int pool = 0; pool < TORCHALLOC_NPOOLS; pool++) { \
    ZEROED(name[pool].allocated)                         \
    ZEROED(name[pool].freed)                             \
    KEPT(name[pool].current)                             \
  }
#define RESET(kind, name) RESET_##kind(name)
  TORCHALLOC_STATS_FIELDS(RESET)
}

TEST(an_80GiB_trace_simulates_without_host_memory) {
  REQUIRE(sim_reset("sim_capacity:80GiB") == 0);
  void *p[79];
  for (int i = 0; i < 79; i++) {
    p[i] = torchalloc_malloc(1 * GiB, 0, S0);
    REQUIRE(p[i]);
  }
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 79 * GiB);
  CHECK(torchalloc_malloc(2 * GiB, 0, S0) == NULL);
  for (int i = 0; i < 79; i++) torchalloc_free(p[i], 1 * GiB, 0, S0);
  CHECK_INVARIANTS();
}

/* The block at `addr` in device 0's snapshot (its state and requested bytes). */
static torchalloc_block_info snapshot_block(void *addr) {
  torchalloc_segment_info segs[16];
  torchalloc_block_info blocks[64];
  size_t nseg = 0, nblk = 0;
  torchalloc_block_info none = {.state = 0xff};
  if (torchalloc_snapshot(0, segs, 16, blocks, 64, &nseg, &nblk) != 0) return none;
  for (size_t i = 0; i < nblk; i++)
    if (blocks[i].addr == (uint64_t)(uintptr_t)addr) return blocks[i];
  return none;
}

/* PyTorch's snapshot shows a free block with the size of the last request
 * it served (memory_plots finds a freed tensor's size there), and a free
 * block split off another with that block's; bytes never handed out show 0.
 * The stats count requested bytes of live blocks only. */
TEST(a_freed_block_keeps_its_last_requested_size_in_the_snapshot) {
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(65536, 0, S0); /* a 128 x 128 float tensor */
  void *b = torchalloc_malloc(1000, 0, S0);
  REQUIRE(a && b);
  torchalloc_block_info tail = snapshot_block((char *)b + 1024); /* the rest of the 2 MiB segment */
  CHECK_EQ(tail.state, TORCHALLOC_BLOCK_FREE);
  CHECK_EQ(tail.requested, 0);
  torchalloc_free(a, 65536, 0, S0);
  torchalloc_block_info freed = snapshot_block(a);
  CHECK_EQ(freed.state, TORCHALLOC_BLOCK_FREE);
  CHECK_EQ(freed.requested, 65536);
  CHECK_EQ(stats0().requested_bytes[ALL].current, 1000);
  void *c = torchalloc_malloc(30000, 0, S0); /* best fit: the head of a's 64 KiB; the rest split off */
  REQUIRE(c == a);
  torchalloc_block_info rest = snapshot_block((char *)a + 30208);
  CHECK_EQ(rest.state, TORCHALLOC_BLOCK_FREE);
  CHECK_EQ(rest.requested, 65536); /* as PyTorch's split remainder keeps the block's */
  CHECK_EQ(snapshot_block(a).requested, 30000);
  torchalloc_free(b, 1000, 0, S0); /* merges with the free blocks on both sides; b's descriptor survives */
  CHECK_EQ(snapshot_block((char *)a + 30208).requested, 1000);
  torchalloc_free(c, 30000, 0, S0);
  CHECK_EQ(snapshot_block(a).requested, 30000); /* a's whole segment is one free block again */
  torchalloc_stats s = stats0();
  CHECK_EQ(s.requested_bytes[ALL].current, 0);
  CHECK_EQ(s.requested_bytes[ALL].allocated, 65536 + 1000 + 30000);
  CHECK_EQ(s.requested_bytes[ALL].freed, 65536 + 1000 + 30000);
  CHECK_INVARIANTS();
}
