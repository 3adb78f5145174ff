/* The hooks PyTorch calls through CUDAPluggableAllocator: record_stream,
 * memory fraction, reset (empty_cache) and init, on the simulated device. */
#include "sim.h"

TEST(record_stream_defers_reuse_until_the_other_stream_is_done) {
  /* Sim events complete on their third query: each malloc polls once. */
  REQUIRE(sim_reset("sim_event_polls:3") == 0);
  void *a = torchalloc_malloc(1 * MiB, 0, S0);
  void *keep = torchalloc_malloc(512, 0, S0); /* keeps a's block from merging away */
  REQUIRE(a && keep);
  torchalloc_record_stream(a, S1);
  torchalloc_free(a, 1 * MiB, 0, S0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 512);         /* no longer allocated ... */
  CHECK_EQ(s.active_bytes[ALL].current, 1 * MiB + 512);  /* ... but still active */
  CHECK_EQ(s.active[ALL].current, 2);
  CHECK_INVARIANTS();
  /* A second free while it waits is a double free, and changes nothing. */
  torchalloc_free(a, 1 * MiB, 0, S0);
  CHECK_EQ(stats0().num_bad_double_free, 1);
  void *b = torchalloc_malloc(1 * MiB, 0, S0); /* poll 1: pending */
  void *c = torchalloc_malloc(1 * MiB, 0, S0); /* poll 2: pending */
  CHECK(b != a && c != a);
  void *d = torchalloc_malloc(1 * MiB, 0, S0); /* poll 3: done, reused */
  CHECK(d == a);
  s = stats0();
  CHECK_EQ(s.active[ALL].current, 4);
  CHECK_EQ(s.active_bytes[ALL].current, s.allocated_bytes[ALL].current);
  CHECK_INVARIANTS();
  torchalloc_free(b, 1 * MiB, 0, S0);
  torchalloc_free(c, 1 * MiB, 0, S0);
  torchalloc_free(d, 1 * MiB, 0, S0);
  torchalloc_free(keep, 512, 0, S0);
}

TEST(record_stream_on_the_allocation_stream_changes_nothing) {
  REQUIRE(sim_reset("sim_event_polls:1000") == 0);
  void *a = torchalloc_malloc(4096, 0, S0);
  torchalloc_record_stream(a, S0);
  torchalloc_free(a, 4096, 0, S0);
  CHECK_EQ(stats0().active[ALL].current, 0);
  void *b = torchalloc_malloc(4096, 0, S0);
  CHECK(b == a);
  torchalloc_free(b, 4096, 0, S0);
}

TEST(empty_cache_waits_for_pending_blocks_then_releases_them) {
  REQUIRE(sim_reset("sim_event_polls:1000") == 0);
  void *a = torchalloc_malloc(3 * MiB, 0, S0);
  torchalloc_record_stream(a, S1);
  torchalloc_record_stream(a, S2);
  torchalloc_record_stream(a, S2); /* recorded once per stream */
  torchalloc_free(a, 3 * MiB, 0, S0);
  CHECK_EQ(stats0().active_bytes[ALL].current, 3 * MiB);
  /* empty_cache synchronizes the device: the events are done, the block is
   * freed, its segment whole and released. */
  CHECK_EQ(torchalloc_empty_cache(0), 20 * MiB);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.active_bytes[ALL].current, 0);
  CHECK_EQ(s.reserved_bytes[ALL].current, 0);
  CHECK_INVARIANTS();
}

TEST(memory_fraction_caps_reservations) {
  REQUIRE(sim_reset("sim_capacity:100MiB") == 0);
  torchalloc_set_memory_fraction(0.5, 0);
  void *a = torchalloc_malloc(40 * MiB, 0, S0);
  REQUIRE(a);
  CHECK(torchalloc_malloc(20 * MiB, 0, S0) == NULL); /* 60 MiB > 50 MiB cap */
  CHECK_EQ(stats0().num_ooms, 1);
  void *b = torchalloc_malloc(10 * MiB, 0, S0); /* 50 MiB: fits */
  CHECK(b != NULL);
  /* Bad fractions are refused and leave the cap as it was. */
  torchalloc_set_memory_fraction(0.0, 0);
  torchalloc_set_memory_fraction(1.5, 0);
  CHECK(strstr(torchalloc_last_error(), "1.5") != NULL);
  CHECK(torchalloc_malloc(2 * MiB, 0, S0) == NULL);
  torchalloc_set_memory_fraction(1.0, 0);
  void *c = torchalloc_malloc(2 * MiB, 0, S0);
  CHECK(c != NULL);
  torchalloc_free(a, 40 * MiB, 0, S0);
  torchalloc_free(b, 10 * MiB, 0, S0);
  torchalloc_free(c, 2 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(reset_releases_cached_segments_on_every_device) {
  REQUIRE(sim_reset("sim_devices:2") == 0);
  torchalloc_init_devices(2);
  void *a = torchalloc_malloc(512, 0, S0);
  void *b = torchalloc_malloc(512, 1, S0);
  REQUIRE(a && b);
  CHECK((uintptr_t)a >> 52 != (uintptr_t)b >> 52); /* separate address spaces */
  torchalloc_free(a, 512, 0, S0);
  torchalloc_free(b, 512, 1, S0);
  torchalloc_reset();
  torchalloc_stats s0, s1;
  REQUIRE(torchalloc_get_stats(0, &s0) == 0 && torchalloc_get_stats(1, &s1) == 0);
  CHECK_EQ(s0.reserved_bytes[ALL].current, 0);
  CHECK_EQ(s1.reserved_bytes[ALL].current, 0);
  CHECK_EQ(s1.num_device_free, 1);
}
