/* A randomized model check of the whole allocator on the sim device.
 *
 * Each seed runs a long random sequence of mallocs (a mix of sizes on three
 * streams), frees, record_stream, empty_cache, policy switches and phase
 * begin/end, with a small device (or a memory fraction) for some seeds so the
 * OOM path runs. After EVERY operation:
 *   - torchalloc_check_invariants(0) == 0 (blocks tile segments, no overlap,
 *     stats equal a recount);
 *   - against the test's own model of the live blocks: a new block is
 *     512-aligned, inside device 0's sim address range and overlaps no live
 *     block; allocation.current is the number of live blocks,
 *     requested_bytes.current their summed sizes, and
 *     requested <= allocated <= reserved; the phases' live_bytes add up to
 *     allocated_bytes; num_ooms equals the NULL returns seen, and a NULL
 *     return happens only when the device has no room for the segment the
 *     request needs and no fully free segment is left cached.
 * At the end everything is freed: allocated 0, then empty_cache: reserved 0.
 *
 * A failure prints the seed and the operation. Environment knobs:
 *   TA_MODEL_OPS=n          operations per seed (default 20000)
 *   TA_MODEL_SEED=s         run only seed s of the table
 *   TA_MODEL_EXTRA_SEEDS=n  also run n more seeds (1000, 1001, ...) cycling
 *                           through the table's configurations: a wider hunt. */
#include "sim.h"

/* ------------------------------------------------------------------------
 * Random numbers: splitmix64, reproducible everywhere.
 * ---------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint64_t rng_range(uint64_t lo, uint64_t hi) { return lo + rng_next() % (hi - lo + 1); }

/* ------------------------------------------------------------------------
 * The model
 * ---------------------------------------------------------------------- */

typedef struct live_block {
  uintptr_t addr;
  size_t size;
  cudaStream_t stream;
  int recorded; /* record_stream on another stream: its free is deferred */
} live_block;

#define MAX_LIVE 4096

typedef struct model {
  live_block live[MAX_LIVE];
  int nlive;
  int64_t requested_sum;
  int64_t nulls; /* malloc returned NULL for a valid request */
  size_t capacity;
  char policy[16];
  const char *phase_stack[8];
  int depth;
  uint64_t seed;
  long op;
  char what[160]; /* the operation in flight, for failure messages */
  int failed;
  int pending;    /* a deferred free may be waiting (until the next malloc or empty_cache) */
} model;

static const char *const policies[] = {"caching", "exact", "phase_arena"};
static const char *const phase_names[] = {"forward", "backward", "optimizer"};
static const cudaStream_t streams[] = {S0, S1, S2};

#define SIM_BASE ((uintptr_t)1 << 52) /* device 0's sim range: [1 << 52, 2 << 52) */

static size_t round512(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }

/* The device allocation a request needs when nothing cached can serve it. */
static size_t segment_needed(const char *policy, size_t size) {
  size_t r = round512(size);
  if (strcmp(policy, "exact") == 0) return r;
  if (r <= 1 * MiB) return 2 * MiB;
  if (r < 10 * MiB) return 20 * MiB;
  return (r + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
}

static size_t draw_size(void) {
  uint64_t r = rng_range(0, 99);
  if (r < 40) return (size_t)rng_range(1, 4096);                   /* tiny */
  if (r < 70) return (size_t)rng_range(4097, 1 * MiB);             /* small */
  if (r < 85) return (size_t)rng_range(1 * MiB + 1, 10 * MiB);     /* large */
  if (r < 90) return (size_t)rng_range(10 * MiB + 1, 200 * MiB);   /* huge */
  if (r < 95) return (size_t)1 << rng_range(0, 27);                /* exact powers of two, 1 B .. 128 MiB */
  /* Odd sizes around the boundaries that matter. */
  static const size_t edges[] = {511,          512,          513,          1 * MiB - 1,  1 * MiB,
                                 1 * MiB + 1,  2 * MiB - 1,  2 * MiB + 1,  10 * MiB - 1, 10 * MiB,
                                 10 * MiB + 1, 20 * MiB - 1, 20 * MiB + 1, 12 * MiB + 3, 3};
  size_t e = edges[rng_range(0, sizeof edges / sizeof edges[0] - 1)];
  return e + (size_t)rng_range(0, 2) * 512; /* and a step or two above */
}

#define MODEL_FAIL(m, ...)                                                                              \
  do {                                                                                                  \
    fprintf(stderr, "  seed %llu op %ld (%s): ", (unsigned long long)(m)->seed, (m)->op, (m)->what);    \
    fprintf(stderr, __VA_ARGS__);                                                                       \
    fprintf(stderr, "\n");                                                                              \
    (m)->failed = 1;                                                                                    \
    g_failures++;                                                                                       \
  } while (0)

static void check_all(model *m) {
  if (torchalloc_check_invariants(0) != 0) {
    MODEL_FAIL(m, "invariants: %s", torchalloc_last_error());
    return;
  }
  torchalloc_stats s = stats0();
  if (s.allocation[ALL].current != m->nlive)
    MODEL_FAIL(m, "allocation.current %lld, model has %d live blocks", (long long)s.allocation[ALL].current,
               m->nlive);
  if (s.requested_bytes[ALL].current != m->requested_sum)
    MODEL_FAIL(m, "requested_bytes.current %lld, model sums %lld", (long long)s.requested_bytes[ALL].current,
               (long long)m->requested_sum);
  if (s.allocated_bytes[ALL].current < s.requested_bytes[ALL].current)
    MODEL_FAIL(m, "allocated_bytes %lld < requested_bytes %lld", (long long)s.allocated_bytes[ALL].current,
               (long long)s.requested_bytes[ALL].current);
  if (s.allocated_bytes[ALL].current > s.reserved_bytes[ALL].current)
    MODEL_FAIL(m, "allocated_bytes %lld > reserved_bytes %lld", (long long)s.allocated_bytes[ALL].current,
               (long long)s.reserved_bytes[ALL].current);
  if ((size_t)s.reserved_bytes[ALL].current > m->capacity)
    MODEL_FAIL(m, "reserved_bytes %lld beyond the device's %zu", (long long)s.reserved_bytes[ALL].current,
               m->capacity);
  if (s.num_ooms != m->nulls)
    MODEL_FAIL(m, "num_ooms %lld, but malloc returned NULL %lld times", (long long)s.num_ooms, (long long)m->nulls);
  if (s.num_device_alloc - s.num_device_free != s.segment[ALL].current)
    MODEL_FAIL(m, "device allocs %lld - frees %lld != segments %lld", (long long)s.num_device_alloc,
               (long long)s.num_device_free, (long long)s.segment[ALL].current);
  if (s.allocated_bytes[ALL].peak < s.allocated_bytes[ALL].current ||
      s.reserved_bytes[ALL].peak < s.reserved_bytes[ALL].current)
    MODEL_FAIL(m, "a peak is below its current value");
  /* Every live byte belongs to exactly one phase. */
  int64_t phase_live = 0;
  int nphases = torchalloc_phase_count();
  for (int p = 0; p < nphases; p++) {
    torchalloc_phase_stats ps;
    if (torchalloc_get_phase_stats(0, p, &ps) == 0) phase_live += ps.live_bytes;
  }
  if (phase_live != s.allocated_bytes[ALL].current)
    MODEL_FAIL(m, "phases' live_bytes sum to %lld, allocated_bytes is %lld", (long long)phase_live,
               (long long)s.allocated_bytes[ALL].current);
  int64_t arenas = torchalloc_arena_reserved(0, -1);
  if (arenas < 0 || arenas > s.reserved_bytes[ALL].current)
    MODEL_FAIL(m, "arena_reserved %lld outside [0, reserved %lld]", (long long)arenas,
               (long long)s.reserved_bytes[ALL].current);
  int expect_phase = m->depth ? torchalloc_phase_id(m->phase_stack[m->depth - 1]) : 0;
  if (torchalloc_phase_current() != expect_phase)
    MODEL_FAIL(m, "phase_current %d, expected %d", torchalloc_phase_current(), expect_phase);
}

static void do_malloc(model *m) {
  size_t size = draw_size();
  cudaStream_t stream = streams[rng_range(0, 2)];
  snprintf(m->what, sizeof m->what, "malloc(%zu, stream %p) under %s", size, (void *)stream, m->policy);
  torchalloc_stats before = stats0();
  void *p = torchalloc_malloc(size, 0, stream);
  m->pending = 0; /* every malloc hands back the deferred frees whose events completed */
  if (!p) {
    m->nulls++;
    /* Legitimate only when, after releasing every cached segment, the
     * device has no room for the segment this request needs. */
    torchalloc_stats s = stats0();
    size_t room = m->capacity - (size_t)s.reserved_bytes[ALL].current;
    size_t need = segment_needed(m->policy, size);
    if (room >= need)
      MODEL_FAIL(m, "NULL although the device has %zu bytes free and the request needs a %zu-byte segment "
                    "(reserved before %lld, after %lld)",
                 room, need, (long long)before.reserved_bytes[ALL].current, (long long)s.reserved_bytes[ALL].current);
    /* The retry released every fully free cached segment already. */
    int64_t left = torchalloc_empty_cache(0);
    if (left != 0) MODEL_FAIL(m, "NULL returned while %lld bytes of fully free segments were still cached", (long long)left);
    return;
  }
  uintptr_t a = (uintptr_t)p, e = a + round512(size);
  if (a % 512) MODEL_FAIL(m, "block %p is not 512-aligned", p);
  if (a < SIM_BASE || e > 2 * SIM_BASE) MODEL_FAIL(m, "block %p lies outside device 0's address range", p);
  for (int i = 0; i < m->nlive; i++) {
    const live_block *l = &m->live[i];
    if (a < l->addr + round512(l->size) && l->addr < e) {
      MODEL_FAIL(m, "block [%p, +%zu) overlaps live block [%p, +%zu)", p, size, (void *)l->addr, l->size);
      break;
    }
  }
  if (m->nlive == MAX_LIVE) { /* cannot happen with the op mix below; keep the model exact anyway */
    torchalloc_free(p, size, 0, stream);
    return;
  }
  m->live[m->nlive++] = (live_block){a, size, stream, 0};
  m->requested_sum += (int64_t)size;
}

static void do_free(model *m, int i) {
  live_block l = m->live[i];
  snprintf(m->what, sizeof m->what, "free(%p, %zu, stream %p) under %s", (void *)l.addr, l.size, (void *)l.stream,
           m->policy);
  torchalloc_free((void *)l.addr, l.size, 0, l.stream);
  m->pending |= l.recorded;
  m->live[i] = m->live[--m->nlive];
  m->requested_sum -= (int64_t)l.size;
}

/* The block is also used on another stream: its free is deferred until
 * events on that stream complete (immediately on the sim device, but only
 * noticed at the next malloc or empty_cache). */
static void do_record_stream(model *m) {
  if (m->nlive == 0) return;
  live_block *l = &m->live[rng_range(0, (uint64_t)m->nlive - 1)];
  cudaStream_t other = streams[rng_range(0, 2)];
  snprintf(m->what, sizeof m->what, "record_stream(%p, stream %p), allocated on %p", (void *)l->addr,
           (void *)other, (void *)l->stream);
  torchalloc_record_stream((void *)l->addr, other);
  l->recorded |= other != l->stream;
}

static void do_empty_cache(model *m) {
  snprintf(m->what, sizeof m->what, "empty_cache(0)");
  int64_t before = stats0().reserved_bytes[ALL].current;
  int64_t released = torchalloc_empty_cache(0);
  int64_t after = stats0().reserved_bytes[ALL].current;
  /* The return value is the drop in reserved bytes, deferred frees that
   * `exact` hands straight back to the device included. */
  if (released < 0 || before - after != released)
    MODEL_FAIL(m, "empty_cache returned %lld, reserved went %lld -> %lld", (long long)released, (long long)before,
               (long long)after);
  m->pending = 0;
}

static void do_set_policy(model *m) {
  const char *name = policies[rng_range(0, 2)];
  snprintf(m->what, sizeof m->what, "set_policy(%s) from %s", name, m->policy);
  if (torchalloc_set_policy(name) != 0) MODEL_FAIL(m, "set_policy failed: %s", torchalloc_last_error());
  else snprintf(m->policy, sizeof m->policy, "%s", name);
  if (strcmp(torchalloc_policy_name(), m->policy) != 0)
    MODEL_FAIL(m, "policy_name says %s", torchalloc_policy_name());
}

static void do_phase(model *m) {
  uint64_t r = rng_range(0, 9);
  if (r == 0) { /* misuse: end a phase that is not the innermost */
    const char *wrong = m->depth ? "no_such_phase" : "forward";
    snprintf(m->what, sizeof m->what, "phase_end(%s) at depth %d (must fail)", wrong, m->depth);
    if (torchalloc_phase_end(wrong) != -1) {
      MODEL_FAIL(m, "phase_end of a phase that is not innermost succeeded");
      if (m->depth) m->depth--; /* resync the model with what happened */
    }
  } else if (m->depth < 3 && (m->depth == 0 || r < 6)) {
    const char *name = phase_names[rng_range(0, 2)];
    snprintf(m->what, sizeof m->what, "phase_begin(%s) at depth %d", name, m->depth);
    if (torchalloc_phase_begin(name) < 0) MODEL_FAIL(m, "phase_begin failed: %s", torchalloc_last_error());
    else m->phase_stack[m->depth++] = name;
  } else {
    const char *name = m->phase_stack[m->depth - 1];
    snprintf(m->what, sizeof m->what, "phase_end(%s) at depth %d", name, m->depth);
    if (torchalloc_phase_end(rng_range(0, 3) ? name : NULL) != 0)
      MODEL_FAIL(m, "phase_end failed: %s", torchalloc_last_error());
    else m->depth--;
  }
}

typedef struct seed_conf {
  uint64_t seed;
  const char *conf; /* appended to backend:sim,warn:0 */
  size_t capacity;
  int target_live;  /* the live count the walk hovers around */
  double fraction;  /* set_memory_fraction at the start; 0: none */
} seed_conf;

static const seed_conf seeds[] = {
    {1, "policy:caching", 80 * GiB, 200, 0},
    {2, "policy:caching,sim_capacity:512MiB", 512 * MiB, 60, 0},
    {3, "policy:exact", 80 * GiB, 100, 0},
    {4, "policy:phase_arena,sim_capacity:512MiB", 512 * MiB, 80, 0},
    {5, "policy:phase_arena", 80 * GiB, 300, 0},
    {6, "policy:caching,sim_capacity:256MiB", 256 * MiB, 40, 0},
    {7, "policy:caching,sim_fail_alloc:25", 80 * GiB, 150, 0}, /* one injected device failure: retry path */
    {8, "policy:exact,sim_capacity:512MiB", 512 * MiB, 50, 0},
    {9, "policy:phase_arena,sim_capacity:2GiB", 2 * GiB, 60, 0.25}, /* the limit, not the device, says no */
};
#define NSEEDS (sizeof seeds / sizeof seeds[0])

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 0) : dflt;
}

/* Runs one seed; returns the operations checked. */
static long run_seed(const seed_conf *sc, long nops) {
  static model m; /* large: keep it off the stack */
  memset(&m, 0, sizeof m);
  m.seed = sc->seed;
  m.capacity = sc->capacity;
  rng_state = sc->seed * 0x2545F4914F6CDD1Dull;
  if (sim_reset(sc->conf) != 0) {
    g_failures++;
    return 0;
  }
  if (sc->fraction > 0) {
    torchalloc_set_memory_fraction(sc->fraction, 0);
    m.capacity = (size_t)(sc->fraction * (double)sc->capacity);
  }
  snprintf(m.policy, sizeof m.policy, "%s", torchalloc_policy_name());
  long checked = 0;
  for (m.op = 0; m.op < nops && !m.failed; m.op++) {
    uint64_t r = rng_range(0, 999);
    if (r < 5) {
      do_empty_cache(&m);
    } else if (r < 8) {
      do_record_stream(&m);
    } else if (r < 12) {
      do_set_policy(&m);
    } else if (r < 32) {
      do_phase(&m);
    } else {
      /* Malloc with probability target / (target + live): hovers around target. */
      int grow = m.nlive == 0 || (int)rng_range(0, (uint64_t)(sc->target_live + m.nlive - 1)) < sc->target_live;
      if (grow) do_malloc(&m);
      else do_free(&m, (int)rng_range(0, (uint64_t)m.nlive - 1));
    }
    if (!m.failed) check_all(&m);
    checked++;
  }
  /* Wind down: close the phases, free everything, release the cache. */
  while (m.depth > 0 && !m.failed) {
    snprintf(m.what, sizeof m.what, "final phase_end");
    if (torchalloc_phase_end(m.phase_stack[--m.depth]) != 0) MODEL_FAIL(&m, "%s", torchalloc_last_error());
  }
  while (m.nlive > 0) do_free(&m, m.nlive - 1);
  snprintf(m.what, sizeof m.what, "after freeing everything");
  if (!m.failed) check_all(&m);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 0);
  CHECK_EQ(s.allocation[ALL].current, 0);
  CHECK_EQ(s.requested_bytes[ALL].current, 0);
  CHECK(torchalloc_empty_cache(0) >= 0); /* also hands back deferred frees: only then is nothing active */
  s = stats0();
  CHECK_EQ(s.active_bytes[ALL].current, 0);
  CHECK_EQ(s.active[ALL].current, 0);
  CHECK_EQ(s.reserved_bytes[ALL].current, 0);
  CHECK_EQ(s.segment[ALL].current, 0);
  CHECK_EQ(s.inactive_split[ALL].current, 0);
  CHECK_INVARIANTS();
  printf("     seed %llu (%s%s): %ld operations, %lld device allocations, %lld OOMs, %lld retries\n",
         (unsigned long long)sc->seed, sc->conf, sc->fraction > 0 ? ", memory fraction" : "", checked,
         (long long)s.num_device_alloc, (long long)s.num_ooms, (long long)s.num_alloc_retries);
  return checked;
}

TEST(random_operations_keep_every_invariant) {
  long nops = env_long("TA_MODEL_OPS", 20000);
  long only = env_long("TA_MODEL_SEED", 0);
  long total = 0;
  int nseeds = 0;
  long extra = env_long("TA_MODEL_EXTRA_SEEDS", 0);
  for (size_t i = 0; i < NSEEDS; i++) {
    if (only && (long)seeds[i].seed != only) continue;
    total += run_seed(&seeds[i], nops);
    nseeds++;
  }
  for (long i = 0; i < extra; i++) {
    seed_conf sc = seeds[(size_t)i % NSEEDS];
    sc.seed = 1000 + (uint64_t)i;
    total += run_seed(&sc, nops);
    nseeds++;
  }
  printf("     model check: %ld operations checked over %d seeds\n", total, nseeds);
  fflush(stdout);
  CHECK(nseeds > 0);
  torchalloc_teardown();
}

/* torchalloc_empty_cache returns "the bytes released". When it hands back a
 * deferred free (record_stream) of a block made by `exact`, exact's free
 * returns the segment to the device on the spot: reserved_bytes drops, but
 * release_cached_locked only sums what the policies' release_cached report,
 * so the return value missed those bytes (0 instead of 4 MiB). */
TEST(empty_cache_counts_deferred_exact_frees) {
  REQUIRE(sim_reset("policy:exact") == 0);
  void *p = torchalloc_malloc(4 * MiB, 0, S0);
  REQUIRE(p);
  torchalloc_record_stream(p, S1);
  torchalloc_free(p, 4 * MiB, 0, S0);
  int64_t before = stats0().reserved_bytes[ALL].current;
  int64_t released = torchalloc_empty_cache(0);
  int64_t after = stats0().reserved_bytes[ALL].current;
  CHECK_EQ(before, 4 * MiB);
  CHECK_EQ(after, 0);
  CHECK_EQ(released, before - after);
}
