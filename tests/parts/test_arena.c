/* The arena (policies/parts/arena.c, arena_streams.c) alone, over the fake
 * segment layer, with ordinary segments: PyTorch's size classes, best fit,
 * splitting and merging, a stream's blocks for that stream only, stream
 * entries made and dropped, claims, and what a device or host saying no
 * leaves behind. After each step arena_check recounts what the arena keeps
 * (its indices, stream entries, the census it tells, the split notes). */
#include "arena_check.h"
#include "check.h"
#include "host_faults.h"
#include "policies/parts/arena_streams.h"
#include "policies/parts/size_classes.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define STREAM(i) ((cudaStream_t)(uintptr_t)(0x1000 + 16 * (uintptr_t)(i)))

#define UP(r, flags) REQUIRE(arena_rig_up(&(r), (flags), 0) == 0)
#define CHECK_ARENA(r) CHECK_EQ(arena_check((r).a, (r).s), 0)

TEST(requests_round_up_to_512_bytes_and_take_their_size_class) {
  struct {
    size_t request, block, segment;
    int pool;
  } cases[] = {
      {0, 512, 2 * MiB, TA_POOL_SMALL},
      {1, 512, 2 * MiB, TA_POOL_SMALL},
      {512, 512, 2 * MiB, TA_POOL_SMALL},
      {513, 1024, 2 * MiB, TA_POOL_SMALL},
      {1 * MiB, 1 * MiB, 2 * MiB, TA_POOL_SMALL},
      {1 * MiB + 1, 1 * MiB + 512, 20 * MiB, TA_POOL_LARGE},
      {10 * MiB - 512, 10 * MiB - 512, 20 * MiB, TA_POOL_LARGE},
      {10 * MiB, 10 * MiB, 10 * MiB, TA_POOL_LARGE},            /* its own segment */
      {10 * MiB + 1, 10 * MiB + 512, 12 * MiB, TA_POOL_LARGE},  /* rounded up to 2 MiB; the rest split off */
      {19 * MiB + 512, 20 * MiB, 20 * MiB, TA_POOL_LARGE},      /* a rest of 1 MiB - 512 stays with the block */
      {TA_MAX_REQUEST, TA_MAX_REQUEST, TA_MAX_REQUEST, TA_POOL_LARGE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    arena_rig r;
    UP(r, 0);
    ta_block *b = ta_arena_malloc(r.a, cases[i].request, STREAM(1));
    REQUIRE(b);
    if (b->size != cases[i].block || b->segment->size != cases[i].segment || b->segment->pool != cases[i].pool)
      fprintf(stderr, "  a %zu-byte request: a %zu-byte block of a %zu-byte segment in pool %d\n", cases[i].request,
              b->size, b->segment->size, b->segment->pool);
    CHECK_EQ(b->size, cases[i].block);
    CHECK_EQ(b->segment->size, cases[i].segment);
    CHECK_EQ(b->segment->pool, cases[i].pool);
    CHECK_EQ(b->state, TA_BLOCK_LIVE);
    CHECK_EQ(b->addr, b->segment->addr); /* a fresh segment serves from its start */
    CHECK(b->stream == STREAM(1));
    CHECK_ARENA(r);
    ta_arena_free(r.a, b);
    CHECK_ARENA(r);
    CHECK_EQ(ta_arena_release_cached(r.a), cases[i].segment);
    CHECK_EQ(r.s->device_bytes, 0);
    arena_rig_down(&r);
  }
}

TEST(a_segment_is_carved_from_its_start) {
  arena_rig r;
  UP(r, 0);
  ta_block *b[4];
  for (int i = 0; i < 4; i++) REQUIRE((b[i] = ta_arena_malloc(r.a, 1000 * (size_t)(i + 1), STREAM(0))));
  for (int i = 1; i < 4; i++) {
    CHECK(b[i]->segment == b[0]->segment);
    CHECK_EQ(b[i]->addr, b[i - 1]->addr + b[i - 1]->size);
  }
  CHECK_EQ(r.s->allocs, 1);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(best_fit_takes_the_smallest_free_block_that_fits) {
  arena_rig r;
  UP(r, 0);
  /* Holes of 4, 1 and 2 KiB between live blocks, and the segment's free end. */
  size_t sizes[] = {4 * KiB, 512, 1 * KiB, 512, 2 * KiB, 512};
  ta_block *b[6];
  for (int i = 0; i < 6; i++) REQUIRE((b[i] = ta_arena_malloc(r.a, sizes[i], STREAM(0))));
  uintptr_t hole4 = b[0]->addr, hole1 = b[2]->addr, hole2 = b[4]->addr, end = b[5]->addr + 512;
  ta_arena_free(r.a, b[0]);
  ta_arena_free(r.a, b[2]);
  ta_arena_free(r.a, b[4]);
  CHECK_ARENA(r);
  ta_block *x = ta_arena_malloc(r.a, 1536, STREAM(0));
  REQUIRE(x);
  CHECK_EQ(x->addr, hole2); /* 2 KiB: the smallest that fits; 512 B split off behind it */
  CHECK_EQ(x->size, 1536);
  CHECK_EQ(x->next->state, TA_BLOCK_FREE);
  CHECK_EQ(x->next->size, 512);
  ta_block *y = ta_arena_malloc(r.a, 1 * KiB, STREAM(0));
  REQUIRE(y);
  CHECK_EQ(y->addr, hole1);
  ta_block *z = ta_arena_malloc(r.a, 3 * KiB, STREAM(0));
  REQUIRE(z);
  CHECK_EQ(z->addr, hole4);
  ta_block *w = ta_arena_malloc(r.a, 5 * KiB, STREAM(0));
  REQUIRE(w);
  CHECK_EQ(w->addr, end);
  ta_block *v = ta_arena_malloc(r.a, 512, STREAM(0)); /* exact fits: the 512 B behind x, then the 1 KiB behind z */
  REQUIRE(v);
  CHECK_EQ(v->addr, hole2 + 1536);
  CHECK_EQ(r.s->allocs, 1);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(small_blocks_split_off_any_rest_of_512_bytes) {
  arena_rig r;
  UP(r, 0);
  ta_block *a = ta_arena_malloc(r.a, 1 * MiB, STREAM(0));
  ta_block *b = ta_arena_malloc(r.a, 1 * MiB - 512, STREAM(0));
  REQUIRE(a && b);
  CHECK_EQ(b->size, 1 * MiB - 512);
  CHECK_ARENA(r);
  ta_block *c = ta_arena_malloc(r.a, 512, STREAM(0)); /* the last 512 B, exactly */
  REQUIRE(c);
  CHECK(c->segment == a->segment && !c->next);
  CHECK_EQ(r.s->allocs, 1);
  CHECK_EQ(r.s->blocks, 3);
  CHECK_EQ(r.s->inactive_split, 0);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(large_blocks_split_only_past_1_MiB) {
  arena_rig r;
  UP(r, 0);
  ta_block *a = ta_arena_malloc(r.a, 9 * MiB, STREAM(0));
  REQUIRE(a);
  CHECK_EQ(a->segment->size, 20 * MiB);
  REQUIRE(a->next);
  CHECK_EQ(a->next->size, 11 * MiB);
  /* 10 MiB from the 11 MiB free block: a rest of 1 MiB stays with it. */
  ta_block *b = ta_arena_malloc(r.a, 10 * MiB, STREAM(0));
  REQUIRE(b);
  CHECK(b->segment == a->segment);
  CHECK_EQ(b->size, 11 * MiB);
  ta_arena_free(r.a, b);
  /* A rest of 1 MiB + 512 is split off. */
  b = ta_arena_malloc(r.a, 10 * MiB - 512, STREAM(0));
  REQUIRE(b);
  CHECK_EQ(b->size, 10 * MiB - 512);
  CHECK(b->next && b->next->state == TA_BLOCK_FREE && b->next->size == 1 * MiB + 512);
  CHECK_EQ(r.s->allocs, 1);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(freed_neighbours_merge_in_any_order) {
  static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (int o = 0; o < 6; o++) {
    arena_rig r;
    UP(r, 0);
    ta_block *b[3];
    for (int i = 0; i < 3; i++) REQUIRE((b[i] = ta_arena_malloc(r.a, 4 * KiB, STREAM(0))));
    ta_segment *seg = b[0]->segment;
    for (int i = 0; i < 3; i++) {
      ta_arena_free(r.a, b[orders[o][i]]);
      CHECK_ARENA(r);
    }
    CHECK(seg->first == seg->last);
    CHECK_EQ(seg->first->size, seg->size);
    CHECK_EQ(seg->first->state, TA_BLOCK_FREE);
    CHECK_EQ(r.s->blocks, 1);
    arena_rig_down(&r);
  }
}

TEST(a_free_block_serves_only_its_own_stream) {
  arena_rig r;
  UP(r, 0);
  ta_block *a = ta_arena_malloc(r.a, 4 * KiB, STREAM(1));
  REQUIRE(a);
  ta_segment *seg_a = a->segment;
  ta_arena_free(r.a, a);
  ta_block *b = ta_arena_malloc(r.a, 4 * KiB, STREAM(2));
  ta_block *n = ta_arena_malloc(r.a, 4 * KiB, NULL); /* the default stream is a stream too */
  REQUIRE(b && n);
  CHECK(b->segment != seg_a && n->segment != seg_a && n->segment != b->segment);
  CHECK(b->stream == STREAM(2) && n->stream == NULL);
  CHECK_EQ(r.s->allocs, 3);
  CHECK_EQ(r.a->nstreams, 3);
  a = ta_arena_malloc(r.a, 4 * KiB, STREAM(1));
  REQUIRE(a);
  CHECK(a->segment == seg_a);
  CHECK_EQ(r.s->allocs, 3);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(the_pools_keep_their_blocks_apart) {
  arena_rig r;
  UP(r, 0);
  ta_block *small = ta_arena_malloc(r.a, 512, STREAM(0)); /* leaves 2 MiB - 512 free in the small pool */
  REQUIRE(small);
  ta_block *large = ta_arena_malloc(r.a, 1 * MiB + 512, STREAM(0));
  REQUIRE(large);
  CHECK(large->segment != small->segment);
  CHECK_EQ(large->segment->pool, TA_POOL_LARGE);
  ta_block *again = ta_arena_malloc(r.a, 512, STREAM(0)); /* not from the large segment's free 18.5 MiB */
  REQUIRE(again);
  CHECK(again->segment == small->segment);
  CHECK_EQ(r.s->allocs, 2);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(release_gives_back_free_segments_and_the_streams_they_emptied) {
  arena_rig r;
  UP(r, 0);
  ta_block *small[3], *large[3];
  for (int i = 0; i < 3; i++) {
    REQUIRE((small[i] = ta_arena_malloc(r.a, 512, STREAM(i))));
    REQUIRE((large[i] = ta_arena_malloc(r.a, 12 * MiB, STREAM(i))));
  }
  CHECK_EQ(ta_arena_reserved(r.a), 3 * (2 + 12) * MiB);
  ta_arena_free(r.a, small[1]);
  ta_arena_free(r.a, large[1]);
  ta_arena_free(r.a, large[0]);
  CHECK_ARENA(r);
  CHECK_EQ(ta_arena_release_cached(r.a), (2 + 12 + 12) * MiB);
  CHECK_EQ(r.a->nstreams, 2);
  CHECK_EQ(ta_arena_find_stream(r.a, STREAM(1)), r.a->nstreams); /* stream 1 had nothing left */
  CHECK(ta_arena_find_stream(r.a, STREAM(0)) < r.a->nstreams);
  CHECK(ta_arena_find_stream(r.a, STREAM(2)) < r.a->nstreams);
  CHECK_EQ(ta_arena_reserved(r.a), (2 + 2 + 12) * MiB);
  CHECK_EQ(r.s->device_bytes, ta_arena_reserved(r.a));
  CHECK_ARENA(r);
  CHECK_EQ(ta_arena_release_cached(r.a), 0); /* nothing more is free */
  ta_arena_free(r.a, small[0]);
  ta_arena_free(r.a, small[2]);
  ta_arena_free(r.a, large[2]);
  CHECK_EQ(ta_arena_release_cached(r.a), (2 + 2 + 12) * MiB);
  CHECK_EQ(r.a->nstreams, 0);
  CHECK_EQ(r.s->nlive, 0);
  CHECK_EQ(r.s->blocks, 0);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(thousands_of_streams_come_and_go) {
  enum { STREAMS = 2000 };
  static ta_block *b[STREAMS];
  arena_rig r;
  UP(r, 0);
  for (int i = 0; i < STREAMS; i++) REQUIRE((b[i] = ta_arena_malloc(r.a, 512, STREAM(i))));
  CHECK_EQ(r.a->nstreams, STREAMS);
  for (int i = 0; i < STREAMS; i++) CHECK(r.a->streams[ta_arena_find_stream(r.a, STREAM(i))].stream == STREAM(i));
  CHECK_ARENA(r);
  for (int i = 0; i < STREAMS; i++)
    if (i % 10) ta_arena_free(r.a, b[i]);
  ta_arena_release_cached(r.a);
  CHECK_EQ(r.a->nstreams, STREAMS / 10);
  CHECK(r.a->cap_streams < STREAMS); /* the arrays shrank with the entries */
  for (int i = 0; i < STREAMS; i++) {
    size_t k = ta_arena_find_stream(r.a, STREAM(i));
    CHECK(i % 10 ? k == r.a->nstreams : k < r.a->nstreams && r.a->streams[k].stream == STREAM(i));
  }
  CHECK_ARENA(r);
  for (int i = 0; i < STREAMS; i += 10) { /* each stream's block is still served from its own segment */
    ta_block *again = ta_arena_malloc(r.a, 512, STREAM(i));
    REQUIRE(again);
    CHECK(again->segment == b[i]->segment);
  }
  CHECK_EQ(r.s->allocs, STREAMS);
  arena_rig_down(&r);
}

TEST(the_device_saying_no_leaves_no_stream_behind) {
  arena_rig r;
  UP(r, 0);
  r.s->device_limit = 1 * MiB; /* not even a small segment */
  CHECK(!ta_arena_malloc(r.a, 512, STREAM(0)));
  CHECK_EQ(r.a->nstreams, 0);
  CHECK_ARENA(r);
  r.s->device_limit = 2 * MiB;
  ta_block *b = ta_arena_malloc(r.a, 512, STREAM(0));
  REQUIRE(b);
  CHECK(!ta_arena_malloc(r.a, 4 * MiB, STREAM(0))); /* its stream keeps its entry: it has a segment */
  CHECK(!ta_arena_malloc(r.a, 512, STREAM(1)));
  CHECK_EQ(r.a->nstreams, 1);
  CHECK_ARENA(r);
  ta_arena_free(r.a, b);
  ta_arena_release_cached(r.a);
  CHECK_EQ(r.a->nstreams, 0);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(without_a_descriptor_the_block_stays_whole) {
  arena_rig r;
  UP(r, 0);
  r.s->fail_block_new = 2; /* the segment's block is made; the rest's descriptor is not */
  ta_block *b = ta_arena_malloc(r.a, 512, STREAM(0));
  REQUIRE(b);
  CHECK_EQ(b->size, 2 * MiB);
  CHECK(!b->next && !b->prev);
  CHECK_ARENA(r);
  ta_arena_free(r.a, b);
  b = ta_arena_malloc(r.a, 1 * MiB, STREAM(0));
  REQUIRE(b);
  CHECK_EQ(b->size, 1 * MiB); /* descriptors again: split */
  ta_segment *seg = b->segment;
  ta_arena_free(r.a, b);
  r.s->fail_block_new = 1;
  CHECK(!ta_arena_claim(r.a, seg, seg->addr + 4 * KiB, 4 * KiB)); /* a claim needs two: it changes nothing */
  CHECK(seg->first == seg->last);
  r.s->fail_block_new = 0;
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(without_host_memory_a_request_fails_and_leaves_nothing) {
  /* Each host allocation a first request makes, refused in turn. */
  for (long nth = 1; nth <= 12; nth++) {
    arena_rig r;
    UP(r, 0);
    host_fail_in(nth);
    ta_block *b = ta_arena_malloc(r.a, 512, STREAM(7));
    ta_block *c = ta_arena_malloc(r.a, 512, STREAM(8));
    host_fail_in(0);
    if (!b) CHECK_EQ(ta_arena_find_stream(r.a, STREAM(7)), r.a->nstreams);
    if (!c) CHECK_EQ(ta_arena_find_stream(r.a, STREAM(8)), r.a->nstreams);
    if (arena_check(r.a, r.s)) fprintf(stderr, "  with allocation %ld refused\n", nth);
    CHECK_ARENA(r);
    if (b) ta_arena_free(r.a, b);
    if (c) ta_arena_free(r.a, c);
    ta_arena_release_cached(r.a);
    CHECK_EQ(r.a->nstreams, 0);
    arena_rig_down(&r);
  }
}

TEST(unsplit_blocks_are_whole_segments) {
  arena_rig r;
  UP(r, TA_POLICY_NO_SPLIT);
  ta_block *a = ta_arena_malloc(r.a, 512, STREAM(0));
  ta_block *b = ta_arena_malloc(r.a, 3 * MiB, STREAM(0));
  REQUIRE(a && b);
  CHECK_EQ(a->size, 2 * MiB);
  CHECK_EQ(a->segment->size, 2 * MiB);
  CHECK_EQ(b->size, 4 * MiB);
  CHECK_EQ(b->segment->size, 4 * MiB);
  ta_arena_free(r.a, a);
  ta_block *c = ta_arena_malloc(r.a, 512, STREAM(0));
  REQUIRE(c);
  CHECK(c == a && c->size == 2 * MiB); /* reused whole */
  CHECK_EQ(r.s->blocks, 2);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}

TEST(a_claim_makes_exactly_its_range_live) {
  arena_rig r, other;
  UP(r, 0);
  UP(other, 0);
  ta_block *a = ta_arena_malloc(r.a, 9 * MiB, STREAM(0));
  REQUIRE(a);
  ta_segment *seg = a->segment;
  ta_arena_free(r.a, a);
  ta_block *c = ta_arena_claim(r.a, seg, seg->addr + 1 * MiB, 2 * MiB);
  REQUIRE(c);
  CHECK_EQ(c->addr, seg->addr + 1 * MiB);
  CHECK_EQ(c->size, 2 * MiB);
  CHECK_EQ(c->state, TA_BLOCK_LIVE);
  CHECK(c->prev && c->prev->state == TA_BLOCK_FREE && c->prev->size == 1 * MiB);
  CHECK(c->next && c->next->state == TA_BLOCK_FREE && c->next->size == 17 * MiB);
  CHECK_ARENA(r);
  /* Not free, not whole 512-byte units, not inside, not its arena's: nothing. */
  CHECK(!ta_arena_claim(r.a, seg, seg->addr + 2 * MiB, 4 * MiB));
  CHECK(!ta_arena_claim(r.a, seg, seg->addr + 512, 1 * MiB));
  CHECK(!ta_arena_claim(r.a, seg, seg->addr, 0));
  CHECK(!ta_arena_claim(r.a, seg, seg->addr, 1000));
  CHECK(!ta_arena_claim(r.a, seg, seg->addr + 19 * MiB, 2 * MiB));
  CHECK(!ta_arena_claim(r.a, seg, seg->addr - 512, 1024));
  CHECK(!ta_arena_claim(other.a, seg, seg->addr, 512));
  CHECK_ARENA(r);
  /* The free block before it, exactly, and the end of the one after. */
  ta_block *head = ta_arena_claim(r.a, seg, seg->addr, 1 * MiB);
  ta_block *tail = ta_arena_claim(r.a, seg, seg->addr + 19 * MiB, 1 * MiB);
  REQUIRE(head && tail);
  CHECK(head == seg->first && tail == seg->last);
  CHECK_ARENA(r);
  ta_arena_free(r.a, c);
  ta_arena_free(r.a, tail);
  ta_arena_free(r.a, head);
  CHECK(seg->first == seg->last);
  CHECK_ARENA(r);
  arena_rig_down(&other);
  arena_rig_down(&r);
}

TEST(destroy_gives_back_free_segments_and_leaves_live_ones) {
  arena_rig r;
  UP(r, 0);
  ta_block *keep = ta_arena_malloc(r.a, 4 * KiB, STREAM(0));
  ta_block *gone = ta_arena_malloc(r.a, 12 * MiB, STREAM(1));
  REQUIRE(keep && gone);
  ta_arena_free(r.a, gone);
  ta_arena_destroy(r.a);
  r.a = NULL;
  CHECK_EQ(r.s->releases, 1);
  CHECK_EQ(r.s->nlive, 1); /* the live block's segment, for the layer's teardown */
  CHECK(r.s->live[0] == keep->segment);
  CHECK_EQ(r.s->misuse, 0);
  arena_rig_down(&r);
}

/* ------------------------------------------------------------------------
 * A random run: requests, frees, releases and claims on a few streams,
 * every invariant recounted after each.
 * ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) { return check_xorshift64star(&rng_state); }

static size_t random_request(void) {
  switch (rnd() % 5) {
  case 0: return rnd() % 4096;
  case 1: return 512 * (1 + rnd() % 2048);  /* up to the small pool's 1 MiB */
  case 2: return 1 * MiB + rnd() % (9 * MiB); /* the large pool's shared segments */
  case 3: return 10 * MiB + rnd() % (30 * MiB);
  default: return (size_t)1 << (9 + rnd() % 14);
  }
}

TEST(random_requests_and_frees_keep_every_invariant) {
  enum { STEPS = 4000, MAX_LIVE = 200 };
  ta_block *live[MAX_LIVE];
  size_t n = 0, problems = 0;
  arena_rig r;
  UP(r, 0);
  for (int step = 0; step < STEPS && problems < 3; step++) {
    unsigned op = (unsigned)(rnd() % 16);
    cudaStream_t stream = rnd() % 5 ? STREAM(rnd() % 4) : NULL;
    if (op < 8 && n < MAX_LIVE) {
      ta_block *b = ta_arena_malloc(r.a, random_request(), stream);
      if (b) live[n++] = b;
    } else if (op < 14 && n > 0) {
      size_t k = rnd() % n;
      ta_arena_free(r.a, live[k]);
      live[k] = live[--n];
    } else if (op == 14) {
      ta_arena_release_cached(r.a);
    } else if (n < MAX_LIVE && r.s->nlive) { /* a claim of some free range, as a pool's checkpoint does */
      ta_segment *seg = r.s->live[rnd() % r.s->nlive];
      for (ta_block *f = seg->first; f; f = f->next)
        if (f->state == TA_BLOCK_FREE && f->size >= 1024) {
          size_t units = f->size / 512, skip = rnd() % units, take = 1 + rnd() % (units - skip);
          ta_block *c = ta_arena_claim(r.a, seg, f->addr + skip * 512, take * 512);
          if (c && (c->addr != f->addr + skip * 512 || c->size != take * 512)) problems++;
          if (c) live[n++] = c;
          break;
        }
    }
    int found = arena_check(r.a, r.s);
    if (found) fprintf(stderr, "  after step %d (op %u)\n", step, op);
    problems += found > 0;
  }
  CHECK_EQ(problems, 0);
  while (n) ta_arena_free(r.a, live[--n]);
  ta_arena_release_cached(r.a);
  CHECK_EQ(r.s->nlive, 0);
  CHECK_EQ(r.s->blocks, 0);
  CHECK_EQ(r.s->device_bytes, 0);
  CHECK_EQ(r.a->nstreams, 0);
  CHECK_ARENA(r);
  arena_rig_down(&r);
}
