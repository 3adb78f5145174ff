/* What a replay, and the arenas under it, cost as a trace grows (issue 36,
 * item 5), in counts and bytes, never seconds:
 *   - the figures at a new peak of reserved memory (free bytes, largest free
 *     block) come from the arenas' census of free blocks: no block is walked,
 *     however many peaks (a trace whose reserve keeps growing used to walk
 *     every block at each: quadratic), and the census is exactly what a walk
 *     finds, after every event of random traces in every segment mode;
 *   - a stream costs host memory only while it has segments: its bins go
 *     with its last segment, and bins hold list heads only for sizes used
 *     (43 KiB each before), so tens of thousands of streams stay cheap. */
#include <malloc.h>

#include "runtime/replay.h"
#include "replay_traces.h"
#include "sim.h"
#include "torchalloc_replay.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))


/* Refusing the 64-head groups of the bins (calloc(64, sizeof(void *))) on
 * demand: this program's calloc comes before the C library's. Not under a
 * sanitizer, whose own calloc this one would displace. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CAN_REFUSE_GROUPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CAN_REFUSE_GROUPS 0
#endif
#endif
#ifndef CAN_REFUSE_GROUPS
#define CAN_REFUSE_GROUPS 1
extern void *__libc_calloc(size_t n, size_t size);
static int refuse_groups, refused;
void *calloc(size_t n, size_t size) {
  if (refuse_groups && n == 64 && size == sizeof(void *) && ++refused) return NULL;
  return __libc_calloc(n, size);
}
#endif

/* Bytes the C heap hands out now (small chunks and mmapped ones); 0 under
 * the sanitizers, whose allocators mallinfo2 does not see. */
static int64_t host_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return (int64_t)(m.uordblks + m.hblkhd);
}

/* 200,000 long-lived 512 B blocks: a 2 MiB segment per 4096, so a new peak
 * every 4096 events (49 of them); walking every block at each walked about
 * 4.9 million. */
TEST(a_growing_reserve_walks_no_block_at_its_new_peaks) {
  enum { ALLOCS = 200000, PER_SEGMENT = 4096 };
  static const char *const policies[] = {"caching", "phase_arena", "caching+expandable"};
  torchalloc_replay_event *ev = calloc(ALLOCS, sizeof *ev);
  REQUIRE(ev);
  for (int i = 0; i < ALLOCS; i++)
    ev[i] = (torchalloc_replay_event){.addr = (uint64_t)(i + 1) * 512, .size = 512, .kind = TORCHALLOC_REPLAY_ALLOC};
  for (size_t p = 0; p < N(policies); p++) {
    torchalloc_replay_run *run = torchalloc_replay_begin(policies[p], 0, 0, NULL, 0);
    REQUIRE(run);
    CHECK_EQ(torchalloc_replay_feed(run, ev, ALLOCS), 0);
    CHECK_EQ(ta_replay_blocks_walked(run), 0);
    CHECK(ta_replay_census_agrees(run));
    torchalloc_replay_result r;
    REQUIRE(torchalloc_replay_end(run, &r) == 0);
    int64_t segments = (ALLOCS + PER_SEGMENT - 1) / PER_SEGMENT;
    CHECK_EQ(r.peak_reserved, segments * 2 * (int64_t)MiB);
    CHECK_EQ(r.peak_reserved_event, (segments - 1) * PER_SEGMENT); /* the first block of the last segment */
    CHECK_EQ(r.free_at_peak, 2 * (int64_t)MiB - 512);              /* the rest of that segment */
    CHECK_EQ(r.largest_free_at_peak, 2 * (int64_t)MiB - 512);
  }
  free(ev);
}

/* Event by event, so at every new peak too: with room to spare and at a
 * capacity where cached segments are released and requests retried (the
 * streams left with none lose their bins), in every segment mode. */
TEST(the_census_is_what_a_walk_finds_after_every_event) {
  enum { EVENTS = 3000 };
  static const char *const policies[] = {"caching",          "phase_arena",         "caching+expandable",
                                         "phase_arena+compact", "caching+reclaim",  "phase_arena+reclaim", "exact"};
  static const uint64_t capacities[] = {0, 160 * MiB};
  torchalloc_replay_event *ev = calloc(EVENTS, sizeof *ev);
  REQUIRE(ev);
  for (uint64_t seed = 1; seed <= 2; seed++) {
    random_trace(ev, EVENTS, seed * 0x9E3779B97F4A7C15ull, 6);
    for (size_t p = 0; p < N(policies); p++) {
      for (size_t c = 0; c < N(capacities); c++) {
        torchalloc_replay_run *run = torchalloc_replay_begin(policies[p], capacities[c], 0, NULL, 0);
        REQUIRE(run);
        int disagreed = 0, status = 0;
        for (size_t i = 0; i < EVENTS && status == 0; i++) {
          status = torchalloc_replay_feed(run, &ev[i], 1);
          if (!ta_replay_census_agrees(run) && !disagreed++)
            fprintf(stderr, "  %s at %" PRIu64 " bytes, seed %" PRIu64 ": census and walk differ after event %zu\n",
                    policies[p], capacities[c], seed, i);
        }
        CHECK_EQ(disagreed, 0);
        CHECK(status == 0 || status == 1);
        CHECK_EQ(ta_replay_blocks_walked(run), 0);
        torchalloc_replay_result r;
        CHECK_EQ(torchalloc_replay_end(run, &r), 0);
      }
    }
  }
  free(ev);
}

/* 20,000 streams used once each (a small and a large block, freed, the
 * cache emptied), in every segment mode: their entries, bins and
 * expandable segments go with their last segment. Each used to keep two
 * 43 KiB bins: 1.7 GB. What may stay is the segment layer's progress
 * markers of each stream under reclaim (about 140 bytes a stream, found
 * by a linear search: 4,000 streams there, or TSan takes a minute). */
TEST(a_stream_with_no_segment_left_costs_no_host_memory) {
  static const struct {
    const char *conf;
    uintptr_t streams;
  } runs[] = {{"", 20000}, {"expandable:on", 20000}, {"expandable:compact", 20000}, {"expandable:reclaim", 4000},
              {"policy:phase_arena,expandable:reclaim", 4000}};
  for (size_t c = 0; c < N(runs); c++) {
    const char *conf = runs[c].conf;
    uintptr_t streams = runs[c].streams;
    REQUIRE(sim_reset(conf) == 0);
    int64_t before = 0;
    for (uintptr_t k = 1; k <= streams; k++) {
      cudaStream_t s = (cudaStream_t)(k * 0x100);
      void *small = torchalloc_malloc(4 * KiB, 0, s), *large = torchalloc_malloc(3 * MiB, 0, s);
      REQUIRE(small && large);
      torchalloc_free(small, 4 * KiB, 0, s);
      torchalloc_free(large, 3 * MiB, 0, s);
      torchalloc_empty_cache(0);
      if (k == 100) before = host_bytes(); /* after the first streams: the slabs and tables have their size */
    }
    int64_t grew = host_bytes() - before, bound = 256 * (int64_t)streams;
    if (grew > bound) fprintf(stderr, "  %s: host memory grew by %" PRId64 " bytes\n", conf, grew);
    CHECK(grew <= bound);
    CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
    CHECK_INVARIANTS();
  }
}

/* A stream keeps its part while any of its blocks lives (an emptied cache
 * releases nothing of it), gets a new one when it comes back after losing
 * it, and other streams' entries moving around it change nothing. */
TEST(a_stream_keeps_its_bins_while_a_block_lives) {
  static const char *const confs[] = {"", "expandable:reclaim"};
  for (size_t c = 0; c < N(confs); c++) {
    REQUIRE(sim_reset(confs[c]) == 0);
    enum { STREAMS = 64 };
    void *kept[STREAMS];
    for (uintptr_t k = 0; k < STREAMS; k++) { /* every other stream keeps a block */
      cudaStream_t s = (cudaStream_t)((k + 1) * 0x100);
      kept[k] = torchalloc_malloc(k % 4 ? 4 * KiB : 5 * MiB, 0, s);
      void *gone = torchalloc_malloc(8 * KiB, 0, s);
      REQUIRE(kept[k] && gone);
      torchalloc_free(gone, 8 * KiB, 0, s);
      if (k % 2) {
        torchalloc_free(kept[k], k % 4 ? 4 * KiB : 5 * MiB, 0, s);
        kept[k] = NULL;
      }
    }
    torchalloc_empty_cache(0);
    CHECK_INVARIANTS();
    for (uintptr_t k = 0; k < STREAMS; k++) { /* the same streams again: cached blocks of their own come back */
      cudaStream_t s = (cudaStream_t)((k + 1) * 0x100);
      void *again = torchalloc_malloc(2 * KiB, 0, s);
      REQUIRE(again);
      torchalloc_free(again, 2 * KiB, 0, s);
      if (kept[k]) torchalloc_free(kept[k], k % 4 ? 4 * KiB : 5 * MiB, 0, s);
    }
    CHECK_INVARIANTS();
    torchalloc_empty_cache(0);
    CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
    CHECK_EQ(stats0().allocated_bytes[ALL].current, 0);
    CHECK_INVARIANTS();
  }
}

/* A replay of 20,000 streams each used once keeps their (cached) segments
 * and so their bins: the bins hold heads only for sizes used. */
TEST(a_replay_of_many_streams_holds_little_host_memory) {
  enum { STREAMS = 20000 };
  torchalloc_replay_event *ev = calloc(4 * STREAMS, sizeof *ev);
  REQUIRE(ev);
  for (uint64_t k = 0; k < STREAMS; k++) {
    uint64_t s = k + 1;
    ev[4 * k] = (torchalloc_replay_event){.addr = 1, .size = 4 * KiB, .stream = s, .kind = TORCHALLOC_REPLAY_ALLOC};
    ev[4 * k + 1] = (torchalloc_replay_event){.addr = 2, .size = MiB, .stream = s, .kind = TORCHALLOC_REPLAY_ALLOC};
    ev[4 * k + 2] = (torchalloc_replay_event){.addr = 1, .stream = s, .kind = TORCHALLOC_REPLAY_FREE};
    ev[4 * k + 3] = (torchalloc_replay_event){.addr = 2, .stream = s, .kind = TORCHALLOC_REPLAY_FREE};
  }
  int64_t before = host_bytes();
  torchalloc_replay_run *run = torchalloc_replay_begin("caching", 0, 0, NULL, 0);
  REQUIRE(run);
  CHECK_EQ(torchalloc_replay_feed(run, ev, 4 * STREAMS), 0);
  int64_t per_stream = (host_bytes() - before) / STREAMS;
  if (per_stream > 4096) fprintf(stderr, "  %" PRId64 " bytes per stream\n", per_stream);
  CHECK(per_stream <= 4096); /* 43 KiB of bins alone before */
  CHECK_EQ(ta_replay_blocks_walked(run), 0);
  torchalloc_replay_result r;
  REQUIRE(torchalloc_replay_end(run, &r) == 0);
  CHECK_EQ(r.device_allocs, STREAMS); /* a 2 MiB segment each: streams share no cached block */
  CHECK_EQ(r.peak_reserved, (int64_t)STREAMS * 2 * (int64_t)MiB);
  free(ev);
}

/* Without host memory for a bin's group of heads, a free block waits in
 * the overflow bin: found when no indexed block fits (best fit among
 * them), taken out and merged like any other. */
TEST(free_blocks_without_a_group_of_heads_are_still_reused) {
  if (!CAN_REFUSE_GROUPS) return;
#if CAN_REFUSE_GROUPS
  REQUIRE(sim_reset("") == 0);
  cudaStream_t s = (cudaStream_t)0x777;
  refuse_groups = 1;
  void *a = torchalloc_malloc(4 * KiB, 0, s); /* the segment's rest: into the overflow bin */
  void *b = torchalloc_malloc(8 * KiB, 0, s); /* carved from it */
  REQUIRE(a && b);
  CHECK_EQ(stats0().num_device_alloc, 1);
  torchalloc_free(a, 4 * KiB, 0, s);
  void *c = torchalloc_malloc(2 * KiB, 0, s); /* best fit: a's 4 KiB, not the segment's rest */
  CHECK(c == a);
  CHECK(refused >= 2); /* the segment's rest and a: two groups refused */
  CHECK_INVARIANTS();
  refuse_groups = 0;
  void *d = torchalloc_malloc(16 * KiB, 0, s); /* the rest leaves the overflow bin, its rest gets a group */
  REQUIRE(d);
  CHECK_EQ(stats0().num_device_alloc, 1);
  torchalloc_free(c, 2 * KiB, 0, s);
  torchalloc_free(b, 8 * KiB, 0, s);
  torchalloc_free(d, 16 * KiB, 0, s);
  CHECK_INVARIANTS();
  torchalloc_empty_cache(0); /* merged back whole: the segment goes */
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  CHECK_INVARIANTS();
#endif
}
