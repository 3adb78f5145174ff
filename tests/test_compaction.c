/* Compaction before failing (the out-of-memory path): a request is refused
 * only when it cannot fit. Before failing, every whole free granule of
 * every pool and stream goes back (after a synchronize) and the request is
 * mapped from what is then unreserved, so a refusal means that what live
 * blocks pin (reserved after that release) plus the request, in whole
 * handles, exceeds the device or the memory fraction. Random layouts on
 * the simulated device, under the default (reclaim) and compact, with the
 * device's capacity or a memory fraction as the cap. */
#include <stdlib.h>

#include "sim.h"
#include "torchalloc_sim.h"

/* xorshift: the same layouts every run */
static uint64_t next_random(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}

#define MAX_BLOCKS 512

typedef struct layout {
  void *ptr[MAX_BLOCKS];
  size_t size[MAX_BLOCKS];
  cudaStream_t stream[MAX_BLOCKS];
  int n;
} layout;

/* Sizes of a training step: small tensors (the small pool), activations of
 * a few MiB and the odd large one; on two streams. */
static size_t random_size(uint64_t *rng) {
  uint64_t r = next_random(rng);
  switch (r % 4) {
  case 0: return (size_t)(r >> 8) % (512 * KiB) + 512;
  case 1: return (size_t)(r >> 8) % (3 * MiB) + MiB;
  case 2: return (size_t)(r >> 8) % (12 * MiB) + 2 * MiB;
  default: return (size_t)(r >> 8) % (40 * MiB) + 8 * MiB;
  }
}

/* Fill until the device says no, then free a random half. */
static void fill_then_free_half(layout *l, uint64_t *rng) {
  l->n = 0;
  while (l->n < MAX_BLOCKS) {
    size_t size = random_size(rng);
    cudaStream_t stream = next_random(rng) % 3 ? S0 : S1;
    void *p = torchalloc_try_malloc(size, 0, stream);
    if (!p) break;
    l->ptr[l->n] = p, l->size[l->n] = size, l->stream[l->n] = stream;
    l->n++;
  }
  for (int i = 0; i < l->n; i++) {
    if (next_random(rng) % 2) continue;
    torchalloc_free(l->ptr[i], l->size[i], 0, l->stream[i]);
    l->ptr[i] = NULL;
  }
}

/* Bytes of the device's 2 MiB granules that live blocks touch: what any
 * allocator mapping 2 MiB pages must keep (PyTorch's expandable segments
 * do); the blocks are sorted by address first. */
static int by_address(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

static size_t pinned_granules(const layout *l) {
  static uintptr_t span[MAX_BLOCKS][2];
  int n = 0;
  for (int i = 0; i < l->n; i++)
    if (l->ptr[i]) {
      span[n][0] = (uintptr_t)l->ptr[i] / (2 * MiB);
      span[n][1] = ((uintptr_t)l->ptr[i] + l->size[i] - 1) / (2 * MiB);
      n++;
    }
  qsort(span, (size_t)n, sizeof span[0], by_address);
  size_t granules = 0;
  uintptr_t counted_to = 0; /* granules below this one are counted */
  for (int i = 0; i < n; i++) {
    uintptr_t lo = span[i][0] > counted_to ? span[i][0] : counted_to;
    if (span[i][1] + 1 > lo) granules += span[i][1] + 1 - lo, counted_to = span[i][1] + 1;
  }
  return granules * 2 * MiB;
}

static void free_all(layout *l) {
  for (int i = 0; i < l->n; i++)
    if (l->ptr[i]) torchalloc_free(l->ptr[i], l->size[i], 0, l->stream[i]);
  l->n = 0;
}

/* One layout and one request too large for any free block: served, or
 * refused only when what live blocks pin plus the request exceeds the cap. */
static void check_one(const char *conf, double fraction, size_t cap, uint64_t seed, int *refused) {
  REQUIRE(sim_reset(conf) == 0);
  if (fraction > 0) torchalloc_set_memory_fraction(fraction, 0);
  uint64_t rng = seed;
  static layout l;
  fill_then_free_half(&l, &rng);
  REQUIRE(l.n >= 4);
  /* Requests from a quarter of what is not allocated to all of it: the
   * smaller ones fit, the largest cannot, and somewhere between lies the
   * boundary the rule draws. */
  for (int k = 2; k <= 8; k++) {
    torchalloc_stats before = stats0();
    size_t room = cap - (size_t)before.allocated_bytes[ALL].current;
    size_t ask = room / 8 * (size_t)k / MiB * MiB;
    void *p = torchalloc_try_malloc(ask, 0, S0);
    torchalloc_stats after = stats0();
    if (p) {
      CHECK(after.reserved_bytes[ALL].current <= (int64_t)cap);
      torchalloc_free(p, ask, 0, S0);
      continue;
    }
    /* Refused: the live blocks' 2 MiB granules and the request's did not
     * fit under the cap together. */
    size_t pinned = pinned_granules(&l), need = (ask + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
    if (pinned + need <= cap)
      fprintf(stderr, "  %s seed %llu: refused %zu MiB with %zu MiB pinned of a %zu MiB cap\n", conf,
              (unsigned long long)seed, ask >> 20, pinned >> 20, cap >> 20);
    CHECK(pinned + need > cap);
    CHECK(after.num_alloc_retries > before.num_alloc_retries); /* it was the OOM path that said no */
    (*refused)++;
  }
  CHECK_INVARIANTS();
  free_all(&l);
  CHECK_INVARIANTS();
}

TEST(a_request_is_refused_only_when_it_cannot_fit_beside_the_live_blocks) {
  static const char *modes[] = {"expandable:reclaim", "expandable:compact"};
  int refused = 0;
  for (int m = 0; m < 2; m++) {
    char conf[128];
    snprintf(conf, sizeof conf, "%s,sim_capacity:512MiB", modes[m]);
    for (uint64_t seed = 1; seed <= 12; seed++) check_one(conf, 0, 512 * MiB, seed * 0x9E3779B97F4A7C15ull, &refused);
    snprintf(conf, sizeof conf, "%s,sim_capacity:1GiB", modes[m]);
    for (uint64_t seed = 1; seed <= 12; seed++) /* a fraction: 2 MiB handles from then on */
      check_one(conf, 0.375, 384 * MiB, seed * 0xD1B54A32D192ED03ull, &refused);
  }
  CHECK(refused >= 24); /* the boundary was reached: the largest requests cannot fit */
}

/* The scenario of PyTorch's expandable segments: a 64 MiB device, nine
 * 6 MiB blocks, every other one freed, then 32 MiB asked. The holes hold
 * no whole 8 MiB handle, but whole 2 MiB granules: the large handles
 * around them are replaced by 2 MiB ones and the request is served, the
 * live blocks' bytes where they were (the simulated device checks every
 * copy's ranges; fuzz_api's canaries follow the copies). */
TEST(the_default_serves_what_2mib_pages_would_in_8mib_handles) {
  REQUIRE(sim_reset("expandable:reclaim,sim_capacity:64MiB") == 0);
  void *b[9];
  for (int i = 0; i < 9; i++) REQUIRE((b[i] = torchalloc_malloc(6 * MiB, 0, S0)) != NULL);
  for (int i = 1; i < 9; i += 2) torchalloc_free(b[i], 6 * MiB, 0, S0);
  uint64_t phys_before;
  REQUIRE(torchalloc_sim_physical(0, (char *)b[2] + 5 * MiB, &phys_before) == 0);
  void *p = torchalloc_try_malloc(32 * MiB, 0, S0);
  CHECK(p != NULL);
  torchalloc_stats s = stats0();
  CHECK(s.reserved_bytes[ALL].current <= (int64_t)(64 * MiB));
  char why[256] = "";
  CHECK_EQ(torchalloc_sim_capture_violations(0, why, sizeof why), 0);
  uint64_t phys_after; /* b[2]'s last MiB lay in a handle that held a free 2 MiB granule: it moved */
  CHECK(torchalloc_sim_physical(0, (char *)b[2] + 5 * MiB, &phys_after) == 0 && phys_after != phys_before);
  CHECK_INVARIANTS();
  if (p) torchalloc_free(p, 32 * MiB, 0, S0);
  for (int i = 0; i < 9; i += 2) torchalloc_free(b[i], 6 * MiB, 0, S0);
  CHECK(torchalloc_empty_cache(0) >= 0);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  CHECK_INVARIANTS();
}

/* Under `expandable:off` (PyTorch's segments) nothing is mapped in handles:
 * the same scenario runs out, as it does under PyTorch's allocator. */
TEST(ordinary_segments_keep_pytorchs_answer) {
  REQUIRE(sim_reset("expandable:off,sim_capacity:64MiB") == 0);
  void *b[9];
  for (int i = 0; i < 9; i++) REQUIRE((b[i] = torchalloc_malloc(6 * MiB, 0, S0)) != NULL);
  for (int i = 1; i < 9; i += 2) torchalloc_free(b[i], 6 * MiB, 0, S0);
  CHECK(torchalloc_try_malloc(32 * MiB, 0, S0) == NULL);
  for (int i = 0; i < 9; i += 2) torchalloc_free(b[i], 6 * MiB, 0, S0);
  CHECK_INVARIANTS();
}
