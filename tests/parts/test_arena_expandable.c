/* The arena (policies/parts/arena.c) alone with expandable segments, over
 * the fake segment layer's granules: one segment per (stream, pool) grown
 * at its end, free granules given back and mapped again, the free end cut
 * off, an ordinary segment when addresses run out, and compact's release
 * of a stream whose segments it emptied. arena_check recounts after each
 * step, and checks that every live block lies on mapped granules. */
#include "arena_check.h"
#include "check.h"
#include "policies/parts/arena_streams.h"

#define MiB ((size_t)1 << 20)
#define G (2 * MiB) /* the fake device's granule */
#define STREAM(i) ((cudaStream_t)(uintptr_t)(0x1000 + 16 * (uintptr_t)(i)))

#define UP(r, flags) REQUIRE(arena_rig_up(&(r), TA_POLICY_EXPANDABLE | (flags), G) == 0)
#define CHECK_ARENA(r) CHECK_EQ(arena_check((r).a, (r).s), 0)

TEST(one_segment_per_stream_and_pool_grows_at_its_end) {
  arena_rig r;
  UP(r, 0);
  ta_block *a = ta_arena_malloc(r.a, 4 * MiB, STREAM(1));
  REQUIRE(a);
  ta_segment *seg = a->segment;
  CHECK(seg->expansion != NULL);
  CHECK_EQ(seg->size, 4 * MiB);
  ta_block *b = ta_arena_malloc(r.a, 3 * MiB, STREAM(1)); /* grown by two granules; 1 MiB of them left free */
  REQUIRE(b);
  CHECK(b->segment == seg);
  CHECK_EQ(b->addr, a->addr + 4 * MiB);
  CHECK_EQ(b->size, 3 * MiB);
  CHECK_EQ(seg->size, 8 * MiB);
  CHECK(b->next && b->next->state == TA_BLOCK_FREE && b->next->size == 1 * MiB);
  ta_block *c = ta_arena_malloc(r.a, 3 * MiB / 2, STREAM(1)); /* the free end extended by what it lacks */
  REQUIRE(c);
  CHECK_EQ(c->addr, b->addr + 3 * MiB);
  CHECK_EQ(seg->size, 10 * MiB);
  CHECK_EQ(r.s->allocs, 1);
  CHECK_EQ(r.s->grows, 2);
  ta_block *small = ta_arena_malloc(r.a, 512, STREAM(1));
  ta_block *other = ta_arena_malloc(r.a, 3 * MiB, STREAM(2));
  REQUIRE(small && other);
  CHECK(small->segment != seg && small->segment->expansion && small->segment->pool == TA_POOL_SMALL);
  CHECK(other->segment != seg && other->segment->expansion && other->segment->stream == STREAM(2));
  CHECK_EQ(r.s->allocs, 3);
  CHECK_EQ(r.s->device_bytes, ta_arena_reserved(r.a));
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(any_rest_of_512_bytes_is_split_off) {
  arena_rig r;
  UP(r, 0);
  ta_block *b = ta_arena_malloc(r.a, 1 * MiB + 512, STREAM(0)); /* an ordinary segment's block would keep its rest */
  REQUIRE(b);
  CHECK_EQ(b->size, 1 * MiB + 512);
  CHECK_EQ(b->segment->size, G);
  CHECK(b->next && b->next->size == 1 * MiB - 512);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(release_gives_back_free_granules_and_cuts_the_free_end) {
  arena_rig r;
  UP(r, 0);
  ta_block *b[3];
  for (int i = 0; i < 3; i++) REQUIRE((b[i] = ta_arena_malloc(r.a, 4 * MiB, STREAM(1))));
  ta_segment *seg = b[0]->segment;
  ta_arena_free(r.a, b[0]);
  ta_arena_free(r.a, b[2]);
  CHECK_EQ(ta_arena_release_cached(r.a), 8 * MiB);
  CHECK_EQ(seg->size, 8 * MiB); /* the free end is gone */
  CHECK_EQ(seg->unmapped, 4 * MiB); /* the free start is addresses only */
  CHECK_EQ(r.s->device_bytes, 4 * MiB);
  CHECK_EQ(r.s->shrinks, 1);
  CHECK_ARENA(r);
  /* Handed out again, its granules are mapped first. */
  ta_block *again = ta_arena_malloc(r.a, 4 * MiB, STREAM(1));
  REQUIRE(again);
  CHECK_EQ(again->addr, seg->addr);
  CHECK_EQ(seg->unmapped, 0);
  CHECK_EQ(r.s->maps, 1);
  CHECK_EQ(r.s->device_bytes, 8 * MiB);
  CHECK_ARENA(r);
  ta_arena_free(r.a, again);
  ta_arena_free(r.a, b[1]);
  CHECK_EQ(ta_arena_release_cached(r.a), 8 * MiB);
  CHECK_EQ(r.s->nlive, 0); /* nothing lived in it: the segment went, and its stream's entry */
  CHECK_EQ(r.a->nstreams, 0);
  CHECK_EQ(r.s->device_bytes, 0);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(a_free_end_not_on_a_granule_is_cut_at_the_next_one) {
  arena_rig r;
  UP(r, 0);
  ta_block *a = ta_arena_malloc(r.a, 3 * MiB, STREAM(0));
  ta_block *b = ta_arena_malloc(r.a, 5 * MiB, STREAM(0));
  REQUIRE(a && b);
  ta_segment *seg = a->segment;
  CHECK_EQ(seg->size, 8 * MiB);
  ta_arena_free(r.a, b); /* free from 3 MiB to the end */
  CHECK_EQ(ta_arena_release_cached(r.a), 4 * MiB); /* the two granules wholly inside it */
  CHECK_EQ(seg->size, 4 * MiB);
  CHECK(seg->last == a->next && seg->last->size == 1 * MiB && seg->last->state == TA_BLOCK_FREE);
  CHECK_ARENA(r);
  CHECK_EQ(ta_arena_release_cached(r.a), 0); /* the 1 MiB left shares a granule with a live block */
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(without_addresses_an_ordinary_segment_serves) {
  arena_rig r;
  UP(r, 0);
  r.s->no_addresses = 1;
  ta_block *a = ta_arena_malloc(r.a, 3 * MiB, STREAM(0));
  REQUIRE(a);
  CHECK(!a->segment->expansion);
  CHECK_EQ(a->segment->size, 20 * MiB);
  CHECK_ARENA(r);
  arena_rig_down(&r);

  UP(r, 0);
  r.s->reserve_granules = 4; /* 8 MiB of addresses */
  ta_block *b = ta_arena_malloc(r.a, 6 * MiB, STREAM(0));
  ta_block *c = ta_arena_malloc(r.a, 4 * MiB, STREAM(0)); /* 2 MiB of addresses left */
  REQUIRE(b && c);
  CHECK(b->segment->expansion && !c->segment->expansion);
  CHECK_EQ(b->segment->size, 6 * MiB);
  CHECK_EQ(c->segment->size, 20 * MiB);
  CHECK_EQ(r.s->blocks, 3); /* the descriptor made for growing went back */
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(the_device_saying_no_fails_the_request) {
  arena_rig r;
  UP(r, 0);
  r.s->device_limit = 4 * MiB;
  CHECK(!ta_arena_malloc(r.a, 6 * MiB, STREAM(0))); /* no ordinary segment instead: the device is full */
  CHECK_EQ(r.a->nstreams, 0);
  CHECK_EQ(r.s->nlive, 0);
  ta_block *a = ta_arena_malloc(r.a, 2 * MiB, STREAM(0));
  REQUIRE(a);
  CHECK(!ta_arena_malloc(r.a, 4 * MiB, STREAM(0))); /* growing fails */
  CHECK_EQ(a->segment->size, 2 * MiB);
  CHECK_ARENA(r);
  ta_arena_free(r.a, a);
  CHECK(!ta_arena_malloc(r.a, 6 * MiB, STREAM(0))); /* so does extending the free end */
  CHECK(a->segment->first == a->segment->last);
  CHECK_ARENA(r);
  ta_block *b = ta_arena_malloc(r.a, 4 * MiB, STREAM(0)); /* within the limit it grows */
  REQUIRE(b);
  CHECK_EQ(b->addr, b->segment->addr);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

/* ------------------------------------------------------------------------
 * Compact: before reserving past the peak, free granules elsewhere go
 * back; a stream that left with nothing mapped loses its segments and its
 * entry, unless it still has a segment the drained ones do not cover.
 * ---------------------------------------------------------------------- */

TEST(compact_releases_a_stream_it_emptied) {
  arena_rig r;
  UP(r, TA_POLICY_COMPACT);
  r.s->raise_peak = 1;
  ta_block *x = ta_arena_malloc(r.a, 4 * MiB, STREAM(1));
  REQUIRE(x);
  ta_arena_free(r.a, x);
  ta_block *y = ta_arena_malloc(r.a, 4 * MiB, STREAM(2)); /* stream 1's free granules go back first */
  REQUIRE(y);
  CHECK_EQ(ta_arena_find_stream(r.a, STREAM(1)), r.a->nstreams);
  CHECK_EQ(r.a->nstreams, 1);
  CHECK_EQ(r.s->releases, 1);
  CHECK_EQ(r.s->nlive, 1);
  CHECK_EQ(r.s->device_bytes, 4 * MiB);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(compact_keeps_a_stream_that_still_has_a_segment) {
  arena_rig r;
  UP(r, TA_POLICY_COMPACT);
  r.s->raise_peak = 1;
  ta_block *x = ta_arena_malloc(r.a, 4 * MiB, STREAM(1));
  ta_block *keep = ta_arena_malloc(r.a, 512, STREAM(1)); /* its small pool's segment lives on */
  REQUIRE(x && keep);
  ta_arena_free(r.a, x);
  ta_block *y = ta_arena_malloc(r.a, 4 * MiB, STREAM(2));
  REQUIRE(y);
  CHECK(ta_arena_find_stream(r.a, STREAM(1)) < r.a->nstreams);
  CHECK_EQ(r.s->releases, 0);
  CHECK_EQ(x->segment->unmapped, x->segment->size); /* given back, addresses kept */
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(compact_keeps_a_stream_an_arena_of_its_family_may_share) {
  arena_rig r;
  UP(r, TA_POLICY_COMPACT);
  ta_arena *family = NULL;
  ta_arena_join(r.a, &family);
  r.s->raise_peak = 1;
  ta_block *x = ta_arena_malloc(r.a, 4 * MiB, STREAM(1));
  REQUIRE(x);
  ta_arena_free(r.a, x);
  REQUIRE(ta_arena_malloc(r.a, 4 * MiB, STREAM(2)));
  CHECK(ta_arena_find_stream(r.a, STREAM(1)) < r.a->nstreams); /* another phase's arena may have its segments */
  CHECK_EQ(r.s->releases, 0);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

/* ------------------------------------------------------------------------
 * A random run on a few streams, compact or not, with releases: every
 * invariant, mapping included, recounted after each step.
 * ---------------------------------------------------------------------- */

static uint64_t rng_state = 0xD1B54A32D192ED03ull;

static uint64_t rnd(void) { return check_xorshift64star(&rng_state); }

static size_t random_request(void) {
  switch (rnd() % 4) {
  case 0: return 512 * (1 + rnd() % 2048);
  case 1: return 1 * MiB + rnd() % (9 * MiB);
  case 2: return 10 * MiB + rnd() % (20 * MiB);
  default: return (size_t)1 << (9 + rnd() % 14);
  }
}

static void random_run(unsigned flags) {
  enum { STEPS = 3000, MAX_LIVE = 120 };
  ta_block *live[MAX_LIVE];
  size_t n = 0, problems = 0;
  arena_rig r;
  UP(r, flags);
  r.s->reserve_granules = 128;
  for (int step = 0; step < STEPS && problems < 3; step++) {
    unsigned op = (unsigned)(rnd() % 16);
    r.s->raise_peak = rnd() % 2;
    if (op < 8 && n < MAX_LIVE) {
      ta_block *b = ta_arena_malloc(r.a, random_request(), STREAM(rnd() % 3));
      if (b) live[n++] = b;
    } else if (op < 15 && n > 0) {
      size_t k = rnd() % n;
      ta_arena_free(r.a, live[k]);
      live[k] = live[--n];
    } else {
      ta_arena_release_cached(r.a);
    }
    int found = arena_check(r.a, r.s);
    if (found) fprintf(stderr, "  after step %d (op %u)\n", step, op);
    problems += found > 0;
  }
  CHECK_EQ(problems, 0);
  while (n) ta_arena_free(r.a, live[--n]);
  ta_arena_release_cached(r.a);
  CHECK_EQ(r.s->nlive, 0);
  CHECK_EQ(r.s->device_bytes, 0);
  CHECK_EQ(r.a->nstreams, 0);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(random_requests_keep_every_invariant) { random_run(0); }

TEST(random_requests_keep_every_invariant_under_compact) { random_run(TA_POLICY_COMPACT); }
