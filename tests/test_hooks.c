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
  torchalloc_set_memory_fraction(-0.25, 0);
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

/* Item 2 of the multi-GPU work: a block that other streams still use (NCCL's
 * and DDP's communication streams, FSDP's prefetch stream) must not be handed
 * out again, on any stream, by any policy, on any device, before their events
 * complete; with sim_event_polls:1000 they never complete by polling, so every
 * request below must land outside the block. Only a synchronize (empty_cache)
 * completes them, and then the block is free again. Fails if a policy reused
 * the block early, or if one device's deferral leaked into the other's. */
static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static void no_reuse_before_other_streams_finish(const char *policy, int device) {
  char conf[128];
  snprintf(conf, sizeof conf, "policy:%s,sim_devices:2,sim_event_polls:1000", policy);
  REQUIRE(sim_reset(conf) == 0);
  const int other = 1 - device;
  void *keep = torchalloc_malloc(512, device, S1);
  void *a = torchalloc_malloc(2 * MiB, device, S1); /* made on a side stream (a collective's buffer) */
  REQUIRE(keep && a);
  torchalloc_record_stream(a, S0); /* the compute stream reads it ... */
  torchalloc_record_stream(a, S2); /* ... and another side stream (a prefetch) */
  torchalloc_free(a, 2 * MiB, device, S1);
  torchalloc_stats s;
  memset(&s, 0, sizeof s);
  torchalloc_get_stats(device, &s);
  CHECK_EQ(s.active_bytes[ALL].current, 2 * MiB + 512); /* still active: its streams are not done */
  static const size_t sizes[] = {2 * MiB, 1 * MiB, 2 * MiB - 512, 512 * KiB, 4096, 2 * MiB, 3 * MiB};
  const cudaStream_t streams[] = {S1, S0, S2};
  void *got[21];
  int n = 0;
  for (int round = 0; round < 3; round++)
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++, n++) {
      got[n] = torchalloc_malloc(sizes[k], device, streams[(k + round) % 3]);
      REQUIRE(got[n]);
      if (overlaps(got[n], sizes[k], a, 2 * MiB))
        fprintf(stderr, "  %s device %d: request %d (%zu bytes) reused the block before its streams finished\n",
                policy, device, n, sizes[k]);
      CHECK(!overlaps(got[n], sizes[k], a, 2 * MiB));
    }
  memset(&s, 0, sizeof s);
  torchalloc_get_stats(other, &s);
  CHECK_EQ(s.allocated_bytes[ALL].current, 0); /* per-device state: the other device saw nothing */
  CHECK_EQ(s.reserved_bytes[ALL].current, 0);
  CHECK_EQ(torchalloc_check_invariants(device), 0);
  for (int i = 0; i < n; i++) torchalloc_free(got[i], sizes[i % 7], device, streams[(i % 7 + i / 7) % 3]);
  torchalloc_empty_cache(device); /* synchronizes: the events are done, the deferred free happens */
  memset(&s, 0, sizeof s);
  torchalloc_get_stats(device, &s);
  CHECK_EQ(s.active_bytes[ALL].current, 512);
  CHECK_EQ(s.allocated_bytes[ALL].current, 512);
  CHECK_EQ(torchalloc_check_invariants(device), 0);
  torchalloc_free(keep, 512, device, S1);
  torchalloc_teardown();
}

TEST(no_policy_reuses_a_block_before_its_other_streams_finish) {
  static const char *const policies[] = {"caching", "exact", "phase_arena"};
  for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++)
    for (int device = 0; device < 2; device++) no_reuse_before_other_streams_finish(policies[p], device);
}

/* Fraction 0, as PyTorch takes it (its own test sets it and reads it back):
 * nothing can be allocated, and it reads back 0 rather than "none set". */
TEST(memory_fraction_zero_allows_nothing_and_reads_back) {
  REQUIRE(sim_reset("sim_capacity:100MiB") == 0);
  CHECK(torchalloc_get_memory_fraction(0) == 1.0); /* none set: the whole device */
  torchalloc_set_memory_fraction(0.0, 0);
  CHECK(torchalloc_get_memory_fraction(0) == 0.0);
  CHECK(torchalloc_malloc(512, 0, S0) == NULL);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  torchalloc_set_memory_fraction(0.25, 0);
  CHECK(torchalloc_get_memory_fraction(0) == 0.25);
  void *a = torchalloc_malloc(512, 0, S0);
  CHECK(a != NULL);
  torchalloc_free(a, 512, 0, S0);
}
