/* Runs (`run`, segments_runs.c): warm-up growth of the large pool mapped as
 * handles of several granules, on the simulated device, which refuses a
 * map, unmap or remap of part of a handle as the driver does. */
#include <string.h>

#include "reclaim_sim.h"
#include "torchalloc_sim.h"

#define HANDLE (8 * MiB) /* the large pool's handle: a run of 64 MiB is 8 of them */

/* A run is at most 1/64 of the reserve it joins, so the tests first make a
 * model's worth of memory, kept to the end on a stream of its own: 4 GiB,
 * 64 runs of 64 MiB (512 handles without runs). */
#define SB ((cudaStream_t)0x3000)
#define BASE (4 * GiB)
static void *base;
static int start(const char *conf) {
  if (sim_reset(conf) != 0) return -1;
  base = use_malloc(BASE, SB);
  return base ? 0 : -1;
}

/* 200 MiB then 100 MiB past it: 25 granules as three runs of 8 and one
 * alone, 13 as one run and five alone (runs of 64 MiB); in runs of 32 MiB
 * (the default), six of 4 and one alone, three of 4 and one alone; without
 * runs, one handle each. */
static int64_t handles_for_growth(const char *conf) {
  if (start(conf) != 0) return -1;
  int64_t before = stats0().num_handles_created;
  void *a = use_malloc(200 * MiB, S0);
  void *b = use_malloc(100 * MiB, S0);
  if (!a || !b) return -1;
  int64_t made = stats0().num_handles_created - before;
  CHECK_EQ(reserved(), (int64_t)BASE + 300 * MiB + 4 * MiB); /* 200 + 104 (13 granules) */
  CHECK_INVARIANTS();
  use_free(a, 200 * MiB, S0);
  use_free(b, 100 * MiB, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), (int64_t)BASE);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  return made;
}

TEST(warm_up_growth_is_mapped_in_runs_and_given_back_whole) {
  CHECK_EQ(handles_for_growth("expandable:reclaim,sim_lag:0,run:0"), 25 + 13);
  CHECK_EQ(handles_for_growth("expandable:reclaim,sim_lag:0"), 7 + 4); /* 32 MiB runs by default */
  CHECK_EQ(handles_for_growth("expandable:reclaim,sim_lag:0,run:32MiB"), 7 + 4);
  CHECK_EQ(handles_for_growth("expandable:reclaim,sim_lag:0,run:64MiB"), 4 + 6);
  CHECK_EQ(handles_for_growth("expandable:reclaim,sim_lag:0,run:256MiB"), 4 + 6); /* a 64th of the reserve: 64 MiB */
}

/* A run is at most 1/64 of the reserve it joins: a program's first
 * hundreds of MiB are made a granule a handle, and a run left partly in
 * use costs at most that share. */
TEST(runs_are_at_most_a_64th_of_the_reserve) {
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0,run:64MiB") == 0);
  void *a = use_malloc(200 * MiB, S0); /* 200 MiB / 64: no run of two granules */
  REQUIRE(a);
  CHECK_EQ(stats0().num_handles_created, 25);
  void *b = use_malloc(1800 * MiB, S0); /* 2000 MiB after: runs of three granules (31 MiB / 8 MiB) */
  REQUIRE(b);
  CHECK_EQ(stats0().num_handles_created, 25 + 75);
  use_free(a, 200 * MiB, S0);
  use_free(b, 1800 * MiB, S0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

/* Below the most ever reserved, memory is made a granule a handle: the
 * steady state moves granule by granule. */
TEST(growth_under_the_high_water_mark_makes_single_granules) {
  REQUIRE(start("expandable:reclaim,sim_lag:0,run:64MiB") == 0);
  void *a = use_malloc(128 * MiB, S0); /* two runs */
  REQUIRE(a);
  CHECK_EQ(stats0().num_handles_created, 64 + 2);
  use_free(a, 128 * MiB, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), (int64_t)BASE);
  void *b = use_malloc(128 * MiB, S0); /* the reserve is under its most: 16 handles */
  REQUIRE(b);
  CHECK_EQ(stats0().num_handles_created, 64 + 2 + 16);
  use_free(b, 128 * MiB, S0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

/* Runs serve the first ramp only: once allocated bytes fall below half
 * their most (a first step's activations freed), growth past the most is
 * made a granule a handle, as later steps' growth is transient. */
TEST(growth_after_the_first_ramp_makes_single_granules) {
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0,run:64MiB") == 0);
  void *a = use_malloc(4 * GiB, S0); /* 64 runs */
  void *b = use_malloc(4 * GiB, S0); /* still ramping: 64 more */
  REQUIRE(a && b);
  CHECK_EQ(stats0().num_handles_created, 128);
  use_free(b, 4 * GiB, S0);
  use_free(a, 4 * GiB, S0); /* allocated 0: the ramp is over */
  void *c = use_malloc(8 * GiB + 128 * MiB, S0); /* 128 MiB past the most: 16 granules */
  REQUIRE(c);
  CHECK_EQ(stats0().num_handles_created, 128 + 16);
  CHECK_EQ(reserved(), (int64_t)(8 * GiB + 128 * MiB));
  use_free(c, 8 * GiB + 128 * MiB, S0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

/* A run the device is past moves whole to another stream's request that
 * it fits in; one larger than what a request lacks goes back, and the
 * request gets single granules without the reserve growing. */
TEST(a_free_run_moves_whole_or_goes_back) {
  REQUIRE(start("expandable:reclaim,sim_lag:0,run:64MiB") == 0);
  void *a = use_malloc(64 * MiB, S0);
  void *b = use_malloc(8 * MiB, S0);
  REQUIRE(a && b);
  uint64_t a_memory = phys(a);
  use_free(a, 64 * MiB, S0);
  void *c = use_malloc(80 * MiB, S1); /* past the peak: a's run is 8 of the 10 granules it lacks */
  REQUIRE(c);
  CHECK_EQ(stats0().num_handles_moved, 1);
  int moved = 0;
  for (size_t g = 0; g < 10; g++) moved += phys((char *)c + g * HANDLE) == a_memory;
  CHECK_EQ(moved, 1); /* the run's handle, at one place in c */
  CHECK_EQ(reserved(), (int64_t)BASE + 88 * MiB);
  CHECK_EQ(syncs(), 0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();

  use_free(c, 80 * MiB, S1);
  int64_t released = stats0().num_handles_released;
  /* A third stream: c's memory is past; its run is larger than what d
   * lacks past c's two single granules (d is larger than the reserve's
   * slack, 1/128 of the most allocated, under which the reserve would grow
   * instead). */
  void *d = use_malloc(48 * MiB, S2);
  REQUIRE(d);
  CHECK_EQ(stats0().num_handles_released, released + 1); /* the run went back */
  void *e = use_malloc(90 * MiB, S2);
  REQUIRE(e);
  CHECK_EQ(reserved(), (int64_t)BASE + 8 * MiB + 48 * MiB + 96 * MiB); /* what lives (b, d, e), no more */
  CHECK_EQ(syncs(), 0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  use_free(b, 8 * MiB, S0);
  use_free(d, 48 * MiB, S2);
  use_free(e, 90 * MiB, S2);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), (int64_t)BASE);
  CHECK_EQ(violations(), 0);
}

/* Releasing the cache while a block lives inside a run keeps the whole run
 * mapped (the driver unmaps only whole handles), and the segment's end is
 * cut at the run's edge. */
TEST(a_run_partly_in_use_stays_mapped_whole) {
  REQUIRE(start("expandable:reclaim,sim_lag:0,run:64MiB") == 0);
  void *a = use_malloc(64 * MiB, S0);
  void *t = use_malloc(64 * MiB, S0);
  REQUIRE(a && t);
  use_free(a, 64 * MiB, S0);
  use_free(t, 64 * MiB, S0);
  void *b = use_malloc(4 * MiB, S0); /* in a's run */
  REQUIRE(b);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), (int64_t)BASE + 64 * MiB); /* the run b lies in; t's went back */
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  use_free(b, 4 * MiB, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), (int64_t)BASE);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

/* Runs partly in use hold free granules that reclaim cannot move: the
 * out-of-memory path breaks them (the granules in use copied to handles of
 * their own, the free ones given back) before a request fails. */
TEST(the_out_of_memory_path_breaks_runs_holding_free_granules) {
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0,run:64MiB,sim_capacity:16GiB") == 0);
  void *big = use_malloc(15 * GiB, S0); /* 240 runs */
  REQUIRE(big);
  CHECK_EQ(stats0().num_handles_created, 240);
  use_free(big, 15 * GiB, S0);
  enum { N = 384 }; /* 40 MiB each (five granules) over the runs, then every other freed */
  static void *p[N];
  for (int i = 0; i < N; i++) REQUIRE((p[i] = use_malloc(40 * MiB, S0)) != NULL);
  for (int i = 0; i < N; i += 2) use_free(p[i], 40 * MiB, S0);
  CHECK_INVARIANTS();
  void *q = use_malloc(7 * GiB, S1); /* 7.5 GiB free in 40 MiB holes, every run partly in use */
  CHECK(q != NULL);
  CHECK(stats0().num_alloc_retries > 0);
  CHECK(reserved() <= (int64_t)(16 * GiB));
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  if (q) use_free(q, 7 * GiB, S1);
  for (int i = 1; i < N; i += 2) use_free(p[i], 40 * MiB, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), 0);
  CHECK_INVARIANTS();
}

/* PyTorch's IPC format has one handle size a segment: a block on a run is
 * shared once the run is a handle a granule, and the memory opened is the
 * block's. */
TEST(a_block_on_a_run_is_shared_in_pytorchs_format) {
  REQUIRE(start("expandable:reclaim,sim_lag:0,run:64MiB") == 0);
  void *a = use_malloc(100 * MiB, S0); /* one run of 8 granules and five alone */
  REQUIRE(a);
  unsigned char bytes[4096];
  size_t len = 0, offset = 0;
  REQUIRE(torchalloc_ipc_share(a, bytes, sizeof bytes, &len, &offset) == 0);
  uint64_t handle = 0, n = 0;
  memcpy(&handle, bytes + 10, 8);
  memcpy(&n, bytes + 18, 8);
  CHECK_EQ(handle, HANDLE);
  CHECK_EQ(n, 13);
  CHECK_EQ(offset, 0);
  CHECK_EQ(reserved(), (int64_t)BASE + 104 * MiB);
  CHECK_INVARIANTS();
  void *q = NULL;
  REQUIRE(torchalloc_ipc_open(0, bytes, len, &q) == 0);
  for (size_t g = 0; g < 13; g++) /* every granule opened is the block's memory */
    CHECK_EQ(phys((char *)q + offset + g * HANDLE), phys((char *)a + g * HANDLE));
  CHECK_EQ(torchalloc_ipc_close(q), 0);
  use_free(a, 100 * MiB, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), (int64_t)BASE);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}
