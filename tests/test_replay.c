/* torchalloc_replay on synthetic traces whose answers are worked out by hand
 * from the size rules in policies/parts/size_classes.h:
 *   1-10 MiB requests: large pool, 20 MiB segments, split when the rest > 1 MiB;
 *   >= 10 MiB: own segment rounded up to 2 MiB;
 *   exact: one device allocation per request, returned on free. */
#include "replay_traces.h"
#include "sim.h"
#include "torchalloc_replay.h"

#define A_(addr_, size_) {.addr = (addr_), .size = (size_), .kind = TORCHALLOC_REPLAY_ALLOC}
#define AP(addr_, size_, phase_) {.addr = (addr_), .size = (size_), .phase = (phase_), .kind = TORCHALLOC_REPLAY_ALLOC}
#define AS(addr_, size_, stream_) {.addr = (addr_), .size = (size_), .stream = (stream_), .kind = TORCHALLOC_REPLAY_ALLOC}
#define F_(addr_) {.addr = (addr_), .kind = TORCHALLOC_REPLAY_FREE}
#define BEGIN(phase_) {.phase = (phase_), .kind = TORCHALLOC_REPLAY_PHASE_BEGIN}
#define END(phase_) {.phase = (phase_), .kind = TORCHALLOC_REPLAY_PHASE_END}
#define N(a) (sizeof(a) / sizeof((a)[0]))

static torchalloc_replay_result run(const torchalloc_replay_event *ev, size_t n, const char *policy,
                                    uint64_t capacity) {
  torchalloc_replay_result r;
  memset(&r, 0xff, sizeof r);
  if (torchalloc_replay(ev, n, policy, capacity, &r, NULL, 0) != 0) {
    fprintf(stderr, "  torchalloc_replay(%s): %s\n", policy, torchalloc_last_error());
    g_failures++;
  }
  return r;
}

/* T1: A 8, B 8, C 2, free A, D 9, then free everything (MiB).
 * caching: A and B and C are carved from one 20 MiB segment (12 -> 4 -> 2 MiB
 *   left); freeing A leaves 8 + 2 MiB free, neither fits D, so D opens a
 *   second 20 MiB segment: reserved 40 at event 4, when B + C + D = 19 MiB
 *   are active, 21 MiB free, the largest free block D's 11 MiB remainder:
 *   fragmentation (21 - 11) / 21.
 * exact: reserved = allocated = 8, 16, 18, 10, 19, 11, 9, 0. */
static const torchalloc_replay_event T1[] = {
    A_(0x1000, 8 * MiB), A_(0x2000, 8 * MiB), A_(0x3000, 2 * MiB), F_(0x1000),
    A_(0x4000, 9 * MiB), F_(0x2000),          F_(0x3000),          F_(0x4000),
};

TEST(caching_peak_and_fragmentation_by_hand) {
  static const char *const arenas[] = {"caching", "phase_arena"}; /* one phase: phase_arena is one arena */
  for (int k = 0; k < 2; k++) {
    torchalloc_replay_result r = run(T1, N(T1), arenas[k], 0);
    CHECK_EQ(r.version, TORCHALLOC_REPLAY_VERSION);
    CHECK_EQ(r.events, 8);
    CHECK_EQ(r.peak_reserved, 40 * MiB);
    CHECK_EQ(r.peak_reserved_event, 4);
    CHECK_EQ(r.peak_allocated, 19 * MiB);
    CHECK_EQ(r.peak_requested, 19 * MiB);
    CHECK_EQ(r.free_at_peak, 21 * MiB);
    CHECK_EQ(r.largest_free_at_peak, 11 * MiB);
    CHECK(r.fragmentation_at_peak > 10.0 / 21 - 1e-12 && r.fragmentation_at_peak < 10.0 / 21 + 1e-12);
    CHECK_EQ(r.device_allocs, 2);
    CHECK_EQ(r.device_frees, 0); /* a cache keeps its segments */
    CHECK_EQ(r.oom, 0);
    CHECK_EQ(r.oom_event, -1);
    CHECK_EQ(r.unknown_frees, 0);
    CHECK_EQ(r.final_allocated, 0);
    CHECK_EQ(r.final_reserved, 40 * MiB);
  }
}

TEST(exact_peak_by_hand) {
  torchalloc_replay_result r = run(T1, N(T1), "exact", 0);
  CHECK_EQ(r.peak_reserved, 19 * MiB);
  CHECK_EQ(r.peak_reserved_event, 4);
  CHECK_EQ(r.peak_allocated, 19 * MiB);
  CHECK_EQ(r.free_at_peak, 0);
  CHECK(r.fragmentation_at_peak == 0.0);
  CHECK_EQ(r.device_allocs, 4);
  CHECK_EQ(r.device_frees, 4);
  CHECK_EQ(r.final_reserved, 0);
}

TEST(oom_event_at_small_capacity) {
  /* caching at 30 MiB: D needs a second 20 MiB segment; the first holds B and
   * C, so releasing cached segments frees nothing: OOM at event 4. */
  torchalloc_replay_result r = run(T1, N(T1), "caching", 30 * MiB);
  CHECK_EQ(r.oom, 1);
  CHECK_EQ(r.oom_event, 4);
  CHECK_EQ(r.oom_size, 9 * MiB);
  CHECK_EQ(r.events, 5);
  CHECK_EQ(r.alloc_retries, 1);
  CHECK_EQ(r.peak_reserved, 20 * MiB);
  r = run(T1, N(T1), "phase_arena", 30 * MiB);
  CHECK_EQ(r.oom_event, 4);
  /* exact at 18 MiB: 8 + 8 + 2 fits exactly; D would make 10 + 9 = 19. */
  r = run(T1, N(T1), "exact", 18 * MiB);
  CHECK_EQ(r.oom, 1);
  CHECK_EQ(r.oom_event, 4);
  CHECK_EQ(r.peak_reserved, 18 * MiB);
  /* exact at 17 MiB: C would make 18. */
  r = run(T1, N(T1), "exact", 17 * MiB);
  CHECK_EQ(r.oom_event, 2);
  CHECK_EQ(r.events, 3);
  /* exact at 19 MiB and caching at 40 MiB: the whole trace runs. */
  CHECK_EQ(run(T1, N(T1), "exact", 19 * MiB).oom, 0);
  CHECK_EQ(run(T1, N(T1), "caching", 40 * MiB).oom, 0);
  CHECK_EQ(run(T1, N(T1), "caching", 40 * MiB - 512).oom_event, 4);
}

/* T2: A 4 MiB in phase 1, B 4 MiB in phase 2, C 14 MiB in phase 1 again.
 * caching: A, B from one 20 MiB segment (12 MiB left); C does not fit, so it
 *   gets its own 14 MiB segment: reserved 34 at event 7, 12 MiB free in one
 *   block: fragmentation 0.
 * phase_arena: B opens phase 2's own 20 MiB segment: reserved 40 at event 4,
 *   with 16 + 16 MiB free in two blocks: fragmentation 0.5; C then fits the
 *   16 MiB left in phase 1's segment.
 * exact: 4 + 4 + 14 = 22 MiB. */
static const torchalloc_replay_event T2[] = {
    BEGIN(1), AP(0x10, 4 * MiB, 1), END(1), BEGIN(2), AP(0x20, 4 * MiB, 2), END(2),
    BEGIN(1), AP(0x30, 14 * MiB, 1), END(1),
};

TEST(phases_give_phase_arena_its_own_segments) {
  torchalloc_replay_result r = run(T2, N(T2), "caching", 0);
  CHECK_EQ(r.peak_reserved, 34 * MiB);
  CHECK_EQ(r.peak_reserved_event, 7);
  CHECK_EQ(r.free_at_peak, 12 * MiB);
  CHECK(r.fragmentation_at_peak == 0.0);
  CHECK_EQ(r.peak_allocated, 22 * MiB);
  CHECK_EQ(r.device_allocs, 2);

  r = run(T2, N(T2), "phase_arena", 0);
  CHECK_EQ(r.peak_reserved, 40 * MiB);
  CHECK_EQ(r.peak_reserved_event, 4);
  CHECK_EQ(r.free_at_peak, 32 * MiB);
  CHECK_EQ(r.largest_free_at_peak, 16 * MiB);
  CHECK(r.fragmentation_at_peak == 0.5);
  CHECK_EQ(r.peak_allocated, 22 * MiB);
  CHECK_EQ(r.device_allocs, 2);

  r = run(T2, N(T2), "exact", 0);
  CHECK_EQ(r.peak_reserved, 22 * MiB);
  CHECK_EQ(r.device_allocs, 3);
}

/* T3: A 12 MiB, free, B 14 MiB. caching keeps A's 12 MiB segment cached and
 * opens 14 MiB for B (peak 26); at capacity 14 MiB the device says no, the
 * cache is released and the retry succeeds. */
static const torchalloc_replay_event T3[] = {A_(1, 12 * MiB), F_(1), A_(2, 14 * MiB), F_(2)};

TEST(release_and_retry_runs_below_the_unconstrained_peak) {
  torchalloc_replay_result r = run(T3, N(T3), "caching", 0);
  CHECK_EQ(r.peak_reserved, 26 * MiB);
  CHECK_EQ(r.free_at_peak, 12 * MiB);
  CHECK_EQ(r.largest_free_at_peak, 12 * MiB);
  CHECK(r.fragmentation_at_peak == 0.0);
  r = run(T3, N(T3), "caching", 14 * MiB);
  CHECK_EQ(r.oom, 0);
  CHECK_EQ(r.alloc_retries, 1);
  CHECK_EQ(r.device_frees, 1);
  CHECK_EQ(r.peak_reserved, 14 * MiB);
  r = run(T3, N(T3), "caching", 14 * MiB - 512);
  CHECK_EQ(r.oom_event, 2);
}

TEST(streams_do_not_share_cached_blocks) {
  static const torchalloc_replay_event t[] = {AS(1, 8 * MiB, 0), F_(1), AS(2, 8 * MiB, 7)};
  CHECK_EQ(run(t, N(t), "caching", 0).peak_reserved, 40 * MiB);
  static const torchalloc_replay_event same[] = {AS(1, 8 * MiB, 7), F_(1), AS(2, 8 * MiB, 7)};
  CHECK_EQ(run(same, N(same), "caching", 0).peak_reserved, 20 * MiB);
}

TEST(unknown_frees_are_counted_and_reused_addresses_replace) {
  /* A ring buffer that starts mid-run frees what it never saw allocated; a
   * trace that lost a free allocates an address that is still live. */
  static const torchalloc_replay_event t[] = {F_(0xdead), A_(1, 4096), A_(1, 4096), F_(1), F_(1), F_(2)};
  torchalloc_replay_result r = run(t, N(t), "caching", 0);
  CHECK_EQ(r.unknown_frees, 3);
  CHECK_EQ(r.replaced_allocs, 1);
  CHECK_EQ(r.peak_allocated, 4096);
  CHECK_EQ(r.final_allocated, 0);
  CHECK_EQ(r.peak_reserved, 2 * MiB); /* small pool */
}

TEST(reserved_series_takes_the_highest_value_per_bucket) {
  int64_t s8[8], s4[4], s3[3], s16[16];
  torchalloc_replay_result r;
  REQUIRE(torchalloc_replay(T1, N(T1), "exact", 0, &r, s8, 8) == 0);
  static const int64_t exact8[8] = {8, 16, 18, 10, 19, 11, 9, 0};
  for (int i = 0; i < 8; i++) CHECK_EQ(s8[i], exact8[i] * (int64_t)MiB);
  REQUIRE(torchalloc_replay(T1, N(T1), "exact", 0, &r, s4, 4) == 0);
  static const int64_t exact4[4] = {16, 18, 19, 9};
  for (int i = 0; i < 4; i++) CHECK_EQ(s4[i], exact4[i] * (int64_t)MiB);
  REQUIRE(torchalloc_replay(T1, N(T1), "exact", 0, &r, s3, 3) == 0); /* events 0-2, 3-5, 6-7 */
  CHECK_EQ(s3[0], 18 * MiB);
  CHECK_EQ(s3[1], 19 * MiB);
  CHECK_EQ(s3[2], 9 * MiB);
  REQUIRE(torchalloc_replay(T1, N(T1), "caching", 0, &r, s16, 16) == 0); /* more buckets than events */
  for (int i = 0; i < 16; i++) CHECK_EQ(s16[i], (i < 8 ? 20 : 40) * (int64_t)MiB);
  /* After an OOM the replay stops: the rest stays -1. */
  REQUIRE(torchalloc_replay(T1, N(T1), "exact", 17 * MiB, &r, s8, 8) == 0);
  CHECK_EQ(s8[0], 8 * MiB);
  CHECK_EQ(s8[1], 16 * MiB);
  CHECK_EQ(s8[2], 16 * MiB); /* the failed request left reserved as it was */
  for (int i = 3; i < 8; i++) CHECK_EQ(s8[i], -1);
}

TEST(bad_input_is_an_error_not_a_crash) {
  torchalloc_replay_result r;
  CHECK_EQ(torchalloc_replay(T1, N(T1), "no_such_policy", 0, &r, NULL, 0), -1);
  CHECK(strstr(torchalloc_last_error(), "no_such_policy") != NULL);
  torchalloc_replay_event bad_kind[] = {{.addr = 1, .size = 512, .kind = 9}};
  CHECK_EQ(torchalloc_replay(bad_kind, 1, "caching", 0, &r, NULL, 0), -1);
  CHECK(strstr(torchalloc_last_error(), "kind") != NULL);
  torchalloc_replay_event bad_phase[] = {AP(1, 512, TORCHALLOC_MAX_PHASES)};
  CHECK_EQ(torchalloc_replay(bad_phase, 1, "caching", 0, &r, NULL, 0), -1);
  torchalloc_replay_event huge[] = {A_(1, UINT64_MAX)};
  CHECK_EQ(torchalloc_replay(huge, 1, "caching", 0, &r, NULL, 0), -1);
  CHECK_EQ(torchalloc_replay(NULL, 1, "caching", 0, &r, NULL, 0), -1);
  /* An empty trace is fine. */
  CHECK_EQ(torchalloc_replay(NULL, 0, "caching", 0, &r, NULL, 0), 0);
  CHECK_EQ(r.events, 0);
  CHECK_EQ(r.peak_reserved, 0);
  CHECK_EQ(r.peak_reserved_event, -1);
  /* A request above the capacity is an OOM, not an error. */
  torchalloc_replay_event big[] = {A_(1, 64 * GiB)};
  CHECK_EQ(torchalloc_replay(big, 1, "caching", 80 * GiB, &r, NULL, 0), 0);
  CHECK_EQ(r.oom, 0);
  CHECK_EQ(torchalloc_replay(big, 1, "exact", 32 * GiB, &r, NULL, 0), 0);
  CHECK_EQ(r.oom_event, 0);
}

TEST(replay_leaves_the_process_allocator_alone) {
  REQUIRE(sim_reset("") == 0);
  void *p = torchalloc_malloc(4096, 0, S0);
  REQUIRE(p);
  torchalloc_stats before = stats0();
  torchalloc_replay_result r = run(T1, N(T1), "caching", 0);
  CHECK_EQ(r.peak_reserved, 40 * MiB);
  torchalloc_stats after = stats0();
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  torchalloc_free(p, 4096, 0, S0);
  CHECK_INVARIANTS();
}

/* Many live addresses: the map grows and deletes shift entries back; every
 * free must still find its block (no unknown frees, everything returned). */
TEST(address_map_survives_growth_and_deletion) {
  enum { LIVE = 20000, ROUNDS = 3 };
  size_t n = (size_t)LIVE * 2 * ROUNDS, k = 0;
  torchalloc_replay_event *ev = calloc(n, sizeof *ev);
  REQUIRE(ev);
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < LIVE; i++) ev[k++] = (torchalloc_replay_event)A_((uint64_t)(round * LIVE + i) * 512, 512);
    for (int i = 0; i < LIVE; i++) /* in a scrambled order: 7919 is prime to LIVE */
      ev[k++] = (torchalloc_replay_event)F_((uint64_t)(round * LIVE + (int)((uint64_t)i * 7919 % LIVE)) * 512);
  }
  REQUIRE(k == n);
  torchalloc_replay_result r = run(ev, n, "caching", 0);
  CHECK_EQ(r.unknown_frees, 0);
  CHECK_EQ(r.peak_allocated, (int64_t)LIVE * 512);
  CHECK_EQ(r.final_allocated, 0);
  free(ev);
}


/* Random traces (lost and stray frees, phases, streams, tight capacities):
 * no crash or sanitizer report, and the figures stay consistent. The live
 * requested peak is recomputed here with a plain table. */
TEST(random_traces_are_replayed_consistently) {
  enum { N = 20000, ADDRS = 512 };
  torchalloc_replay_event *ev = calloc(N, sizeof *ev);
  REQUIRE(ev);
  uint64_t x = 0x9E3779B97F4A7C15ull;
#define NEXT() xorshift(&x)
  for (int i = 0; i < N; i++) {
    uint64_t r = NEXT();
    int kind = r % 100 < 52 ? TORCHALLOC_REPLAY_ALLOC : r % 100 < 97 ? TORCHALLOC_REPLAY_FREE
               : r % 2 ? TORCHALLOC_REPLAY_PHASE_BEGIN : TORCHALLOC_REPLAY_PHASE_END;
    uint64_t size = (NEXT() % 2) ? NEXT() % (64 * KiB) : NEXT() % (48 * MiB); /* size 0 too */
    ev[i] = (torchalloc_replay_event){.addr = NEXT() % ADDRS, .size = kind == TORCHALLOC_REPLAY_ALLOC ? size : 0,
                                      .stream = NEXT() % 3, .phase = (uint16_t)(NEXT() % 4), .kind = (uint8_t)kind};
  }
#undef NEXT
  /* Reference: live requested bytes, as replay.c treats lost and stray frees. */
  uint64_t live[ADDRS] = {0};
  int64_t cur = 0, peak = 0;
  for (int i = 0; i < N; i++) {
    uint64_t a = ev[i].addr;
    if (ev[i].kind == TORCHALLOC_REPLAY_ALLOC && ev[i].size) {
      cur += (int64_t)ev[i].size - (int64_t)live[a];
      live[a] = ev[i].size;
    } else if (ev[i].kind == TORCHALLOC_REPLAY_FREE) {
      cur -= (int64_t)live[a];
      live[a] = 0;
    }
    if (cur > peak) peak = cur;
  }
  static const char *const policies[] = {"caching", "exact", "phase_arena"};
  static const uint64_t capacities[] = {0, 256 * MiB, 1 * GiB};
  for (int p = 0; p < 3; p++) {
    for (int c = 0; c < 3; c++) {
      torchalloc_replay_result r = run(ev, N, policies[p], capacities[c]);
      CHECK(r.peak_allocated <= r.peak_reserved);
      CHECK(r.peak_requested <= r.peak_allocated);
      CHECK(r.fragmentation_at_peak >= 0.0 && r.fragmentation_at_peak < 1.0);
      CHECK(r.free_at_peak >= r.largest_free_at_peak);
      CHECK(r.device_frees <= r.device_allocs);
      if (r.oom) {
        CHECK(capacities[c] != 0);
        CHECK_EQ(r.events, r.oom_event + 1);
        CHECK((uint64_t)r.peak_reserved <= capacities[c]);
      } else {
        CHECK_EQ(r.events, N);
        CHECK_EQ(r.peak_requested, peak);
        if (capacities[c]) CHECK((uint64_t)r.peak_reserved <= capacities[c]);
      }
      if (p == 1 && !r.oom) CHECK_EQ(r.final_reserved, r.final_allocated); /* exact caches nothing */
    }
  }
  free(ev);
}

/* Replay frees a trace's address on whatever stream the trace names (a
 * replaced allocation frees the old block on the new one's stream): the
 * stream check is the caller's, not replay's. */
TEST(replay_frees_whatever_stream_the_trace_names) {
  torchalloc_replay_event ev[3];
  memset(ev, 0, sizeof ev);
  ev[0] = (torchalloc_replay_event){.addr = 0x1000, .size = 4096, .stream = 1, .kind = TORCHALLOC_REPLAY_ALLOC};
  ev[1] = (torchalloc_replay_event){.addr = 0x1000, .size = 4096, .stream = 2, .kind = TORCHALLOC_REPLAY_FREE};
  ev[2] = (torchalloc_replay_event){.addr = 0x1000, .size = 4096, .stream = 3, .kind = TORCHALLOC_REPLAY_ALLOC};
  torchalloc_replay_result r;
  REQUIRE(torchalloc_replay(ev, 3, "caching", 0, &r, NULL, 0) == 0);
  CHECK_EQ(r.final_allocated, 4096);
  CHECK_EQ(r.unknown_frees, 0);
}

/* The same trace replayed whole and fed in pieces of every size: the same
 * result and series, with an OOM in the middle and without. */
TEST(feeding_pieces_gives_what_one_call_gives) {
  enum { N = 5000, SERIES = 37 };
  torchalloc_replay_event *ev = calloc(N, sizeof *ev);
  REQUIRE(ev);
  random_trace(ev, N, 12345, 3);
  static const char *const policies[] = {"caching", "phase_arena+expandable", "exact"};
  static const uint64_t capacities[] = {0, 600 * MiB};
  static const size_t pieces[] = {1, 3, 64, 1000, N};
  for (int p = 0; p < 3; p++) {
    for (int c = 0; c < 2; c++) {
      torchalloc_replay_result whole, fed;
      int64_t whole_series[SERIES], fed_series[SERIES];
      memset(&whole, 0, sizeof whole);
      REQUIRE(torchalloc_replay(ev, N, policies[p], capacities[c], &whole, whole_series, SERIES) == 0);
      for (size_t k = 0; k < sizeof pieces / sizeof *pieces; k++) {
        torchalloc_replay_run *run_ = torchalloc_replay_begin(policies[p], capacities[c], N, fed_series, SERIES);
        REQUIRE(run_);
        int status = 0;
        for (size_t i = 0; i < N && status == 0; i += pieces[k]) {
          size_t len = N - i < pieces[k] ? N - i : pieces[k];
          status = torchalloc_replay_feed(run_, ev + i, len);
        }
        CHECK_EQ(status, whole.oom ? 1 : 0);
        if (whole.oom) CHECK_EQ(torchalloc_replay_feed(run_, ev, 1), 1); /* past an OOM: ignored */
        memset(&fed, 0, sizeof fed);
        REQUIRE(torchalloc_replay_end(run_, &fed) == 0);
        CHECK(memcmp(&whole, &fed, sizeof whole) == 0);
        CHECK(memcmp(whole_series, fed_series, sizeof whole_series) == 0);
      }
    }
  }
  free(ev);
}

TEST(a_run_refuses_bad_input_and_more_events_than_announced) {
  torchalloc_replay_result r;
  CHECK(torchalloc_replay_begin("no_such_policy", 0, 0, NULL, 0) == NULL);
  CHECK(strstr(torchalloc_last_error(), "no_such_policy") != NULL);
  torchalloc_replay_run *run_ = torchalloc_replay_begin("caching", 0, 0, NULL, 0);
  REQUIRE(run_);
  torchalloc_replay_event bad[] = {A_(1, 512), {.addr = 1, .kind = 9}};
  CHECK_EQ(torchalloc_replay_feed(run_, bad, 2), -1);
  CHECK(strstr(torchalloc_last_error(), "replay event 1") != NULL);
  CHECK_EQ(torchalloc_replay_feed(run_, T1, 1), -1); /* over: the reason stays */
  CHECK_EQ(torchalloc_replay_end(run_, &r), -1);
  CHECK(strstr(torchalloc_last_error(), "replay event 1") != NULL);
  int64_t series[4];
  run_ = torchalloc_replay_begin("caching", 0, 3, series, 4);
  REQUIRE(run_);
  CHECK_EQ(torchalloc_replay_feed(run_, T1, 4), -1);
  CHECK(strstr(torchalloc_last_error(), "more events") != NULL);
  CHECK_EQ(torchalloc_replay_end(run_, &r), -1);
  CHECK_EQ(torchalloc_replay_end(NULL, &r), -1);
  CHECK_EQ(torchalloc_replay_feed(NULL, T1, 1), -1);
}

/* Every (stream, pool) pair gets its own expandable segment, reserving up to
 * 1 TiB of addresses: more pairs than 4 PiB holds (4096) still replay, live
 * all at once, and again after their segments were given back. */
TEST(any_number_of_stream_pool_pairs) {
  enum { PAIRS = 5000 };
  size_t n = 4 * PAIRS;
  torchalloc_replay_event *ev = calloc(n, sizeof *ev);
  REQUIRE(ev);
  for (size_t s = 0; s < PAIRS; s++) {
    uint64_t size = s % 2 ? 512 : 4 * MiB; /* small and large pools */
    ev[s] = (torchalloc_replay_event)AS(s + 1, size, s / 2);
    ev[PAIRS + s] = (torchalloc_replay_event)F_(s + 1);
    ev[2 * PAIRS + s] = (torchalloc_replay_event)AS(PAIRS + s + 1, size, s / 2);
    ev[3 * PAIRS + s] = (torchalloc_replay_event)F_(PAIRS + s + 1);
  }
  static const char *const policies[] = {"caching+expandable", "phase_arena+compact", "caching"};
  for (int p = 0; p < 3; p++) {
    torchalloc_replay_result r = run(ev, n, policies[p], 0);
    CHECK_EQ(r.events, (int64_t)n);
    CHECK_EQ(r.oom, 0);
    CHECK_EQ(r.unknown_frees, 0);
    CHECK_EQ(r.peak_requested, (int64_t)(PAIRS / 2) * (4 * MiB + 512));
    CHECK_EQ(r.final_allocated, 0);
  }
  free(ev);
}

/* "POLICY@DIVISIONS": the program's roundup_power2_divisions. Two requests of
 * 84 MiB (+ 1 B) and one of 9000 B: PyTorch's allocator makes blocks of
 * 96 MiB and 10 KiB of them under roundup_power2_divisions:4, 84 MiB + 512 B
 * and 9 KiB without; under a list whose divisions above 1 start at 1 GiB
 * nothing changes. The requests stay what the trace asked for. */
static const torchalloc_replay_event T_ROUNDUP[] = {
    A_(0x1000, 84 * MiB), A_(0x2000, 84 * MiB + 1), A_(0x3000, 9000), F_(0x1000), F_(0x2000), F_(0x3000),
};

TEST(a_policy_with_divisions_rounds_as_pytorch_does) {
  static const struct {
    const char *policy;
    int64_t allocated;
  } cases[] = {
      {"exact", 84 * MiB + 84 * MiB + 512 + 9216},
      {"exact@4", 96 * MiB + 96 * MiB + 10240},
      {"caching@4", 96 * MiB + 96 * MiB + 10240},
      {"caching+reclaim@4", 96 * MiB + 96 * MiB + 10240},
      {"phase_arena+expandable@[2:4,>:16]", 84 * MiB + 88 * MiB + 10240},
      {"caching@[1:1,1024:8]", 84 * MiB + 84 * MiB + 512 + 9216},
      {"caching@[1024:8]", 88 * MiB + 88 * MiB + 9216}, /* the first entry covers the sizes below it too */
  };
  for (size_t i = 0; i < N(cases); i++) {
    torchalloc_replay_result r = run(T_ROUNDUP, N(T_ROUNDUP), cases[i].policy, 0);
    if (r.peak_allocated != cases[i].allocated || r.peak_requested != (int64_t)(168 * MiB + 1 + 9000)) {
      fprintf(stderr, "  %s: peak allocated %lld, requested %lld (expected %lld, %lld)\n", cases[i].policy,
              (long long)r.peak_allocated, (long long)r.peak_requested, (long long)cases[i].allocated,
              (long long)(168 * MiB + 1 + 9000));
      g_failures++;
    }
  }
  torchalloc_replay_result r;
  CHECK(torchalloc_replay(T_ROUNDUP, N(T_ROUNDUP), "caching@3", 0, &r, NULL, 0) == -1);
  CHECK(strstr(torchalloc_last_error(), "'caching@3': roundup_power2_divisions: '3' is not a power of 2") != NULL);
}
