/* The census of free blocks (allocator/accounting/free_census.c) alone: its free bytes
 * and largest block against a brute-force recount, on both sides of 2 MiB
 * (a count per size below, a hash map and a max-heap from there), the
 * heap's lazy deletion and compaction, and what running out of host memory
 * does to it. */
#include "check.h"
#include "host_faults.h"
#include "accounting/free_census.h"
#include "policies/parts/bins.h" /* TA_MAX_BLOCK_SIZE: the largest block a free index holds, so a census is told */

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

TEST(an_empty_census_counts_nothing) {
  ta_free_census *c = ta_census_create();
  REQUIRE(c);
  CHECK_EQ(c->bytes, 0);
  CHECK_EQ(ta_census_largest(c), 0);
  ta_census_note(c, 512, +1);
  ta_census_note(c, 512, -1);
  ta_census_note(c, 8 * MiB, +1);
  ta_census_note(c, 8 * MiB, -1);
  CHECK_EQ(c->bytes, 0);
  CHECK_EQ(ta_census_largest(c), 0);
  CHECK(!c->failed);
  ta_census_destroy(c);
}

TEST(small_sizes_count_per_size) {
  ta_free_census *c = ta_census_create();
  REQUIRE(c);
  ta_census_note(c, 512, +1);
  ta_census_note(c, 32 * KiB, +1); /* 64 units: the second word of the bitmap */
  ta_census_note(c, 32 * KiB, +1);
  ta_census_note(c, 1536, +1);
  CHECK_EQ(c->bytes, 512 + 64 * KiB + 1536);
  CHECK_EQ(ta_census_largest(c), 32 * KiB);
  ta_census_note(c, 32 * KiB, -1);
  CHECK_EQ(ta_census_largest(c), 32 * KiB); /* one of two left */
  ta_census_note(c, 32 * KiB, -1);
  CHECK_EQ(ta_census_largest(c), 1536);
  ta_census_note(c, 1536, -1);
  CHECK_EQ(ta_census_largest(c), 512);
  CHECK_EQ(c->bytes, 512);
  ta_census_destroy(c);
}

TEST(the_2_MiB_boundary_and_the_largest_sizes) {
  ta_free_census *c = ta_census_create();
  REQUIRE(c);
  size_t largest = TA_MAX_BLOCK_SIZE & ~(size_t)511;
  ta_census_note(c, 2 * MiB - 512, +1); /* the last size counted per size */
  CHECK_EQ(ta_census_largest(c), 2 * MiB - 512);
  ta_census_note(c, 2 * MiB, +1); /* the first in the map */
  CHECK_EQ(ta_census_largest(c), 2 * MiB);
  ta_census_note(c, largest, +1);
  ta_census_note(c, TA_MAX_REQUEST, +1);
  CHECK_EQ(ta_census_largest(c), largest);
  CHECK_EQ(c->bytes, (int64_t)(4 * MiB - 512 + largest + TA_MAX_REQUEST));
  ta_census_note(c, largest, -1);
  CHECK_EQ(ta_census_largest(c), TA_MAX_REQUEST);
  ta_census_note(c, TA_MAX_REQUEST, -1);
  ta_census_note(c, 2 * MiB, -1);
  CHECK_EQ(ta_census_largest(c), 2 * MiB - 512);
  ta_census_destroy(c);
}

TEST(a_large_size_gone_and_back_is_counted_once) {
  ta_free_census *c = ta_census_create();
  REQUIRE(c);
  ta_census_note(c, 8 * MiB, +1);
  ta_census_note(c, 4 * MiB, +1);
  ta_census_note(c, 8 * MiB, -1); /* waits in the heap with a count of 0 */
  ta_census_note(c, 8 * MiB, +1); /* back before it left */
  CHECK_EQ(c->used, 2);
  CHECK_EQ(c->nheap, 2);
  CHECK_EQ(c->dead, 0);
  CHECK_EQ(ta_census_largest(c), 8 * MiB);
  ta_census_note(c, 8 * MiB, -1);
  CHECK_EQ(ta_census_largest(c), 4 * MiB); /* the top with a count of 0 leaves */
  CHECK_EQ(c->nheap, 1);
  CHECK_EQ(c->used, 1);
  CHECK_EQ(c->dead, 0);
  ta_census_destroy(c);
}

TEST(sizes_gone_from_below_the_top_are_compacted_away) {
  enum { SIZES = 200 };
  ta_free_census *c = ta_census_create();
  REQUIRE(c);
  for (size_t i = 1; i <= SIZES; i++) ta_census_note(c, 2 * MiB + i * 512, +1);
  for (size_t i = 1; i < SIZES; i++) ta_census_note(c, 2 * MiB + i * 512, -1); /* all but the largest */
  /* Half the heap dead at most (past a floor of 32), so the heap stays
   * near the sizes still free. */
  CHECK(c->dead <= 32 || c->dead * 2 <= c->nheap);
  CHECK(c->nheap < SIZES / 2);
  CHECK_EQ(c->used, c->nheap);
  CHECK_EQ(ta_census_largest(c), 2 * MiB + SIZES * 512);
  CHECK_EQ(c->bytes, (int64_t)(2 * MiB + SIZES * 512));
  ta_census_destroy(c);
}

TEST(without_host_memory_the_census_says_it_failed) {
  /* The map's first slots, then the heap's first room. */
  for (long nth = 1; nth <= 2; nth++) {
    ta_free_census *c = ta_census_create();
    REQUIRE(c);
    ta_census_note(c, 4 * KiB, +1);
    host_fail_in(nth);
    ta_census_note(c, 4 * MiB, +1);
    host_fail_in(0);
    CHECK(c->failed);
    int64_t bytes = c->bytes;
    ta_census_note(c, 8 * MiB, +1); /* from then on it counts nothing */
    ta_census_note(c, 4 * KiB, -1);
    CHECK_EQ(c->bytes, bytes);
    ta_census_destroy(c);
  }
}

/* ------------------------------------------------------------------------
 * A random run against a brute-force multiset of sizes.
 * ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void) { return check_xorshift64star(&rng_state); }

enum { NSIZES = 600 };

/* Distinct sizes: a third below 2 MiB, the rest from 2 MiB to 1 TiB, some a
 * unit apart (neighbours in the hash map's probing). */
static size_t size_of(size_t k) {
  if (k % 3 == 0) return (1 + (k * 37) % 4095) * 512;
  if (k % 3 == 1) return 2 * MiB + k * 512;
  return ((size_t)1 << (22 + k % 18)) + k * 512;
}

TEST(random_notes_agree_with_a_recount) {
  enum { STEPS = 60000 };
  static uint64_t count[NSIZES];
  ta_free_census *c = ta_census_create();
  REQUIRE(c);
  int64_t bytes = 0;
  size_t blocks = 0, wrong = 0;
  for (int step = 0; step < STEPS && wrong < 5; step++) {
    /* Grow to a few thousand blocks, shrink to none, and again. */
    int adding = blocks == 0 || ((step / 5000) % 2 == 0 ? rnd() % 8 < 5 : rnd() % 8 < 3);
    size_t k = rnd() % NSIZES;
    if (adding) {
      count[k]++, blocks++;
      bytes += (int64_t)size_of(k);
      ta_census_note(c, size_of(k), +1);
    } else {
      while (!count[k]) k = (k + 1) % NSIZES;
      count[k]--, blocks--;
      bytes -= (int64_t)size_of(k);
      ta_census_note(c, size_of(k), -1);
    }
    size_t largest = 0, large_sizes = 0;
    for (size_t i = 0; i < NSIZES; i++)
      if (count[i] && size_of(i) > largest) largest = size_of(i);
    size_t zero = 0;
    for (size_t i = 0; c->slots && i <= c->mask; i++) {
      zero += c->slots[i].units && !c->slots[i].count;
      large_sizes += c->slots[i].units != 0;
    }
    int ok = !c->failed && c->bytes == bytes && c->used == c->nheap && c->used == large_sizes && zero == c->dead &&
             (c->dead <= 32 || c->dead * 2 <= c->nheap);
    if (rnd() % 4 == 0) ok &= ta_census_largest(c) == largest; /* not every step: reading drops dead tops */
    if (!ok) {
      fprintf(stderr, "  step %d: census bytes %lld (recount %lld), largest %zu (%zu), %zu sizes in the map,"
                      " heap %zu, %zu dead (%zu at 0)\n",
              step, (long long)c->bytes, (long long)bytes, ta_census_largest(c), largest, c->used, c->nheap,
              c->dead, zero);
      wrong++;
    }
  }
  CHECK_EQ(wrong, 0);
  ta_census_destroy(c);
}
