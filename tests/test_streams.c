/* Many streams (issue: the cost of a call grew with the streams ever used).
 * A program may make a stream per request or per batch; under the default
 * (reclaim) each stream's segments, markers and arena entry must go once
 * the stream is done with them, so that what a call looks at does not grow
 * with the streams seen. What it costs is bench_streams's to print; these
 * pin the state left behind. */
#include "sim.h"
#include "torchalloc_sim.h"

#define STREAM(i) ((cudaStream_t)(uintptr_t)(0x10000 + (uintptr_t)(i) * 16))

static int reclaim_reset(void) {
  torchalloc_teardown();
  if (torchalloc_init("backend:sim,warn:0,oom_report:off,sim_capacity:8GiB") != 0) return -1;
  return torchalloc_segment_mode(0, NULL) == 3 ? 0 : -1; /* the default: reclaim */
}

static int64_t segments(void) { return stats0().segment[ALL].current; }

TEST(streams_used_once_leave_no_segments_behind) {
  REQUIRE(reclaim_reset() == 0);
  for (int i = 0; i < 100000; i++) {
    void *p = torchalloc_malloc(512, 0, STREAM(i));
    REQUIRE(p);
    torchalloc_free(p, 512, 0, STREAM(i));
    if (i % 10000 == 0) CHECK_INVARIANTS();
  }
  /* Each new stream's segment takes the last one's granule (the device is
   * past it), which leaves that segment nothing: it goes. */
  CHECK(segments() <= 2);
  CHECK(stats0().reserved_bytes[ALL].current <= (int64_t)(4 * MiB));
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 0);
  CHECK_INVARIANTS();
  torchalloc_teardown();
}

TEST(streams_with_both_pools_leave_no_segments_behind) {
  REQUIRE(reclaim_reset() == 0);
  for (int i = 0; i < 20000; i++) {
    void *small = torchalloc_malloc(512, 0, STREAM(i)), *large = torchalloc_malloc(3 * MiB, 0, STREAM(i));
    REQUIRE(small && large);
    torchalloc_free(large, 3 * MiB, 0, STREAM(i));
    torchalloc_free(small, 512, 0, STREAM(i));
  }
  CHECK(segments() <= 4);
  CHECK_INVARIANTS();
  torchalloc_teardown();
}

TEST(a_stream_with_a_live_block_keeps_its_segment_while_others_come_and_go) {
  REQUIRE(reclaim_reset() == 0);
  char *kept = torchalloc_malloc(512, 0, S1);
  REQUIRE(kept);
  for (int i = 0; i < 5000; i++) {
    void *p = torchalloc_malloc(512, 0, STREAM(i));
    REQUIRE(p);
    CHECK(!(p >= (void *)kept && p < (void *)(kept + 2 * MiB))); /* never on the kept block's granule */
    torchalloc_free(p, 512, 0, STREAM(i));
  }
  CHECK(segments() <= 3);
  void *next = torchalloc_malloc(512, 0, S1); /* its segment is still there: the same granule serves */
  REQUIRE(next);
  CHECK((char *)next >= kept && (char *)next < kept + 2 * MiB);
  torchalloc_free(next, 512, 0, S1);
  torchalloc_free(kept, 512, 0, S1);
  CHECK_INVARIANTS();
  torchalloc_teardown();
}

TEST(a_stream_that_comes_back_after_its_segment_went_gets_a_new_one) {
  REQUIRE(reclaim_reset() == 0);
  void *p = torchalloc_malloc(512, 0, S1);
  REQUIRE(p);
  torchalloc_free(p, 512, 0, S1);
  for (int i = 0; i < 100; i++) { /* S1's granule moves on, its segment goes */
    void *q = torchalloc_malloc(512, 0, STREAM(i));
    REQUIRE(q);
    torchalloc_free(q, 512, 0, STREAM(i));
  }
  p = torchalloc_malloc(4096, 0, S1);
  REQUIRE(p);
  torchalloc_free(p, 4096, 0, S1);
  CHECK(segments() <= 3);
  CHECK_INVARIANTS();
  torchalloc_teardown();
}

TEST(streams_are_released_under_a_lagging_device_once_it_catches_up) {
  torchalloc_teardown();
  REQUIRE(torchalloc_init("backend:sim,warn:0,oom_report:off,sim_capacity:8GiB,sim_lag:50") == 0);
  for (int i = 0; i < 20000; i++) {
    void *p = torchalloc_malloc(512, 0, STREAM(i));
    REQUIRE(p);
    torchalloc_sim_use(0, STREAM(i), p, 512);
    torchalloc_free(p, 512, 0, STREAM(i));
  }
  /* A stream's granule moves once the device is past its free (50 uses
   * later): about that many segments wait, not one per stream. */
  CHECK(segments() <= 200);
  CHECK_INVARIANTS();
  CHECK_EQ(torchalloc_sim_capture_violations(0, NULL, 0), 0);
  torchalloc_teardown();
}
