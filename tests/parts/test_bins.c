/* The free index (policies/parts/bins.c) alone, on block descriptors made
 * here: best fit within its stated bounds (bins.h), the bin boundaries and
 * bitmap words a search crosses, removal, the bounded filtered search, the
 * overflow bin host memory failures leave, and a random run against a
 * brute-force best fit. */
#include "check.h"
#include "host_faults.h"
#include "policies/parts/bins.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* A descriptor as the arena hands one to the index: its address and size. */
static ta_block block(uintptr_t addr, size_t size) { return (ta_block){.addr = addr, .size = size}; }

static size_t found_size(ta_bins *bins, size_t size) {
  ta_block *b = ta_bins_find(bins, size);
  return b ? b->size : 0;
}

TEST(an_empty_index_finds_nothing) {
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  CHECK_EQ(bins->count, 0);
  CHECK(!ta_bins_find(bins, 512));
  CHECK(!ta_bins_find(bins, 2 * MiB));
  CHECK(!ta_bins_find(bins, TA_MAX_REQUEST));
  ta_block b = block(0x1000, 512);
  ta_bins_insert(bins, &b);
  ta_bins_remove(bins, &b);
  CHECK(!ta_bins_find(bins, 512)); /* emptied again */
  CHECK_EQ(bins->count, 0);
  ta_bins_destroy(bins);
}

TEST(below_2_MiB_the_exact_size_or_the_next_larger) {
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  ta_block b[] = {block(0x10000, 1 * KiB), block(0x20000, 4 * KiB), block(0x30000, 1 * MiB), block(0x40000, 1536)};
  for (size_t i = 0; i < 4; i++) ta_bins_insert(bins, &b[i]);
  CHECK_EQ(bins->count, 4);
  CHECK_EQ(found_size(bins, 512), 1 * KiB);
  CHECK_EQ(found_size(bins, 1 * KiB), 1 * KiB);
  CHECK_EQ(found_size(bins, 1536), 1536);
  CHECK_EQ(found_size(bins, 2 * KiB), 4 * KiB);
  CHECK_EQ(found_size(bins, 4 * KiB), 4 * KiB);
  CHECK_EQ(found_size(bins, 4 * KiB + 512), 1 * MiB);
  CHECK_EQ(found_size(bins, 1 * MiB), 1 * MiB);
  CHECK_EQ(found_size(bins, 1 * MiB + 512), 0);
  CHECK(ta_bins_find(bins, 1536) == &b[3]);
  ta_bins_destroy(bins);
}

TEST(from_2_MiB_the_smallest_fitting_block_of_the_bin_then_the_next) {
  /* From 2 MiB a bin spans 1/64 of its power of two: [2 MiB, 2 MiB + 32 KiB) is one. */
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  ta_block b[] = {block(0x100000, 2 * MiB + 20 * KiB), block(0x200000, 2 * MiB + 8 * KiB),
                  block(0x300000, 2 * MiB + 16 * KiB), block(0x400000, 3 * MiB), block(0x500000, 3 * MiB + 512)};
  for (size_t i = 0; i < 5; i++) ta_bins_insert(bins, &b[i]);
  CHECK_EQ(found_size(bins, 2 * MiB), 2 * MiB + 8 * KiB);
  CHECK_EQ(found_size(bins, 2 * MiB + 4 * KiB), 2 * MiB + 8 * KiB);
  CHECK_EQ(found_size(bins, 2 * MiB + 8 * KiB), 2 * MiB + 8 * KiB);
  CHECK_EQ(found_size(bins, 2 * MiB + 10 * KiB), 2 * MiB + 16 * KiB);
  CHECK_EQ(found_size(bins, 2 * MiB + 17 * KiB), 2 * MiB + 20 * KiB);
  /* Nothing in the request's own bin fits: the next bin's smallest. */
  CHECK_EQ(found_size(bins, 2 * MiB + 24 * KiB), 3 * MiB);
  CHECK_EQ(found_size(bins, 3 * MiB), 3 * MiB);
  CHECK_EQ(found_size(bins, 3 * MiB + 512), 3 * MiB + 512);
  CHECK_EQ(found_size(bins, 3 * MiB + 1024), 0);
  /* A small request takes the smallest block there is. */
  CHECK_EQ(found_size(bins, 512), 2 * MiB + 8 * KiB);
  ta_bins_destroy(bins);
}

TEST(equal_sizes_from_2_MiB_go_to_the_lower_address) {
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  ta_block b[] = {block(0x700000, 5 * MiB), block(0x300000, 5 * MiB), block(0x900000, 5 * MiB),
                  block(0x100000, 5 * MiB + 512)};
  for (size_t i = 0; i < 4; i++) ta_bins_insert(bins, &b[i]);
  CHECK(ta_bins_find(bins, 5 * MiB) == &b[1]);
  CHECK(ta_bins_find(bins, 4 * MiB) == &b[1]); /* from the next bin, too */
  ta_bins_remove(bins, &b[1]);
  CHECK(ta_bins_find(bins, 5 * MiB) == &b[0]);
  ta_bins_destroy(bins);
}

TEST(the_search_crosses_bitmap_words) {
  /* Bins 63 and 64 sit in two words of the map; bins 4095 (2 MiB - 512)
   * and 4096 (2 MiB) in two words of the top bitmap. */
  struct {
    size_t block, request;
  } cases[] = {
      {64 * 512, 63 * 512},          {64 * 512, 512},          {128 * 512, 64 * 512 + 512},
      {2 * MiB, 2 * MiB - 512},      {2 * MiB, 2 * MiB - 5 * KiB}, {2 * MiB, 512},
      {64 * MiB, 2 * MiB + 32 * KiB}, {TA_MAX_REQUEST, 512},     {2 * MiB - 512, 2 * MiB - 512},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ta_bins *bins = ta_bins_create();
    REQUIRE(bins);
    ta_block b = block(0x100000, cases[i].block);
    ta_bins_insert(bins, &b);
    if (ta_bins_find(bins, cases[i].request) != &b)
      fprintf(stderr, "  a %zu-byte request did not find the only block, of %zu bytes\n", cases[i].request,
              cases[i].block);
    CHECK(ta_bins_find(bins, cases[i].request) == &b);
    CHECK(!ta_bins_find(bins, cases[i].block + 512));
    ta_bins_destroy(bins);
  }
}

TEST(the_largest_block_has_a_bin) {
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  size_t largest = TA_MAX_BLOCK_SIZE & ~(size_t)511;
  ta_block big = block(0x100000, largest), request_sized = block(0x200000, TA_MAX_REQUEST);
  ta_bins_insert(bins, &big);
  CHECK(big.bin < TA_NBINS); /* a bin of its own range, not the overflow */
  CHECK(ta_bins_find(bins, largest) == &big);
  CHECK(ta_bins_find(bins, TA_MAX_REQUEST) == &big);
  ta_bins_insert(bins, &request_sized);
  CHECK(ta_bins_find(bins, TA_MAX_REQUEST) == &request_sized);
  CHECK(ta_bins_find(bins, TA_MAX_REQUEST + 512) == &big);
  ta_bins_destroy(bins);
}

TEST(blocks_land_in_the_bins_the_header_lays_out) {
  /* bins.h: one bin per 512 B below 2 MiB; from there 64 bins per power of two. */
  struct {
    size_t size;
    uint32_t bin;
  } cases[] = {
      {512, 1},
      {1536, 3},
      {2 * MiB - 512, 4095},
      {2 * MiB, 4096},
      {2 * MiB + 32 * KiB - 512, 4096},
      {2 * MiB + 32 * KiB, 4097},
      {4 * MiB - 512, 4096 + 63},
      {4 * MiB, 4096 + 64},
      {6 * MiB, 4096 + 64 + 32},
      {TA_MAX_BLOCK_SIZE & ~(size_t)511, TA_NBINS - 1},
  };
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ta_block b = block(0x100000, cases[i].size);
    ta_bins_insert(bins, &b);
    if (b.bin != cases[i].bin) fprintf(stderr, "  %zu bytes: bin %u, not %u\n", cases[i].size, b.bin, cases[i].bin);
    CHECK_EQ(b.bin, cases[i].bin);
    ta_bins_remove(bins, &b);
  }
  ta_bins_destroy(bins);
}

TEST(removing_a_block_leaves_the_rest_of_its_bin) {
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  ta_block b[] = {block(0x1000, 4 * KiB), block(0x3000, 4 * KiB), block(0x5000, 4 * KiB), block(0x9000, 8 * KiB)};
  for (size_t i = 0; i < 4; i++) ta_bins_insert(bins, &b[i]);
  ta_bins_remove(bins, &b[1]); /* the middle of its list */
  CHECK(!b[1].bin_prev && !b[1].bin_next);
  CHECK_EQ(bins->count, 3);
  ta_block *first = ta_bins_find(bins, 4 * KiB);
  CHECK(first == &b[0] || first == &b[2]);
  ta_bins_remove(bins, &b[2]); /* the head */
  CHECK(ta_bins_find(bins, 4 * KiB) == &b[0]);
  ta_bins_remove(bins, &b[0]); /* the last: the bin is empty, the next one serves */
  CHECK(ta_bins_find(bins, 4 * KiB) == &b[3]);
  CHECK(ta_bins_find(bins, 512) == &b[3]);
  ta_bins_remove(bins, &b[3]);
  CHECK(!ta_bins_find(bins, 512));
  CHECK_EQ(bins->count, 0);
  ta_bins_destroy(bins);
}

/* find_where's filter: odd multiples of 4 KiB only, counting the questions. */
typedef struct {
  int asked;
} filter_calls;

static int odd_page(const ta_block *b, size_t size, void *ctx) {
  (void)size;
  ((filter_calls *)ctx)->asked++;
  return (b->addr / (4 * KiB)) % 2 == 1;
}

TEST(find_where_returns_the_best_accepted_block_within_its_probes) {
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  ta_block b[] = {block(0x2000, 8 * KiB), block(0x11000, 16 * KiB), block(0x40000, 12 * KiB),
                  block(0x81000, 64 * KiB), block(0x100000, 512)};
  for (size_t i = 0; i < 5; i++) ta_bins_insert(bins, &b[i]);
  filter_calls calls = {0};
  CHECK(ta_bins_find_where(bins, 8 * KiB, odd_page, &calls, 100) == &b[1]); /* 8 and 12 KiB refused */
  CHECK(calls.asked == 3);                                                 /* smallest first; 512 B never asked */
  calls.asked = 0;
  CHECK(ta_bins_find_where(bins, 8 * KiB, odd_page, &calls, 2) == NULL); /* the two it may ask refuse */
  CHECK_EQ(calls.asked, 2);
  calls.asked = 0;
  CHECK(ta_bins_find_where(bins, 17 * KiB, odd_page, &calls, 100) == &b[3]);
  CHECK(ta_bins_find_where(bins, 65 * KiB, odd_page, &calls, 100) == NULL);
  /* Two accepted in one bin (from 2 MiB a bin spans sizes), the smaller asked first: the larger is not asked. */
  ta_block larger = block(0x201000, 2 * MiB + 8 * KiB), smaller = block(0x401000, 2 * MiB + 4 * KiB);
  ta_bins_insert(bins, &larger);
  ta_bins_insert(bins, &smaller); /* the head of its list now */
  calls.asked = 0;
  CHECK(ta_bins_find_where(bins, 2 * MiB, odd_page, &calls, 100) == &smaller);
  CHECK_EQ(calls.asked, 1);
  ta_bins_destroy(bins);
}

TEST(without_host_memory_a_block_waits_in_the_overflow_bin) {
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  ta_block small = block(0x1000, 1 * KiB), spilled = block(0x100000, 6 * MiB), large = block(0x900000, 8 * MiB);
  ta_bins_insert(bins, &small);
  long refused = host_failures();
  host_fail_in(1); /* the next bin group cannot be made */
  ta_bins_insert(bins, &spilled);
  host_fail_in(0);
  CHECK_EQ(host_failures(), refused + 1);
  CHECK_EQ(spilled.bin, TA_NBINS);
  CHECK_EQ(bins->count, 2);
  CHECK(ta_bins_find(bins, 2 * KiB) == &spilled);   /* searched whole when no bin has a fit */
  CHECK(ta_bins_find(bins, 512) == &small);
  CHECK(ta_bins_find(bins, 6 * MiB + 512) == NULL);
  ta_bins_insert(bins, &large);                     /* with host memory again: its own bin, which wins */
  CHECK(large.bin < TA_NBINS);
  CHECK(ta_bins_find(bins, 2 * KiB) == &large);
  filter_calls calls = {0};
  CHECK(ta_bins_find_where(bins, 4 * MiB, odd_page, &calls, 100) == NULL); /* neither address is an odd page */
  CHECK_EQ(calls.asked, 2);
  ta_bins_remove(bins, &large);
  CHECK(ta_bins_find(bins, 2 * KiB) == &spilled);
  ta_bins_remove(bins, &spilled);
  CHECK(bins->overflow == NULL);
  CHECK(ta_bins_find(bins, 2 * KiB) == NULL);
  CHECK_EQ(bins->count, 1);
  ta_bins_destroy(bins);
}

/* ------------------------------------------------------------------------
 * A random run against a brute-force best fit. With at most TA_BIN_PROBE
 * blocks in the index no bin's probe stops short, so the contract is
 * exact: the smallest block that fits, and among blocks of one size from
 * 2 MiB the lowest address (below 2 MiB a bin holds one size: any).
 * ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) { return check_xorshift64star(&rng_state); }

/* Sizes that land in few bins (so bins hold several) and across all ranges. */
static size_t random_size(void) {
  switch (rnd() % 4) {
  case 0: return (1 + rnd() % 8) * 512;                                        /* a few small sizes */
  case 1: return 2 * MiB + (rnd() % 8) * 8 * KiB;                               /* one or two large bins */
  case 2: return (1 + rnd() % 4095) * 512;                                      /* any small size */
  default: return ((size_t)1 << (22 + rnd() % 18)) + (rnd() % 64) * 64 * KiB; /* 4 MiB .. 512 GiB */
  }
}

static const ta_block *brute_best(ta_block *const *in, size_t n, size_t size) {
  const ta_block *best = NULL;
  for (size_t i = 0; i < n; i++) {
    const ta_block *b = in[i];
    if (b->size >= size && (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr))) best = b;
  }
  return best;
}

TEST(random_inserts_and_removes_find_the_best_fit) {
  enum { STEPS = 20000, MAX_IN = TA_BIN_PROBE };
  ta_bins *bins = ta_bins_create();
  REQUIRE(bins);
  ta_block pool[MAX_IN];
  ta_block *in[MAX_IN];
  size_t n = 0, wrong = 0;
  uintptr_t next_addr = (uintptr_t)1 << 40, low_addr = next_addr; /* new blocks above and below the others */
  for (int step = 0; step < STEPS && wrong < 5; step++) {
    if (n == 0 || (n < MAX_IN && rnd() % 2)) {
      ta_block *b = NULL; /* a descriptor not in the index */
      for (size_t k = 0; k < MAX_IN && !b; k++) {
        b = &pool[k];
        for (size_t j = 0; j < n; j++)
          if (in[j] == b) b = NULL;
      }
      *b = block(rnd() % 2 ? (next_addr += 1ull << 32) : (low_addr -= 1ull << 32), random_size());
      ta_bins_insert(bins, b);
      in[n++] = b;
    } else {
      size_t k = rnd() % n;
      ta_bins_remove(bins, in[k]);
      in[k] = in[--n];
    }
    if (bins->count != n) wrong++;
    for (int q = 0; q < 8 && n > 0; q++) {
      size_t size = q < 2 ? in[rnd() % n]->size : random_size(); /* sizes present, and any */
      const ta_block *want = brute_best(in, n, size), *got = ta_bins_find(bins, size);
      int same = want == got || (want && got && want->size == got->size && want->size < 2 * MiB);
      if (!same) {
        fprintf(stderr, "  step %d: request %zu: found %zu bytes at %#lx, best %zu at %#lx\n", step, size,
                got ? got->size : 0, got ? (unsigned long)got->addr : 0, want ? want->size : 0,
                want ? (unsigned long)want->addr : 0);
        wrong++;
      }
    }
  }
  CHECK_EQ(wrong, 0);
  ta_bins_destroy(bins);
}
