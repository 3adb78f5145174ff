/* The reclaim mode's layout over repeated steps (a request placed on mapped
 * memory first, the move budget, retiring blocks at the growing end), phase
 * arenas sharing memory, and what the snapshot and the OOM detail count, on
 * the simulated device with its lag model (reclaim_sim.h; test_reclaim.c has
 * the rest of the mode). */
#include "reclaim_sim.h"

/* One step, repeated: a 24 MiB block, a 2 MiB one after it, the first
 * freed and a 30 MiB one asked for while the second lives, then both
 * freed. The 30 MiB fit no mapped run the step left (the 2 MiB block lives
 * in the middle of it): past the most ever reserved, each step moves
 * handles to where the 30 MiB go. */
static void thrash(int steps, uint64_t ticks_between) {
  for (int i = 0; i < steps; i++) {
    void *a = use_malloc(24 * MiB, S0), *keep = a ? use_malloc(2 * MiB, S0) : NULL;
    REQUIRE(a && keep);
    use_free(a, 24 * MiB, S0);
    torchalloc_sim_advance(0, ticks_between);
    void *c = use_malloc(30 * MiB, S0);
    REQUIRE(c);
    use_free(c, 30 * MiB, S0);
    use_free(keep, 2 * MiB, S0);
    torchalloc_sim_advance(0, ticks_between);
  }
}

/* A step that repeats the last one's requests settles: a 24 MiB block
 * freed, then 30 MiB while a 2 MiB block lives after where the 24 were.
 * The 30 MiB go past the end once, on handles moved there; from then on
 * the 24 MiB go on those mapped handles too (inside the free block that
 * starts on the granules given back), so nothing moves or grows again. */
TEST(a_request_goes_on_mapped_memory_before_granules_given_back_and_the_layout_settles) {
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0") == 0);
  void *first = use_malloc(24 * MiB, S0), *keep = first ? use_malloc(2 * MiB, S0) : NULL;
  REQUIRE(first && keep);
  use_free(first, 24 * MiB, S0);
  void *where = NULL;
  int64_t moved = 0, peak = 0;
  for (int step = 0; step < 50; step++) {
    if (step == 2) {
      moved = stats0().num_handles_moved;
      peak = stats0().reserved_bytes[ALL].peak;
    }
    void *a = use_malloc(24 * MiB, S0);
    REQUIRE(a);
    use_free(a, 24 * MiB, S0);
    torchalloc_sim_advance(0, 1);
    void *c = use_malloc(30 * MiB, S0);
    REQUIRE(c);
    if (step >= 2) CHECK(c == where); /* the same address every step */
    where = c;
    use_free(c, 30 * MiB, S0);
    torchalloc_sim_advance(0, 1);
  }
  CHECK(moved > 0);                                 /* the first steps moved handles past the end */
  CHECK_EQ(stats0().num_handles_moved, moved);      /* then none */
  CHECK_EQ(stats0().reserved_bytes[ALL].peak, peak); /* nor grew */
  CHECK(peak <= (int64_t)(40 * MiB));               /* 32 MiB live at most: within a handle of it */
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  use_free(keep, 2 * MiB, S0);
}

/* move_time:5: while the device waits for the host, moves are the step's
 * time: they take at most 5 per mille of it, past a burst; then the
 * reserve grows instead, and later steps move nothing. Without the key
 * (no limit), or with host work between the steps, they go on. */
TEST(moves_while_the_device_waits_stop_at_the_budget_and_the_layout_settles) {
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0,move_time:5") == 0); /* the device keeps up: markers done at once */
  thrash(60, 1);
  int64_t early = stats0().num_handles_moved, grown = stats0().reserved_bytes[ALL].peak;
  CHECK(early > 0); /* the burst: the first steps moved memory */
  CHECK(grown > (int64_t)(40 * MiB)); /* then the reserve grew past what the step needs (32 MiB live at most) */
  CHECK(stats0().num_moves_declined > 0); /* counted: each growth the budget chose over a move */
  thrash(60, 1);
  CHECK_EQ(stats0().num_handles_moved, early); /* settled: nothing moves any more */
  CHECK_EQ(stats0().reserved_bytes[ALL].peak, grown);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();

  /* No limit (the default): the same steps move memory every time and the reserve stays at what they need. */
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0") == 0);
  thrash(120, 1);
  int64_t unlimited = stats0().num_handles_moved;
  CHECK_EQ(stats0().num_moves_declined, 0);
  CHECK(unlimited >= 120 * 2); /* each step moves handles */
  CHECK(stats0().reserved_bytes[ALL].peak < grown);

  /* Much host work between steps: the budget refills, and moves go on as without a limit. */
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0,move_time:5") == 0);
  thrash(120, 1000000);
  CHECK_EQ(stats0().num_handles_moved, unlimited);

  fprintf(stderr, "  moves: %lld in the budget's burst, then none (%lld MiB reserved); %lld without a limit or with host "
          "work between (%lld MiB)\n", (long long)early, (long long)(grown / MiB), (long long)unlimited,
          (long long)(stats0().reserved_bytes[ALL].peak / MiB));
}

/* grow_below:1GiB (off by default): a reserve that small grows instead of
 * moving, whatever the device is doing, up to twice the most allocated;
 * the same steps then settle at once. Above it they move as before. */
TEST(a_small_reserve_grows_instead_of_moving_up_to_twice_what_lives) {
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:1000000,grow_below:1GiB") == 0); /* the device far behind */
  thrash(60, 1);
  int64_t moved = stats0().num_handles_moved, grown = stats0().reserved_bytes[ALL].peak;
  CHECK_EQ(moved, 0);
  CHECK(stats0().num_moves_declined > 0);
  CHECK(grown > (int64_t)(40 * MiB));      /* past what the steps need (32 MiB live at most) */
  CHECK(grown <= 2 * (int64_t)(32 * MiB)); /* within twice the most allocated */
  thrash(60, 1);
  CHECK_EQ(stats0().num_handles_moved, 0);
  CHECK_EQ(stats0().reserved_bytes[ALL].peak, grown);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  /* Above grow_below (16 MiB here) it moves as before. */
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:1000000,grow_below:16MiB") == 0);
  thrash(60, 1);
  CHECK(stats0().num_handles_moved > 0);
  CHECK(stats0().reserved_bytes[ALL].peak < grown);
  fprintf(stderr, "  grow_below:1GiB: 0 moves at %lld MiB reserved; grow_below:16MiB: %lld moves at %lld MiB\n",
          (long long)(grown / MiB), (long long)stats0().num_handles_moved,
          (long long)(stats0().reserved_bytes[ALL].peak / MiB));
  /* A stream per request: each new stream's segment takes the last one's memory (the device is past it) once
   * the reserve is twice the most allocated, instead of new memory up to grow_below. */
  REQUIRE(sim_reset("expandable:reclaim,sim_lag:0,grow_below:1GiB") == 0);
  for (uintptr_t i = 0; i < 2000; i++) {
    void *p = use_malloc(3 * MiB, (cudaStream_t)(0x10000 + i));
    REQUIRE(p);
    use_free(p, 3 * MiB, (cudaStream_t)(0x10000 + i));
  }
  CHECK(stats0().reserved_bytes[ALL].peak <= (int64_t)(16 * MiB));
  CHECK_INVARIANTS();
}

/* phase_arena's arenas, one per phase, lend to each other on one stream
 * (the device never catches up here), and take what it is past, on any. */
TEST(phase_arena_arenas_share_memory_without_synchronizing) {
  REQUIRE(sim_reset("handle:2MiB,expandable:reclaim,policy:phase_arena,sim_lag:100000") == 0);
  REQUIRE(torchalloc_phase_begin("forward") >= 0);
  void *act = use_malloc(40 * MiB, S0);
  REQUIRE(act);
  REQUIRE(torchalloc_phase_end("forward") == 0);
  use_free(act, 40 * MiB, S0);
  REQUIRE(torchalloc_phase_begin("optimizer") >= 0);
  void *state = use_malloc(30 * MiB, S0); /* its own arena: forward's memory is lent to it */
  REQUIRE(state);
  REQUIRE(torchalloc_phase_end("optimizer") == 0);
  CHECK_EQ(stats0().reserved_bytes[ALL].peak, 40 * MiB);
  CHECK_EQ(reserved(), 40 * MiB);
  torchalloc_sim_advance(0, 100000);
  REQUIRE(torchalloc_phase_begin("backward") >= 0);
  void *grad = use_malloc(10 * MiB, S1); /* another stream: forward's remaining 10 MiB, past now */
  REQUIRE(grad);
  REQUIRE(torchalloc_phase_end("backward") == 0);
  CHECK_EQ(stats0().reserved_bytes[ALL].peak, 40 * MiB);
  CHECK_EQ(syncs(), 0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

/* The model itself: a kernel racing another stream's queued kernel on the
 * same memory is caught, and is not once the device is past it. */
TEST(the_sim_catches_memory_used_by_two_streams_at_once) {
  REQUIRE(sim_reset("handle:2MiB,expandable:reclaim,sim_lag:5") == 0);
  void *a = torchalloc_malloc(4 * MiB, 0, S0);
  REQUIRE(a);
  torchalloc_sim_use(0, S0, a, 4 * MiB);
  CHECK_EQ(torchalloc_sim_capture_violations(0, NULL, 0), 0);
  torchalloc_sim_use(0, S1, (char *)a + 2 * MiB, 512); /* S0's kernel may still run */
  CHECK_EQ(torchalloc_sim_capture_violations(0, NULL, 0), 1);
  torchalloc_sim_advance(0, 5);
  torchalloc_sim_use(0, S1, a, 4 * MiB);
  CHECK_EQ(torchalloc_sim_capture_violations(0, NULL, 0), 1);
  torchalloc_sim_use(0, S0, (char *)a + 8 * MiB, 512); /* past a's 4 MiB: not mapped */
  CHECK_EQ(torchalloc_sim_capture_violations(0, NULL, 0), 2);
  torchalloc_free(a, 4 * MiB, 0, S0);
}

/* Found by a mutation run: a retiring block right before the free end of
 * its range, when that range grows, must not merge the free end away under
 * the growth (the merged-away descriptor was still being extended). */
TEST(a_retiring_block_before_the_growing_end_waits_for_the_growth) {
  REQUIRE(sim_reset("handle:2MiB,expandable:reclaim,sim_lag:1000") == 0);
  void *a = use_malloc(10 * MiB, S0);
  void *f = use_malloc(30 * MiB, S0);
  REQUIRE(a && f);
  use_free(f, 30 * MiB, S0);           /* the range: [a][30 MiB free, its end] */
  void *s = use_malloc(1 * MiB, S0);   /* the small pool's first granule: lent from the free end's start */
  REQUIRE(s);
  CHECK_EQ(reserved(), 40 * MiB);
  torchalloc_sim_advance(0, 1000);     /* the lent granule's old address may retire now */
  void *g = use_malloc(40 * MiB, S0);  /* the free end (28 MiB) grows by 12: a retire would merge it away */
  REQUIRE(g);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  void *h = use_malloc(64 * MiB, S0);  /* the next request past the peak retires it */
  REQUIRE(h);
  CHECK_EQ(violations(), 0);
  CHECK_EQ(syncs(), 0);
  CHECK_INVARIANTS();
}

/* Found by the mixed run: a range whose last block is retiring grows (a new
 * block after it); retiring that block then would leave it free and indexed
 * as unsplit while the new block makes it split (inactive_split off by one). */
TEST(a_range_ending_in_a_retiring_block_grows_after_it) {
  REQUIRE(sim_reset("handle:2MiB,expandable:reclaim,sim_lag:1000") == 0);
  void *s = use_malloc(1 * MiB, S0);     /* the small pool: one granule */
  void *big = use_malloc(30 * MiB, S0);
  REQUIRE(s && big);
  use_free(s, 1 * MiB, S0);              /* the small range: one free granule, its only block */
  void *more = use_malloc(32 * MiB, S0); /* past the peak: the small granule is lent to the large range */
  REQUIRE(more);
  CHECK_EQ(reserved(), 62 * MiB);
  torchalloc_sim_advance(0, 1000);
  void *t = use_malloc(300 * KiB, S0);   /* the small range grows after its retiring block */
  REQUIRE(t);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
  use_free(t, 300 * KiB, S0);
  use_free(big, 30 * MiB, S0);
  use_free(more, 32 * MiB, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(reserved(), 0);
  CHECK_INVARIANTS();
}

/* torchalloc_snapshot (and so torch.cuda.memory._snapshot() on the bridge):
 * an expandable segment shows as its mapped stretches, as PyTorch shows its
 * own, so the segments add up to the reserved bytes; memory lent away is in
 * none of them. */
TEST(the_snapshot_shows_mapped_stretches_that_add_up_to_reserved) {
  REQUIRE(sim_reset("handle:2MiB,expandable:reclaim,sim_lag:1000") == 0);
  void *a = use_malloc(30 * MiB, S0);
  void *b = use_malloc(30 * MiB, S0);
  REQUIRE(a && b);
  use_free(a, 30 * MiB, S0);
  void *c = use_malloc(40 * MiB, S0); /* a's memory lent to c: a's addresses retire later */
  REQUIRE(c);
  torchalloc_segment_info segs[16];
  torchalloc_block_info blocks[64];
  size_t ns = 0, nb = 0;
  REQUIRE(torchalloc_snapshot(0, segs, 16, blocks, 64, &ns, &nb) == 0);
  int64_t total = 0;
  int live = 0;
  for (size_t i = 0; i < ns; i++) {
    total += (int64_t)segs[i].size;
    CHECK_EQ(segs[i].expandable, 1);
    CHECK(!overlaps((void *)(uintptr_t)segs[i].addr, segs[i].size, a, 30 * MiB));
    for (uint32_t k = 0; k < segs[i].nblocks; k++) live += blocks[segs[i].first_block + k].state == TORCHALLOC_BLOCK_LIVE;
  }
  CHECK_EQ(total, reserved());
  CHECK_EQ(live, 2);
  REQUIRE(sim_reset("handle:2MiB,expandable:off") == 0); /* ordinary segments: one each, whole */
  a = torchalloc_malloc(3 * MiB, 0, S0);
  REQUIRE(a);
  REQUIRE(torchalloc_snapshot(0, segs, 16, blocks, 64, &ns, &nb) == 0);
  CHECK_EQ(ns, 1);
  CHECK_EQ(segs[0].size, 20 * MiB);
  CHECK_EQ(segs[0].expandable, 0);
}

/* Found by fuzz_api: the out-of-memory detail counted retiring blocks (no
 * caller holds them) as live blocks pinning their segment, so its "pinning"
 * figure came out above the bytes allocated. A failure while routing
 * releases nothing, so the retiring blocks are still there. */
TEST(the_oom_detail_counts_no_retiring_block_as_live) {
  REQUIRE(sim_reset("handle:2MiB,expandable:reclaim,sim_lag:1000,sim_capacity:128MiB,oom_report:off") == 0);
  void *a = use_malloc(30 * MiB, S0);
  void *b = use_malloc(30 * MiB, S0);
  void *d = use_malloc(6 * MiB, S0);
  void *e = use_malloc(2 * MiB, S0);
  REQUIRE(a && b && d && e);
  use_free(a, 30 * MiB, S0);
  void *c = use_malloc(40 * MiB, S0); /* a's memory lent to c: a's addresses retiring for 1000 ticks */
  REQUIRE(c);
  use_free(d, 6 * MiB, S0);            /* a free hole between live blocks */
  REQUIRE(torchalloc_routing_begin(0) == 0); /* a capture may be underway: the failure releases nothing */
  CHECK(torchalloc_malloc(512 * MiB, 0, S0) == NULL);
  REQUIRE(torchalloc_routing_end(0) == 0);
  torchalloc_oom_facts f;
  torchalloc_oom_detail detail = {.struct_size = sizeof detail};
  int verdict = 0;
  REQUIRE(torchalloc_last_oom(0, &f, &verdict) == 0 && torchalloc_last_oom_detail(0, &detail) == 0);
  CHECK(verdict != TORCHALLOC_OOM_NONE);
  CHECK(detail.pinning <= f.allocated);
  CHECK_EQ(f.allocated, (uint64_t)(30 + 40 + 2) * MiB);
  CHECK(detail.free_granules + detail.free_segments <= f.reserved);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}
