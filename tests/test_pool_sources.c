/* Pools with their own allocator (torch.cuda.MemPool(allocator=...)),
 * use_on_oom and no_split, on the simulated device: torchalloc carves,
 * caches, counts and caps the memory of a pool's source, hands it back
 * through the source, and lends a use_on_oom pool's cached blocks to
 * requests the device refused, as PyTorch's allocator does. */
#include "sim.h"

#define POOL 0, 5
#define OTHER_POOL 0, 6

/* A stand-in for a user's allocator (ncclMemAlloc, cudaMallocManaged):
 * addresses far from the sim's, counted. */
typedef struct fake_source {
  uintptr_t next;
  int allocs, frees, releases;
  size_t outstanding;
  int refuse; /* say no to every request */
} fake_source;

static void *fake_alloc(void *ctx, size_t size, int device, cudaStream_t stream) {
  (void)device, (void)stream;
  fake_source *f = ctx;
  if (f->refuse) return NULL;
  uintptr_t p = f->next;
  f->next += size + 2 * MiB;
  f->allocs++;
  f->outstanding += size;
  return (void *)p;
}

static void fake_free(void *ctx, void *ptr, size_t size, int device, cudaStream_t stream) {
  (void)ptr, (void)device, (void)stream;
  fake_source *f = ctx;
  f->frees++;
  f->outstanding -= size;
}

static void fake_release(void *ctx) { ((fake_source *)ctx)->releases++; }

static torchalloc_pool_source source_of(fake_source *f) {
  f->next = (uintptr_t)1 << 62;
  return (torchalloc_pool_source){.alloc = fake_alloc, .free = fake_free, .release = fake_release, .ctx = f};
}

TEST(a_pool_with_its_own_allocator_carves_and_caches_its_memory) {
  REQUIRE(sim_reset("") == 0);
  fake_source f = {0};
  torchalloc_pool_source src = source_of(&f);
  CHECK_EQ(torchalloc_pool_create(0, POOL, &src), 1);
  void *a = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  void *b = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  REQUIRE(a && b);
  CHECK_EQ(f.allocs, 1); /* two small blocks packed in one 2 MiB segment, as PyTorch packs them */
  CHECK((uintptr_t)a >= ((uintptr_t)1 << 62));
  void *c = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  REQUIRE(c);
  CHECK_EQ(f.allocs, 2);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.reserved_bytes[ALL].current, (int64_t)(4 * MiB)); /* counted as device memory is */
  CHECK_EQ(s.allocated_bytes[ALL].current, (int64_t)(3 * MiB));
  CHECK_INVARIANTS();
  void *d = torchalloc_malloc(1 * MiB, 0, S0); /* outside the pool: the device, not the source */
  REQUIRE(d);
  CHECK_EQ(f.allocs, 2);
  torchalloc_free(d, 1 * MiB, 0, S0);
  torchalloc_free(a, 1 * MiB, 0, S0);
  torchalloc_free(b, 1 * MiB, 0, S0);
  CHECK_EQ(torchalloc_pool_empty(0, POOL), 0); /* still used: its cache stays */
  CHECK_EQ(f.frees, 0);
  CHECK_EQ(torchalloc_pool_release(0, POOL), 0);
  CHECK_EQ(torchalloc_pool_empty(0, POOL), (int64_t)(2 * MiB)); /* the free segment goes back, c's stays */
  CHECK_EQ(f.frees, 1);
  CHECK_EQ(f.releases, 0); /* c still holds memory of the source */
  torchalloc_free(c, 1 * MiB, 0, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(f.frees, 2);
  CHECK_EQ(f.outstanding, 0);
  CHECK_EQ(f.releases, 1); /* pool gone, nothing of the source left */
  CHECK_EQ(torchalloc_pool_use_count(0, POOL), -1);
  CHECK_INVARIANTS();
}

TEST(the_memory_fraction_caps_a_source_and_a_refusing_source_is_an_oom) {
  REQUIRE(sim_reset("sim_capacity:1GiB") == 0);
  fake_source f = {0};
  torchalloc_pool_source src = source_of(&f);
  CHECK_EQ(torchalloc_pool_create(0, POOL, &src), 1);
  torchalloc_set_memory_fraction(64.0 / 1024, 0);
  void *a = torchalloc_pool_malloc(40 * MiB, 0, S0, POOL);
  REQUIRE(a);
  CHECK(torchalloc_pool_malloc(40 * MiB, 0, S0, POOL) == NULL); /* 80 MiB > the 64 MiB cap */
  CHECK_EQ(f.allocs, 1);
  torchalloc_set_memory_fraction(1.0, 0);
  f.refuse = 1;
  CHECK(torchalloc_pool_malloc(40 * MiB, 0, S0, POOL) == NULL);
  CHECK_EQ(stats0().num_ooms, 2);
  torchalloc_free(a, 40 * MiB, 0, S0);
  CHECK_INVARIANTS();
  torchalloc_teardown(); /* the pool still has a user: its source (on this stack) is given back now */
  CHECK_EQ(f.frees, 1);
  CHECK_EQ(f.releases, 1);
}

TEST(a_source_is_set_once_and_given_back_at_teardown) {
  REQUIRE(sim_reset("") == 0);
  fake_source f = {0}, g = {0};
  torchalloc_pool_source src = source_of(&f), other = source_of(&g);
  CHECK_EQ(torchalloc_pool_create(0, POOL, &src), 1);
  CHECK_EQ(torchalloc_pool_create(0, POOL, &other), -1); /* its allocator cannot be replaced */
  CHECK(strstr(torchalloc_last_error(), "exists already") != NULL);
  CHECK_EQ(torchalloc_pool_create(0, POOL, NULL), 2); /* another user of it, as retain */
  torchalloc_pool_source half = {.alloc = fake_alloc, .ctx = &g};
  CHECK_EQ(torchalloc_pool_create(0, OTHER_POOL, &half), -1);
  void *a = torchalloc_pool_malloc(4 * MiB, 0, S0, POOL);
  REQUIRE(a);
  torchalloc_teardown(); /* live or not, the source's memory goes back to it */
  CHECK_EQ(f.frees, f.allocs);
  CHECK_EQ(f.outstanding, 0);
  CHECK_EQ(f.releases, 1);
  CHECK_EQ(g.allocs + g.releases, 0);
}

TEST(a_use_on_oom_pool_lends_its_cached_blocks_to_refused_requests) {
  REQUIRE(sim_reset("sim_capacity:100MiB") == 0);
  CHECK_EQ(torchalloc_pool_retain(0, POOL), 1);
  CHECK_EQ(torchalloc_pool_retain(0, OTHER_POOL), 1);
  CHECK_EQ(torchalloc_pool_flags(0, POOL, TORCHALLOC_POOL_USE_ON_OOM, 0), (int)TORCHALLOC_POOL_USE_ON_OOM);
  CHECK_EQ(torchalloc_pool_flags(0, POOL, 0, 0), (int)TORCHALLOC_POOL_USE_ON_OOM);
  void *other = torchalloc_pool_malloc(40 * MiB, 0, S0, OTHER_POOL);
  void *mine = torchalloc_pool_malloc(40 * MiB, 0, S0, POOL);
  REQUIRE(other && mine);
  torchalloc_free(other, 40 * MiB, 0, S0);
  torchalloc_free(mine, 40 * MiB, 0, S0);
  void *c = torchalloc_try_malloc(30 * MiB, 0, S0); /* 20 MiB left on the device */
  CHECK(c == mine); /* the use_on_oom pool's cached block, not OTHER_POOL's */
  CHECK(torchalloc_try_malloc(30 * MiB, 0, S0) == NULL); /* 10 MiB left of it, and no new segment for it */
  void *e = torchalloc_pool_malloc(4 * MiB, 0, S0, POOL); /* the pool's own requests still get its blocks */
  CHECK(e != NULL);
  torchalloc_free(c, 30 * MiB, 0, S0);
  torchalloc_free(e, 4 * MiB, 0, S0);
  CHECK_EQ(torchalloc_pool_release(0, POOL), 0); /* no users: no longer lent */
  CHECK(torchalloc_try_malloc(30 * MiB, 0, S0) != NULL); /* its segment went back in the retry instead */
  CHECK_EQ(torchalloc_pool_flags(0, 9, 9, 0, 0), -1);
  CHECK_EQ(torchalloc_pool_flags(0, OTHER_POOL, 64, 0), -1);
  CHECK_INVARIANTS();
}

TEST(a_no_split_pool_gives_each_block_a_segment_of_its_own) {
  REQUIRE(sim_reset("") == 0);
  CHECK_EQ(torchalloc_pool_retain(0, POOL), 1);
  CHECK_EQ(torchalloc_pool_retain(0, OTHER_POOL), 1);
  CHECK_EQ(torchalloc_pool_flags(0, POOL, TORCHALLOC_POOL_NO_SPLIT, 0), (int)TORCHALLOC_POOL_NO_SPLIT);
  void *p[4];
  for (int i = 0; i < 2; i++) {
    p[i] = torchalloc_pool_malloc(4 * MiB, 0, S0, POOL);
    p[2 + i] = torchalloc_pool_malloc(4 * MiB, 0, S0, OTHER_POOL);
    REQUIRE(p[i] && p[2 + i]);
  }
  torchalloc_segment_info segs[8];
  torchalloc_block_info blocks[16];
  size_t nseg = 0, nblk = 0;
  REQUIRE(torchalloc_snapshot(0, segs, 8, blocks, 16, &nseg, &nblk) == 0);
  int split_segments = 0, unsplit_segments = 0;
  for (size_t i = 0; i < nseg; i++) {
    if (segs[i].pool_id[1] == 5) {
      unsplit_segments++;
      CHECK_EQ(segs[i].nblocks, 1);
      CHECK_EQ(segs[i].size, 4 * MiB);
    } else if (segs[i].pool_id[1] == 6) {
      split_segments++;
      CHECK_EQ(segs[i].nblocks, 3); /* a 20 MiB segment: two blocks and the rest */
    }
  }
  CHECK_EQ(unsplit_segments, 2);
  CHECK_EQ(split_segments, 1);
  for (int i = 0; i < 4; i++) torchalloc_free(p[i], 4 * MiB, 0, S0);
  void *again = torchalloc_pool_malloc(2 * MiB, 0, S0, POOL); /* a whole cached segment, unsplit */
  CHECK(again == p[0] || again == p[1]);
  torchalloc_free(again, 2 * MiB, 0, S0);
  CHECK_INVARIANTS();
}
