/* Private pools (CUDA graphs, MemPool), routing during stream capture, and
 * the functions the C++ bridge answers PyTorch with, on the simulated
 * device and its model of capture. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "sim.h"
#include "torchalloc_sim.h"

#define POOL 7, 0 /* a graph pool id: (capture id, 0) */
#define OTHER_POOL 0, 3

static int64_t violations(void) { return torchalloc_sim_capture_violations(0, NULL, 0); }

TEST(a_pool_hands_its_blocks_only_to_its_own_requests) {
  REQUIRE(sim_reset("") == 0);
  CHECK_EQ(torchalloc_pool_retain(0, POOL), 1);
  void *p = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  REQUIRE(p);
  torchalloc_free(p, 1 * MiB, 0, S0); /* back to the pool, not to the default caching policy */
  void *d = torchalloc_malloc(1 * MiB, 0, S0);
  REQUIRE(d);
  CHECK(d != p);
  void *q = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  CHECK(q == p); /* the pool reuses its own cached block */
  void *other = torchalloc_pool_malloc(1 * MiB, 0, S0, OTHER_POOL); /* made on first use */
  CHECK(other != p && other != d);
  CHECK_EQ(torchalloc_pool_use_count(0, OTHER_POOL), 1);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocation[ALL].current, 3); /* pool blocks count in the device stats, as in PyTorch */
  CHECK_EQ(s.segment[ALL].current, 3);
  CHECK_INVARIANTS();
  torchalloc_free(q, 1 * MiB, 0, S0);
  torchalloc_free(d, 1 * MiB, 0, S0);
  torchalloc_free(other, 1 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(a_pool_keeps_its_segments_until_its_last_user_releases_it) {
  REQUIRE(sim_reset("") == 0);
  CHECK_EQ(torchalloc_pool_retain(0, POOL), 1);
  CHECK_EQ(torchalloc_pool_retain(0, POOL), 2);
  void *p = torchalloc_pool_malloc(3 * MiB, 0, S0, POOL);
  REQUIRE(p);
  torchalloc_free(p, 3 * MiB, 0, S0);
  /* A captured graph replays into these addresses: empty_cache keeps them. */
  CHECK_EQ(torchalloc_empty_cache(0), 0);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 20 * MiB);
  CHECK_EQ(torchalloc_pool_empty(0, POOL), 0); /* still in use: nothing */
  CHECK_EQ(torchalloc_pool_release(0, POOL), 1);
  CHECK_EQ(torchalloc_empty_cache(0), 0);
  CHECK_EQ(torchalloc_pool_release(0, POOL), 0);
  CHECK_EQ(torchalloc_pool_use_count(0, POOL), 0); /* freeable, not yet drained */
  CHECK_EQ(torchalloc_empty_cache(0), 20 * MiB);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  CHECK_EQ(torchalloc_pool_use_count(0, POOL), -1); /* gone with its last segment */
  CHECK_EQ(torchalloc_pool_release(0, POOL), -1);
  CHECK(strstr(torchalloc_last_error(), "no pool") != NULL);
  CHECK_INVARIANTS();
}

TEST(a_released_pool_with_a_live_block_waits_for_it) {
  REQUIRE(sim_reset("") == 0);
  CHECK_EQ(torchalloc_pool_retain(0, POOL), 1);
  void *a = torchalloc_pool_malloc(2 * MiB, 0, S0, POOL);
  void *b = torchalloc_pool_malloc(30 * MiB, 0, S0, POOL);
  REQUIRE(a && b);
  CHECK_EQ(torchalloc_pool_release(0, POOL), 0);
  torchalloc_free(b, 30 * MiB, 0, S0);
  CHECK_EQ(torchalloc_pool_empty(0, POOL), 30 * MiB); /* b's segment; a's stays while a lives */
  CHECK_EQ(torchalloc_pool_use_count(0, POOL), 0);
  uint64_t live[4];
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, live, 4), 1);
  CHECK(live[0] == (uint64_t)(uintptr_t)a);
  torchalloc_free(a, 2 * MiB, 0, S0); /* freed to the pool it came from, though the pool was released */
  CHECK_EQ(torchalloc_pool_empty(0, POOL), 20 * MiB);
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, live, 4), -1);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  CHECK_INVARIANTS();
}

/* An allocation into a released pool that fails: the OOM retry releases
 * freeable pools, and it destroyed the very pool allocating (a use after
 * free; found by fuzz_api). The request holds its pool meanwhile. */
TEST(a_failing_request_to_a_released_pool_keeps_the_pool_until_it_returns) {
  REQUIRE(sim_reset("sim_capacity:64MiB") == 0);
  CHECK_EQ(torchalloc_pool_retain(0, POOL), 1);
  void *a = torchalloc_pool_malloc(2 * MiB, 0, S0, POOL);
  REQUIRE(a);
  torchalloc_free(a, 2 * MiB, 0, S0);
  CHECK_EQ(torchalloc_pool_release(0, POOL), 0); /* freeable, its 20 MiB segment still cached */
  CHECK(torchalloc_pool_malloc(100 * MiB, 0, S0, POOL) == NULL);
  CHECK_EQ(stats0().num_ooms, 1);
  CHECK_EQ(torchalloc_pool_use_count(0, POOL), 0); /* still there, still freeable */
  void *b = torchalloc_pool_malloc(2 * MiB, 0, S0, POOL);
  CHECK(b == a); /* from its cached segment */
  torchalloc_free(b, 2 * MiB, 0, S0);
  CHECK_EQ(torchalloc_empty_cache(0), 20 * MiB);
  CHECK_EQ(torchalloc_pool_use_count(0, POOL), -1);
  CHECK_INVARIANTS();
}

TEST(pool_live_blocks_lists_exactly_the_live_ones) {
  REQUIRE(sim_reset("") == 0);
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, NULL, 0), -1);
  torchalloc_pool_retain(0, POOL);
  void *a = torchalloc_pool_malloc(4096, 0, S0, POOL);
  void *b = torchalloc_pool_malloc(8192, 0, S0, POOL);
  void *c = torchalloc_pool_malloc(4096, 0, S0, POOL);
  void *outside = torchalloc_malloc(4096, 0, S0);
  torchalloc_free(b, 8192, 0, S0);
  uint64_t live[2] = {0, 0};
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, live, 1), 2); /* counts all, fills what fits */
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, live, 2), 2);
  CHECK((live[0] == (uintptr_t)a && live[1] == (uintptr_t)c) || (live[0] == (uintptr_t)c && live[1] == (uintptr_t)a));
  torchalloc_free(a, 4096, 0, S0);
  torchalloc_free(c, 4096, 0, S0);
  torchalloc_free(outside, 4096, 0, S0);
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, live, 2), 0);
}

/* A training step captured into a graph, as torch.cuda.graph() drives the
 * allocator: begin routing, the stream captures, the step allocates and
 * frees (some blocks used on a side stream), capture ends, routing ends. */
TEST(capture_is_never_invalidated_and_deferred_frees_wait_for_it) {
  REQUIRE(sim_reset("sim_event_polls:2") == 0);
  void *before = torchalloc_malloc(1 * MiB, 0, S0); /* made before the capture, used on S1 too */
  void *keep = torchalloc_malloc(512, 0, S0);
  REQUIRE(before && keep);
  torchalloc_record_stream(before, S1);
  REQUIRE(torchalloc_pool_retain(0, POOL) == 1);
  REQUIRE(torchalloc_routing_begin(0) == 0);
  REQUIRE(torchalloc_sim_capture(0, S0, 1) == 0);

  void *act = torchalloc_pool_malloc(6 * MiB, 0, S0, POOL); /* a device allocation during capture: allowed */
  void *tmp = torchalloc_pool_malloc(256 * KiB, 0, S0, POOL);
  REQUIRE(act && tmp);
  torchalloc_free(tmp, 256 * KiB, 0, S0);
  CHECK(torchalloc_pool_malloc(256 * KiB, 0, S0, POOL) == tmp); /* reused within the capture, stream order holds */
  torchalloc_free(before, 1 * MiB, 0, S0); /* used on S1: no event may be recorded now */
  torchalloc_stats s = stats0();
  CHECK_EQ(s.active_bytes[ALL].current - s.allocated_bytes[ALL].current, 1 * MiB);
  /* Neither empty_cache nor an OOM may synchronize during capture. */
  CHECK_EQ(torchalloc_empty_cache(0), 0);
  int64_t retries = stats0().num_alloc_retries;
  CHECK(torchalloc_pool_malloc(100 * GiB, 0, S0, POOL) == NULL);
  CHECK_EQ(stats0().num_alloc_retries, retries);
  CHECK_EQ(stats0().num_ooms, 1);
  char why[128];
  CHECK_EQ(torchalloc_sim_capture_violations(0, why, sizeof why), 0);

  REQUIRE(torchalloc_sim_capture(0, S0, 0) == 0);
  REQUIRE(torchalloc_routing_end(0) == 0); /* now the deferred free records its event */
  CHECK_EQ(violations(), 0);
  CHECK_EQ(torchalloc_routing_end(0), -1); /* unbalanced */
  s = stats0(); /* routing_end polled the event once: not done, still waiting */
  CHECK_EQ(s.active_bytes[ALL].current - s.allocated_bytes[ALL].current, 1 * MiB);
  void *y = torchalloc_malloc(1 * MiB, 0, S0); /* poll 2: done, reused */
  CHECK(y == before);
  CHECK_INVARIANTS();
  torchalloc_free(y, 1 * MiB, 0, S0);
  torchalloc_free(keep, 512, 0, S0);
  torchalloc_free(act, 6 * MiB, 0, S0);
  torchalloc_free(tmp, 256 * KiB, 0, S0);
  CHECK_EQ(torchalloc_pool_release(0, POOL), 0);
  torchalloc_empty_cache(0);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0); /* the pool's segments too, now that it is released */
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

TEST(exact_frees_during_a_capture_wait_for_it_to_end) {
  /* exact hands memory back to the device on free: during a capture that
   * cudaFree would invalidate the graph, so the free waits for routing. */
  REQUIRE(sim_reset("policy:exact") == 0);
  void *a = torchalloc_malloc(4 * MiB, 0, S0);
  REQUIRE(a);
  REQUIRE(torchalloc_routing_begin(0) == 0);
  REQUIRE(torchalloc_sim_capture(0, S0, 1) == 0);
  torchalloc_free(a, 4 * MiB, 0, S0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 0);
  CHECK_EQ(s.reserved_bytes[ALL].current, 4 * MiB); /* not yet back to the device */
  CHECK_EQ(torchalloc_arena_trim(0, -1), 0);
  CHECK_EQ(violations(), 0);
  REQUIRE(torchalloc_sim_capture(0, S0, 0) == 0);
  REQUIRE(torchalloc_routing_end(0) == 0);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  CHECK_EQ(violations(), 0);
  CHECK_INVARIANTS();
}

TEST(the_capture_model_catches_a_core_that_is_not_told) {
  /* Without routing_begin the core believes no capture is underway: a
   * record_stream free records an event and empty_cache synchronizes, and
   * the simulated device counts both as fatal to a real capture. */
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(1 * MiB, 0, S0);
  REQUIRE(a);
  torchalloc_record_stream(a, S1);
  REQUIRE(torchalloc_sim_capture(0, S0, 1) == 0);
  torchalloc_free(a, 1 * MiB, 0, S0);
  CHECK_EQ(violations(), 1);
  torchalloc_empty_cache(0);
  char why[128];
  CHECK(torchalloc_sim_capture_violations(0, why, sizeof why) >= 2);
  CHECK(strstr(why, "capturing") != NULL);
  torchalloc_sim_capture(0, S0, 0);
  CHECK_EQ(torchalloc_sim_capture(0, S0, 0), -1); /* no capture to end */
}

TEST(snapshot_lists_segments_and_blocks_in_address_order) {
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(1000, 0, S0);
  void *b = torchalloc_malloc(3000, 0, S0);
  void *c = torchalloc_malloc(12 * MiB, 0, S1);
  torchalloc_pool_retain(0, POOL);
  void *p = torchalloc_pool_malloc(4096, 0, S0, POOL);
  REQUIRE(a && b && c && p);
  torchalloc_free(a, 1000, 0, S0);
  size_t nseg = 0, nblk = 0;
  CHECK_EQ(torchalloc_snapshot(0, NULL, 0, NULL, 0, &nseg, &nblk), 1);
  CHECK_EQ(nseg, 3);
  CHECK_EQ(nblk, 3 + 1 + 2); /* small: a(free) b rest; large: c; pool: p rest */
  torchalloc_segment_info segs[3];
  torchalloc_block_info blocks[6];
  CHECK_EQ(torchalloc_snapshot(0, segs, 3, blocks, 6, &nseg, &nblk), 0);
  int pool_segments = 0;
  for (size_t i = 0; i < nseg; i++) {
    if (i) CHECK(segs[i - 1].addr < segs[i].addr);
    uint64_t at = segs[i].addr;
    for (uint32_t k = 0; k < segs[i].nblocks; k++) {
      const torchalloc_block_info *bl = &blocks[segs[i].first_block + k];
      CHECK(bl->addr == at); /* the blocks tile the segment */
      at += bl->size;
      /* A free block shows its last request (a's), as PyTorch's snapshot does; bytes never handed out 0. */
      if (bl->state == TORCHALLOC_BLOCK_FREE) CHECK_EQ(bl->requested, bl->addr == (uintptr_t)a ? 1000 : 0);
    }
    CHECK(at == segs[i].addr + segs[i].size);
    if (segs[i].pool_id[0] == 7) {
      pool_segments++;
      CHECK(blocks[segs[i].first_block].addr == (uintptr_t)p);
    }
  }
  CHECK_EQ(pool_segments, 1);
  CHECK_EQ(blocks[0].state, TORCHALLOC_BLOCK_FREE); /* a, freed */
  CHECK_EQ(blocks[1].requested, 3000);
  void *base = NULL;
  size_t size = 0;
  int dev = -1;
  CHECK_EQ(torchalloc_segment_of((char *)b + 100, &base, &size, &dev), 0);
  CHECK(base == (void *)(uintptr_t)segs[0].addr && size == 2 * MiB && dev == 0);
  CHECK_EQ(torchalloc_segment_of((void *)16, &base, &size, &dev), -1);
  /* c (>= 10 MiB) got a segment of its own size; the rest of a small segment is largest */
  CHECK_EQ(torchalloc_largest_cached_block(0), 2 * MiB - 4096);
  torchalloc_free(b, 3000, 0, S0);
  torchalloc_free(c, 12 * MiB, 0, S1);
  torchalloc_free(p, 4096, 0, S0);
  CHECK_INVARIANTS();
}

TEST(free_ptr_frees_by_pointer_alone_on_any_device) {
  REQUIRE(sim_reset("sim_devices:2") == 0);
  void *a = torchalloc_try_malloc(5000, 1, S1);
  REQUIRE(a);
  CHECK_EQ(torchalloc_free_ptr(a), 0);
  torchalloc_stats s1;
  torchalloc_get_stats(1, &s1);
  CHECK_EQ(s1.allocation[ALL].current, 0);
  CHECK_EQ(torchalloc_free_ptr(a), -1); /* a double free, counted on device 0 */
  CHECK_EQ(stats0().num_bad_double_free + stats0().num_bad_free_unknown, 1);
  CHECK_EQ(torchalloc_free_ptr(NULL), -1);
}

TEST(oom_summary_says_what_failed) {
  REQUIRE(sim_reset("sim_capacity:64MiB") == 0);
  char text[1024];
  CHECK_EQ(torchalloc_oom_summary(0, text, sizeof text), 0);
  void *a = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(a);
  CHECK(torchalloc_try_malloc(40 * MiB, 0, S0) == NULL);
  int n = torchalloc_oom_summary(0, text, sizeof text);
  CHECK(n > 0 && (size_t)n < sizeof text);
  /* PyTorch's first sentence, which its users' and its own tests match */
  const char *head = "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which ";
  CHECK(strncmp(text, head, strlen(head)) == 0);
  CHECK(strstr(text, "torchalloc (stream 0, policy caching) reserves 40.00 MiB") != NULL);
  torchalloc_free(a, 40 * MiB, 0, S0);
}

static void allocate_100MiB(const void *arg) {
  (void)arg;
  torchalloc_malloc(100 * MiB, 0, S0);
}

TEST(oom_abort_stops_the_process_with_the_reason) {
  REQUIRE(sim_reset("sim_capacity:64MiB,oom:abort,warn:1") == 0);
  char out[4096];
  int status = run_in_child(allocate_100MiB, NULL, out, sizeof out);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  CHECK(strstr(out, "torchalloc: fatal: cannot allocate") != NULL);
  CHECK(strstr(out, "CUDA out of memory") != NULL);
  CHECK(strstr(out, "torch.OutOfMemoryError") != NULL);
  /* try_malloc never stops the process. */
  CHECK(torchalloc_try_malloc(100 * MiB, 0, S0) == NULL);
}

static void capture_then_malloc(const void *arg) {
  (void)arg;
  torchalloc_sim_capture(0, S0, 1);
  torchalloc_malloc(4096, 0, S0);
}

TEST(the_plain_route_stops_on_a_capture_it_cannot_keep_private) {
  REQUIRE(sim_reset("oom:abort") == 0);
  char out[4096];
  int status = run_in_child(capture_then_malloc, NULL, out, sizeof out);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  CHECK(strstr(out, "CUDA graph is being captured") != NULL);
  CHECK(strstr(out, "torchalloc.install()") != NULL);
  /* The bridge's entry (and oom:null) do not stop: routing tells the core. */
  REQUIRE(sim_reset("") == 0);
  torchalloc_sim_capture(0, S0, 1);
  void *a = torchalloc_malloc(4096, 0, S0);
  CHECK(a != NULL);
  torchalloc_sim_capture(0, S0, 0);
  torchalloc_free(a, 4096, 0, S0);
}

TEST(memory_fraction_is_readable_and_a_tiny_one_still_caps) {
  REQUIRE(sim_reset("sim_capacity:1GiB") == 0);
  CHECK(torchalloc_get_memory_fraction(0) == 1.0);
  torchalloc_set_memory_fraction(0.25, 0);
  CHECK(torchalloc_get_memory_fraction(0) == 0.25);
  torchalloc_set_memory_fraction(1e-12, 0); /* rounds to 0 bytes: must not mean "no limit" */
  CHECK(torchalloc_try_malloc(512, 0, S0) == NULL);
  CHECK(torchalloc_get_memory_fraction(3) < 0);
}

/* Issue 15's case: on a device with room for it, 1 GiB under a fraction of
 * 1e-12 (0.004 bytes of 4 GiB) is refused, and so is the smallest block;
 * a sane fraction set afterwards lets them through again. */
TEST(a_tiny_memory_fraction_refuses_a_gigabyte) {
  REQUIRE(sim_reset("sim_capacity:4GiB") == 0);
  torchalloc_set_memory_fraction(1e-12, 0);
  CHECK(torchalloc_get_memory_fraction(0) == 1e-12);
  CHECK(torchalloc_try_malloc(1 * GiB, 0, S0) == NULL);
  CHECK(torchalloc_try_malloc(1, 0, S0) == NULL);
  torchalloc_set_memory_fraction(0.5, 0);
  void *p = torchalloc_try_malloc(1 * GiB, 0, S0);
  CHECK(p != NULL);
  if (p) torchalloc_free(p, 1 * GiB, 0, S0);
}

typedef struct seen_segments {
  int allocs, frees;
  uint64_t last_addr, last_size;
} seen_segments;

static void watch(void *ctx, int device, int event, uint64_t addr, uint64_t size, uint64_t stream) {
  seen_segments *s = ctx;
  (void)device, (void)stream;
  if (event == TORCHALLOC_SEGMENT_ALLOC) s->allocs++;
  if (event == TORCHALLOC_SEGMENT_FREE) s->frees++;
  s->last_addr = addr;
  s->last_size = size;
}

TEST(the_segment_observer_sees_every_device_allocation_and_release) {
  REQUIRE(sim_reset("") == 0);
  seen_segments seen = {0};
  torchalloc_set_segment_observer(watch, &seen);
  void *a = torchalloc_malloc(12 * MiB, 0, S0);
  REQUIRE(a);
  CHECK_EQ(seen.allocs, 1);
  CHECK(seen.last_addr == (uintptr_t)a && seen.last_size == 12 * MiB);
  torchalloc_free(a, 12 * MiB, 0, S0);
  CHECK_EQ(seen.frees, 0); /* cached */
  torchalloc_empty_cache(0);
  CHECK_EQ(seen.frees, 1);
  torchalloc_set_segment_observer(NULL, NULL);
  void *b = torchalloc_malloc(12 * MiB, 0, S0);
  CHECK_EQ(seen.allocs, 1);
  torchalloc_free(b, 12 * MiB, 0, S0);
}

TEST(a_pool_goes_back_to_a_checkpoint) {
  /* cudagraph trees' setCheckpointPoolState: the pool's live blocks become
   * exactly the checkpoint's, at the checkpoint's addresses. */
  REQUIRE(sim_reset("") == 0);
  REQUIRE(torchalloc_pool_retain(0, POOL) == 1);
  void *a = torchalloc_pool_malloc(3000, 0, S0, POOL);
  void *b = torchalloc_pool_malloc(6 * MiB, 0, S0, POOL);
  void *c = torchalloc_pool_malloc(5000, 0, S0, POOL);
  REQUIRE(a && b && c);
  /* The checkpoint: a and c live (b freed), as a snapshot gives them. */
  torchalloc_block_info live[2] = {
      {.addr = (uintptr_t)a, .size = 3072, .requested = 3000},
      {.addr = (uintptr_t)c, .size = 5120, .requested = 5000},
  };
  /* Meanwhile the pool moved on: a freed, b kept, d made. */
  torchalloc_free(a, 3000, 0, S0);
  void *d = torchalloc_pool_malloc(2000, 0, S0, POOL);
  REQUIRE(d);
  uint64_t freed[8];
  size_t nfreed = 0;
  REQUIRE(torchalloc_pool_restore(0, POOL, live, 2, freed, 8, &nfreed) == 0);
  CHECK_EQ(nfreed, 3); /* b, c and d were live: all freed first */
  uint64_t now[8];
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, now, 8), 2);
  CHECK((now[0] == (uintptr_t)a && now[1] == (uintptr_t)c) || (now[0] == (uintptr_t)c && now[1] == (uintptr_t)a));
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 3072 + 5120);
  CHECK_EQ(s.requested_bytes[ALL].current, 3000 + 5000);
  CHECK_INVARIANTS();
  /* A checkpoint that no longer matches the pool's segments is refused. */
  torchalloc_block_info stray = {.addr = 16, .size = 512, .requested = 1};
  CHECK_EQ(torchalloc_pool_restore(0, POOL, &stray, 1, freed, 8, &nfreed), -1);
  CHECK(strstr(torchalloc_last_error(), "no longer match") != NULL);
  CHECK_EQ(torchalloc_pool_restore(0, OTHER_POOL, live, 2, freed, 8, &nfreed), -1); /* no such pool */
  CHECK_INVARIANTS();
  /* The restored blocks free like any other. */
  CHECK_EQ(torchalloc_pool_live_blocks(0, POOL, now, 8), 0); /* the refused restore freed them, then failed */
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 0);
}

/* CUDA's global capture mode is process-wide: a cudaFree of device 0's
 * memory while device 1 captures invalidates device 1's graph. So exact's
 * frees on device 0 wait too, and go back once no capture is underway. */
TEST(exact_frees_wait_for_a_capture_on_another_device) {
  REQUIRE(sim_reset("policy:exact,sim_devices:2") == 0);
  void *a = torchalloc_malloc(4 * MiB, 0, S0);
  REQUIRE(a);
  REQUIRE(torchalloc_routing_begin(1) == 0);
  torchalloc_free(a, 4 * MiB, 0, S0);
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 0);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 4 * MiB); /* not yet back to the device */
  CHECK_EQ(torchalloc_empty_cache(0), 0);                   /* nor by empty_cache while device 1 captures */
  void *b = torchalloc_malloc(2 * MiB, 0, S0);              /* device 0 keeps working meanwhile */
  REQUIRE(b);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 6 * MiB);
  REQUIRE(torchalloc_routing_end(1) == 0);
  torchalloc_free(b, 2 * MiB, 0, S0);
  void *c = torchalloc_malloc(512, 0, S0); /* device 0's next request hands back what waited */
  REQUIRE(c);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 512);
  torchalloc_free(c, 512, 0, S0);
  CHECK_INVARIANTS();
}
