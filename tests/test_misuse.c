/* Bad input from the caller, on the sim device. For every kind:
 *   - nothing crashes;
 *   - live blocks are untouched: the stats are identical apart from the one
 *     misuse counter, the invariants hold, and every live block is still
 *     freeable with its right size afterwards;
 *   - the counter moves once per occurrence;
 *   - stderr gets exactly one line for the kind, however often it repeats.
 */
#include <limits.h>

#include "capture.h"
#include "sim.h"

/* ------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------- */

#define TA_MAX_REQUEST_PLUS_ONE (((size_t)1 << 40) - 2 * MiB + 1) /* just past common.h's TA_MAX_REQUEST */

static size_t round512(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }

/* The name of the n-th int64 of torchalloc_stats, for readable diffs. */
static void stat_name(size_t idx, char *buf, size_t len) {
  static const char *const arrays[] = {"allocation",     "segment",       "active",
                                       "inactive_split", "allocated_bytes", "reserved_bytes",
                                       "active_bytes",   "inactive_split_bytes", "requested_bytes"};
  static const char *const pools[] = {"all", "small", "large"};
  static const char *const fields[] = {"current", "peak", "allocated", "freed"};
  static const char *const counters[] = {"num_alloc_retries",   "num_ooms",          "num_device_alloc",
                                         "num_device_free",     "num_bad_free_unknown", "num_bad_double_free",
                                         "num_bad_free_size",   "num_bad_size",      "num_bad_device",
                                         "num_bad_free_stream"};
  if (idx == 0) {
    snprintf(buf, len, "version");
  } else if (idx <= 9 * 12) {
    size_t i = idx - 1;
    snprintf(buf, len, "%s[%s].%s", arrays[i / 12], pools[i % 12 / 4], fields[i % 4]);
  } else if (idx - 109 < sizeof counters / sizeof counters[0]) {
    snprintf(buf, len, "%s", counters[idx - 109]);
  } else {
    snprintf(buf, len, "int64 #%zu", idx);
  }
}

/* Number of differing fields; each is printed. */
static int stats_diff(const torchalloc_stats *a, const torchalloc_stats *b) {
  const int64_t *x = (const int64_t *)a, *y = (const int64_t *)b;
  int n = 0;
  for (size_t i = 0; i < sizeof *a / sizeof(int64_t); i++) {
    if (x[i] == y[i]) continue;
    char name[64];
    stat_name(i, name, sizeof name);
    fprintf(stderr, "    stats differ: %s was %lld, now %lld\n", name, (long long)x[i], (long long)y[i]);
    n++;
  }
  return n;
}

/* `after` equals `before` except `field`, which moved by exactly `delta`. */
#define CHECK_STATS_SAME_EXCEPT(before, after, field, delta) \
  do {                                                        \
    torchalloc_stats a_ = (after);                            \
    CHECK_EQ(a_.field - (before).field, (delta));             \
    a_.field = (before).field;                                \
    CHECK(stats_diff(&(before), &a_) == 0);                   \
  } while (0)

/* Live blocks of every shape, plus a cached free block, on device 0. */
typedef struct fixture {
  void *ptr[4];
  size_t size[4];
  cudaStream_t stream[4];
  int n;
} fixture;

static int fixture_make(fixture *f) {
  static const size_t sizes[] = {1000, 5 * MiB, 30 * MiB, 4096};
  static const cudaStream_t streams[] = {S0, S1, S0, S2};
  memset(f, 0, sizeof *f);
  for (int i = 0; i < 4; i++) {
    f->ptr[i] = torchalloc_malloc(sizes[i], 0, streams[i]);
    f->size[i] = sizes[i];
    f->stream[i] = streams[i];
    if (!f->ptr[i]) return -1;
    f->n++;
  }
  void *cached = torchalloc_malloc(8192, 0, S0); /* leaves a free block in the cache */
  if (!cached) return -1;
  torchalloc_free(cached, 8192, 0, S0);
  return 0;
}

static int overlaps_fixture(const fixture *f, const void *p, size_t size) {
  uintptr_t a = (uintptr_t)p, e = a + round512(size);
  for (int i = 0; i < f->n; i++) {
    uintptr_t b = (uintptr_t)f->ptr[i], be = b + round512(f->size[i]);
    if (a < be && b < e) return 1;
  }
  return 0;
}

/* The fixture's blocks are still live and usable: new blocks do not overlap
 * them, and each frees cleanly with its right size (no misuse counted). */
static void fixture_check_and_free(fixture *f) {
  torchalloc_stats before = stats0();
  void *fresh[3];
  static const size_t fresh_sizes[] = {1000, 5 * MiB, 30 * MiB};
  for (int i = 0; i < 3; i++) {
    fresh[i] = torchalloc_malloc(fresh_sizes[i], 0, S0);
    CHECK(fresh[i] != NULL);
    CHECK(!overlaps_fixture(f, fresh[i], fresh_sizes[i]));
  }
  for (int i = 0; i < 3; i++) torchalloc_free(fresh[i], fresh_sizes[i], 0, S0);
  CHECK_INVARIANTS();
  for (int i = 0; i < f->n; i++) {
    torchalloc_stats s = stats0();
    torchalloc_free(f->ptr[i], f->size[i], 0, f->stream[i]);
    torchalloc_stats t = stats0();
    CHECK_EQ(t.allocation[ALL].current, s.allocation[ALL].current - 1);
    CHECK_EQ(t.requested_bytes[ALL].current, s.requested_bytes[ALL].current - (int64_t)f->size[i]);
    CHECK_INVARIANTS();
  }
  torchalloc_stats after = stats0();
  CHECK_EQ(after.allocation[ALL].current, 0);
  CHECK_EQ(after.allocated_bytes[ALL].current, 0);
  CHECK_EQ(after.requested_bytes[ALL].current, 0);
  CHECK_EQ(after.num_bad_free_unknown, before.num_bad_free_unknown);
  CHECK_EQ(after.num_bad_double_free, before.num_bad_double_free);
  CHECK_EQ(after.num_bad_free_size, before.num_bad_free_size);
  CHECK_EQ(after.num_bad_size, before.num_bad_size);
  CHECK_EQ(after.num_bad_device, before.num_bad_device);
  CHECK_EQ(after.num_bad_free_stream, before.num_bad_free_stream);
  f->n = 0;
}

/* One stderr line in total, and it names the counter. */
static void check_one_line(capture *c, int lines, const char *counter, const char *what) {
  CHECK_EQ(lines, 1);
  CHECK_EQ(capture_count(c, "torchalloc"), 1);
  CHECK_EQ(capture_count(c, counter), 1);
  if (lines != 1 || capture_count(c, counter) != 1) capture_dump(c, what);
}

/* ------------------------------------------------------------------------
 * Each kind
 * ---------------------------------------------------------------------- */

TEST(free_of_a_pointer_never_handed_out) {
  REQUIRE(sim_reset("warn:1") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  torchalloc_stats before = stats0();
  int local;
  void *const bogus[] = {
      (void *)(uintptr_t)0x1234000,          /* nowhere near the sim address space */
      &local,                                /* a host stack address */
      (void *)(((uintptr_t)1 << 52) - 512),  /* just below device 0's sim range */
      (void *)(((uintptr_t)3 << 51)),        /* inside device 0's range, far past any segment */
  };
  const int n = (int)(sizeof bogus / sizeof bogus[0]);
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < n; i++) torchalloc_free(bogus[i], 4096, 0, round == 1 ? S1 : S0);
  int lines = capture_end(&c);
  check_one_line(&c, lines, "num_bad_free_unknown", "free of unknown pointers");
  CHECK(strstr(c.text, "never allocated") != NULL);
  CHECK_STATS_SAME_EXCEPT(before, stats0(), num_bad_free_unknown, 3 * n);
  CHECK_INVARIANTS();
  fixture_check_and_free(&f);
}

TEST(double_free) {
  REQUIRE(sim_reset("warn:1") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  void *small = torchalloc_malloc(4096, 0, S0);
  void *large = torchalloc_malloc(3 * MiB, 0, S1);
  REQUIRE(small && large);
  torchalloc_free(small, 4096, 0, S0);
  torchalloc_free(large, 3 * MiB, 0, S1);
  torchalloc_stats before = stats0();
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  for (int i = 0; i < 4; i++) {
    torchalloc_free(small, 4096, 0, S0);
    torchalloc_free(large, 3 * MiB, 0, S1);
  }
  int lines = capture_end(&c);
  check_one_line(&c, lines, "num_bad_double_free", "double frees");
  CHECK_STATS_SAME_EXCEPT(before, stats0(), num_bad_double_free, 8);
  CHECK_INVARIANTS();
  /* The twice-freed blocks went back to the cache once: they serve one
   * request each again, without overlapping anything live. */
  void *again = torchalloc_malloc(4096, 0, S0);
  void *again2 = torchalloc_malloc(4096, 0, S0);
  REQUIRE(again && again2);
  CHECK(again != again2);
  CHECK(!overlaps_fixture(&f, again, 4096) && !overlaps_fixture(&f, again2, 4096));
  torchalloc_free(again, 4096, 0, S0);
  torchalloc_free(again2, 4096, 0, S0);
  fixture_check_and_free(&f);
}

TEST(free_with_the_wrong_size_keeps_the_block_allocated) {
  REQUIRE(sim_reset("warn:1") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  torchalloc_stats before = stats0();
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  torchalloc_free(f.ptr[0], 999, 0, S0);           /* one byte short */
  torchalloc_free(f.ptr[0], 1024, 0, S0);          /* the rounded size is not the requested size */
  torchalloc_free(f.ptr[1], 5 * MiB + 1, 0, S1);   /* large block */
  torchalloc_free(f.ptr[2], 0, 0, S0);             /* zero */
  torchalloc_free(f.ptr[2], (size_t)-1, 0, S0);    /* absurd */
  int lines = capture_end(&c);
  check_one_line(&c, lines, "num_bad_free_size", "frees with a wrong size");
  CHECK(strstr(c.text, "stays allocated") != NULL);
  CHECK_STATS_SAME_EXCEPT(before, stats0(), num_bad_free_size, 5);
  CHECK_INVARIANTS();
  fixture_check_and_free(&f); /* the right size still frees them */
}

/* PyTorch frees with the allocation stream; another stream means the
 * caller's pointer is stale (its address may be someone else's now). */
TEST(free_on_another_stream_keeps_the_block_allocated) {
  REQUIRE(sim_reset("warn:1") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0); /* f.ptr[1] lives on S1, f.ptr[3] on S2 */
  torchalloc_stats before = stats0();
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  torchalloc_free(f.ptr[1], f.size[1], 0, S0);
  torchalloc_free(f.ptr[1], f.size[1], 0, S2);
  torchalloc_free(f.ptr[3], f.size[3], 0, S1);
  torchalloc_free(f.ptr[0], f.size[0], 0, S1); /* allocated on S0 */
  int lines = capture_end(&c);
  check_one_line(&c, lines, "num_bad_free_stream", "frees on another stream");
  CHECK(strstr(c.text, "stays allocated") != NULL);
  CHECK_STATS_SAME_EXCEPT(before, stats0(), num_bad_free_stream, 4);
  CHECK_INVARIANTS();
  fixture_check_and_free(&f); /* the right stream still frees them */
}

/* A stale free after a double free: the address went to a new block. With
 * another size it is refused; with the same size and stream it is the
 * limit torchalloc.h documents (nothing tells it from the owner's free). */
TEST(stale_free_of_a_reused_address) {
  REQUIRE(sim_reset("warn:0") == 0);
  void *p = torchalloc_malloc(4096, 0, S0);
  REQUIRE(p);
  torchalloc_free(p, 4096, 0, S0);
  torchalloc_free(p, 4096, 0, S0); /* detected: the address is free */
  CHECK_EQ(stats0().num_bad_double_free, 1);
  void *q = torchalloc_malloc(2048, 0, S0);
  REQUIRE(q == p); /* the cache hands the address out again */
  torchalloc_free(p, 4096, 0, S0); /* stale, other size: refused */
  CHECK_EQ(stats0().num_bad_free_size, 1);
  CHECK_EQ(stats0().allocation[ALL].current, 1);
  torchalloc_free(q, 2048, 0, S0);
  void *r = torchalloc_malloc(4096, 0, S0);
  REQUIRE(r == p);
  torchalloc_free(p, 4096, 0, S0); /* stale, same size and stream: frees r, undetectably */
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocation[ALL].current, 0);
  CHECK_EQ(s.num_bad_double_free + s.num_bad_free_size + s.num_bad_free_stream + s.num_bad_free_unknown, 2);
  torchalloc_free(r, 4096, 0, S0); /* the owner's own free is now the one counted as a double free */
  CHECK_EQ(stats0().num_bad_double_free, 2);
  CHECK_INVARIANTS();
}

TEST(absurd_sizes_return_null) {
  REQUIRE(sim_reset("warn:1") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  torchalloc_stats before = stats0();
  void *got[8];
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  got[6] = torchalloc_pool_malloc((size_t)-1, 0, S0, 7, 0); /* the pool route refuses them the same way */
  got[7] = torchalloc_pool_malloc(TA_MAX_REQUEST_PLUS_ONE, 0, S1, 7, 0);
  got[0] = torchalloc_malloc((size_t)-1, 0, S0);
  got[1] = torchalloc_malloc((size_t)1 << 41, 0, S0);
  got[2] = torchalloc_malloc((size_t)-1, 0, S1);
  got[3] = torchalloc_malloc(((size_t)1 << 41), 0, S2);
  got[4] = torchalloc_malloc((size_t)-1 - 511, 0, S0); /* would wrap when rounded up to 512 */
  got[5] = torchalloc_malloc(SIZE_MAX / 2 + 1, 0, S0);
  int lines = capture_end(&c);
  for (int i = 0; i < 8; i++) CHECK(got[i] == NULL);
  check_one_line(&c, lines, "num_bad_size", "absurd sizes");
  CHECK_STATS_SAME_EXCEPT(before, stats0(), num_bad_size, 8); /* the pool counted them too (found by fuzz_api) */
  CHECK_EQ(torchalloc_pool_use_count(0, 7, 0), -1);            /* and made no pool for them */
  CHECK_INVARIANTS();
  fixture_check_and_free(&f);
}

TEST(device_index_out_of_range_on_malloc_and_free) {
  REQUIRE(sim_reset("warn:1,sim_devices:1") == 0);
  REQUIRE(torchalloc_device_count() == 1);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  torchalloc_stats before = stats0();
  static const int bad[] = {-1, 7, 1, 64, INT_MAX, INT_MIN};
  const int n = (int)(sizeof bad / sizeof bad[0]);
  int all_null = 1;
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < n; i++) {
      all_null &= torchalloc_malloc(4096, bad[i], S0) == NULL;
      /* A live block of device 0, freed on a bad device: must stay live. */
      torchalloc_free(f.ptr[i % f.n], f.size[i % f.n], bad[i], f.stream[i % f.n]);
    }
  }
  int lines = capture_end(&c);
  CHECK(all_null);
  check_one_line(&c, lines, "num_bad_device", "bad device indices");
  CHECK(strstr(c.text, "out of range") != NULL);
  CHECK_STATS_SAME_EXCEPT(before, stats0(), num_bad_device, 2 * 2 * n);
  CHECK_INVARIANTS();
  /* Control calls refuse a bad device with a message, and count nothing. */
  torchalloc_stats s;
  CHECK_EQ(torchalloc_get_stats(7, &s), -1);
  CHECK(strstr(torchalloc_last_error(), "7") != NULL);
  CHECK_EQ(torchalloc_check_invariants(-1), -1);
  CHECK_EQ(torchalloc_empty_cache(7), -1);
  CHECK_EQ(stats0().num_bad_device, before.num_bad_device + 2 * 2 * n);
  fixture_check_and_free(&f);
}

TEST(size_zero_and_free_of_null_do_nothing) {
  REQUIRE(sim_reset("warn:1") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  torchalloc_stats before = stats0();
  int all_null = 1;
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  for (int i = 0; i < 3; i++) {
    all_null &= torchalloc_malloc(0, 0, S0) == NULL;
    all_null &= torchalloc_malloc(0, 0, S1) == NULL;
    all_null &= torchalloc_malloc(0, 5, S0) == NULL; /* size 0 wins over the bad device */
    torchalloc_free(NULL, 0, 0, S0);
    torchalloc_free(NULL, 4096, 0, S0);
    torchalloc_free(NULL, 4096, 7, S0);
  }
  int lines = capture_end(&c);
  CHECK(all_null);
  CHECK_EQ(lines, 0);
  if (lines) capture_dump(&c, "size 0 and free(NULL)");
  torchalloc_stats after = stats0();
  CHECK(stats_diff(&before, &after) == 0);
  CHECK_INVARIANTS();
  fixture_check_and_free(&f);
}

TEST(every_kind_prints_exactly_one_line_when_interleaved) {
  REQUIRE(sim_reset("warn:1") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  void *freed = torchalloc_malloc(4096, 0, S0);
  REQUIRE(freed);
  torchalloc_free(freed, 4096, 0, S0);
  torchalloc_stats before = stats0();
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  for (int i = 0; i < 5; i++) {
    torchalloc_free((void *)(uintptr_t)0x1000, 4096, 0, S0); /* unknown */
    torchalloc_free(freed, 4096, 0, S0);                     /* double */
    torchalloc_free(f.ptr[0], 1, 0, S0);                     /* size */
    (void)torchalloc_malloc((size_t)-1, 0, S0);              /* bad size */
    (void)torchalloc_malloc(512, -1, S0);                    /* bad device */
    torchalloc_free(f.ptr[1], f.size[1], 0, S2);             /* stream (f.ptr[1] was allocated on S1) */
  }
  int lines = capture_end(&c);
  CHECK_EQ(lines, 6);
  static const char *const kinds[] = {"num_bad_free_unknown", "num_bad_double_free", "num_bad_free_size",
                                      "num_bad_size", "num_bad_device", "num_bad_free_stream"};
  for (int k = 0; k < 6; k++) {
    if (capture_count(&c, kinds[k]) != 1) fprintf(stderr, "  kind %s:\n", kinds[k]);
    CHECK_EQ(capture_count(&c, kinds[k]), 1);
  }
  if (lines != 6) capture_dump(&c, "all kinds interleaved");
  torchalloc_stats after = stats0();
  CHECK_EQ(after.num_bad_free_stream - before.num_bad_free_stream, 5);
  after.num_bad_free_stream = before.num_bad_free_stream;
  CHECK_EQ(after.num_bad_free_unknown - before.num_bad_free_unknown, 5);
  CHECK_EQ(after.num_bad_double_free - before.num_bad_double_free, 5);
  CHECK_EQ(after.num_bad_free_size - before.num_bad_free_size, 5);
  CHECK_EQ(after.num_bad_size - before.num_bad_size, 5);
  CHECK_EQ(after.num_bad_device - before.num_bad_device, 5);
  after.num_bad_free_unknown = before.num_bad_free_unknown;
  after.num_bad_double_free = before.num_bad_double_free;
  after.num_bad_free_size = before.num_bad_free_size;
  after.num_bad_size = before.num_bad_size;
  after.num_bad_device = before.num_bad_device;
  CHECK(stats_diff(&before, &after) == 0);
  CHECK_INVARIANTS();
  fixture_check_and_free(&f);
}

TEST(reinit_prints_each_kind_again_and_resets_the_device_counter) {
  REQUIRE(sim_reset("warn:1") == 0);
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  torchalloc_free((void *)(uintptr_t)0x1000, 4096, 0, S0);
  (void)torchalloc_malloc(512, 9, S0);
  int first = capture_end(&c);
  CHECK_EQ(first, 2);
  REQUIRE(sim_reset("warn:1") == 0);
  CHECK_EQ(stats0().num_bad_device, 0);
  CHECK_EQ(stats0().num_bad_free_unknown, 0);
  REQUIRE(capture_begin(&c) == 0);
  torchalloc_free((void *)(uintptr_t)0x1000, 4096, 0, S0);
  (void)torchalloc_malloc(512, 9, S0);
  int second = capture_end(&c);
  CHECK_EQ(second, 2);
  CHECK_EQ(stats0().num_bad_device, 1);
  CHECK_EQ(stats0().num_bad_free_unknown, 1);
}

TEST(warn_0_counts_every_kind_and_prints_nothing) {
  REQUIRE(sim_reset("warn:0") == 0);
  fixture f;
  REQUIRE(fixture_make(&f) == 0);
  void *freed = torchalloc_malloc(4096, 0, S0);
  REQUIRE(freed);
  torchalloc_free(freed, 4096, 0, S0);
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  torchalloc_free((void *)(uintptr_t)0x1000, 4096, 0, S0);
  torchalloc_free(freed, 4096, 0, S0);
  torchalloc_free(f.ptr[0], 1, 0, S0);
  (void)torchalloc_malloc((size_t)-1, 0, S0);
  (void)torchalloc_malloc(512, -1, S0);
  int lines = capture_end(&c);
  CHECK_EQ(lines, 0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.num_bad_free_unknown, 1);
  CHECK_EQ(s.num_bad_double_free, 1);
  CHECK_EQ(s.num_bad_free_size, 1);
  CHECK_EQ(s.num_bad_size, 1);
  CHECK_EQ(s.num_bad_device, 1);
  CHECK_INVARIANTS();
  fixture_check_and_free(&f);
}

/* ------------------------------------------------------------------------
 * Regressions: behaviour the core once got wrong
 * ---------------------------------------------------------------------- */

/* A pointer inside a live block was never handed out (blocks are 512-aligned,
 * p + 1 cannot be one), so torchalloc.h says num_bad_free_unknown; the core
 * counts it as num_bad_double_free because it lies inside a segment. */
TEST(interior_pointer_free_counts_as_never_allocated) {
  REQUIRE(sim_reset("warn:0") == 0);
  void *p = torchalloc_malloc(4096, 0, S0);
  REQUIRE(p);
  torchalloc_free((char *)p + 1, 4096, 0, S0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.num_bad_free_unknown, 1);
  CHECK_EQ(s.num_bad_double_free, 0);
  torchalloc_free(p, 4096, 0, S0);
}

/* A double free under `exact` (whose free returns the segment to the device)
 * or after empty_cache is counted and reported as "never allocated"
 * (num_bad_free_unknown): torchalloc.h defines that counter as "pointer
 * torchalloc never handed out", and the message tells the user something
 * false. */
TEST(double_free_after_the_segment_is_gone_is_still_a_double_free) {
  REQUIRE(sim_reset("warn:0,policy:exact") == 0);
  void *p = torchalloc_malloc(4096, 0, S0);
  REQUIRE(p);
  torchalloc_free(p, 4096, 0, S0);
  torchalloc_free(p, 4096, 0, S0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.num_bad_double_free, 1);
  CHECK_EQ(s.num_bad_free_unknown, 0);
}

/* record_stream of a pointer that is not live prints the free_unknown warning
 * ("every occurrence is counted in stats as num_bad_free_unknown") but counts
 * nothing, and it uses up that kind's one line: a real unknown free that
 * follows is never printed. */
TEST(record_stream_of_unknown_pointer_is_counted_and_printed_once) {
  REQUIRE(sim_reset("warn:1") == 0);
  capture c;
  REQUIRE(capture_begin(&c) == 0);
  torchalloc_record_stream((void *)(uintptr_t)0x1000, S1);
  torchalloc_free((void *)(uintptr_t)0x2000, 4096, 0, S0);
  int lines = capture_end(&c);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.num_bad_free_unknown, 2); /* the message promises both are counted */
  CHECK(capture_count(&c, "free of") == 1); /* the real free's line */
  (void)lines;
}
