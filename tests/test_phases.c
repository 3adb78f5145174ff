/* Phases and policies on the simulated device: a training-shaped sequence
 * with every per-phase number asserted for caching, exact and phase_arena,
 * the case phase_arena exists for, policy switching under live blocks, and
 * phases begun before the log opened. */
#include <pthread.h>

#include "log_reader.h"

static int phase_of(const char *name) { return torchalloc_phase_id(name); }

static torchalloc_phase_stats pstats(const char *name) {
  torchalloc_phase_stats s;
  memset(&s, 0, sizeof s);
  torchalloc_get_phase_stats(0, phase_of(name), &s);
  return s;
}

/* ------------------------------------------------------------------------
 * A training run in miniature (sizes in MiB, all in the large pool):
 *   model init ("default"): 4 parameters of 4
 *   forward:   3 activations of 6, kept for backward; a temporary of 2
 *   backward:  first step: 4 gradients of 4 that stay; a temporary of 2;
 *              frees the activations
 *   optimizer: first step: Adam state, 2 x parameters = 8 tensors of 4
 *              that stay; every step a temporary of 4
 * ---------------------------------------------------------------------- */

typedef struct run {
  void *params[4], *grads[4], *state[8];
} run;

#define A (6 * MiB)

static void *must(size_t size) {
  void *p = torchalloc_malloc(size, 0, S0);
  if (!p) {
    fprintf(stderr, "  unexpected NULL for %zu bytes\n", size);
    g_failures++;
  }
  return p;
}

static void step(run *r, int first) {
  void *act[3];
  torchalloc_phase_begin("forward");
  for (int i = 0; i < 3; i++) act[i] = must(A);
  void *t = must(2 * MiB);
  torchalloc_free(t, 2 * MiB, 0, S0);
  torchalloc_phase_end("forward");

  torchalloc_phase_begin("backward");
  if (first)
    for (int i = 0; i < 4; i++) r->grads[i] = must(4 * MiB);
  void *tmp = must(2 * MiB);
  for (int i = 2; i >= 0; i--) torchalloc_free(act[i], A, 0, S0);
  torchalloc_free(tmp, 2 * MiB, 0, S0);
  torchalloc_phase_end("backward");

  torchalloc_phase_begin("optimizer");
  if (first)
    for (int i = 0; i < 8; i++) r->state[i] = must(4 * MiB);
  void *o = must(4 * MiB);
  torchalloc_free(o, 4 * MiB, 0, S0);
  torchalloc_phase_end("optimizer");
  CHECK_INVARIANTS();
}

typedef struct expected_growth {
  const char *policy;
  int64_t dflt, forward, backward, optimizer; /* reserved growth, MiB */
  int64_t released_forward, released_backward, released_optimizer;
} expected_growth;

static void check_training(const expected_growth *e) {
  REQUIRE(sim_reset(e->policy) == 0);
  run r;
  for (int i = 0; i < 4; i++) r.params[i] = must(4 * MiB);
  step(&r, 1);
  /* After the first step: what each phase left behind. */
  CHECK_EQ(pstats("forward").last_persistent_bytes, 18 * MiB); /* activations wait for backward */
  CHECK_EQ(pstats("forward").last_transient_bytes, 2 * MiB);
  CHECK_EQ(pstats("backward").last_persistent_bytes, 16 * MiB); /* gradients */
  CHECK_EQ(pstats("backward").last_transient_bytes, 2 * MiB);
  CHECK_EQ(pstats("optimizer").last_persistent_bytes, 32 * MiB); /* Adam state: 2 x parameters */
  CHECK_EQ(pstats("optimizer").last_transient_bytes, 4 * MiB);
  step(&r, 0);
  step(&r, 0);

  torchalloc_phase_stats f = pstats("forward"), b = pstats("backward"), o = pstats("optimizer"),
                         d = pstats("default");
  CHECK_EQ(f.occurrences, 3);
  CHECK_EQ(b.occurrences, 3);
  CHECK_EQ(o.occurrences, 3);
  CHECK_EQ(d.allocated_bytes, 16 * MiB);
  CHECK_EQ(d.allocated_count, 4);
  CHECK_EQ(f.allocated_bytes, 60 * MiB);
  CHECK_EQ(f.allocated_count, 12);
  CHECK_EQ(f.freed_bytes, 6 * MiB); /* only the temporaries are freed during forward */
  CHECK_EQ(f.freed_count, 3);
  CHECK_EQ(b.allocated_bytes, 22 * MiB);
  CHECK_EQ(b.allocated_count, 7);
  CHECK_EQ(b.freed_bytes, 60 * MiB); /* activations and temporaries */
  CHECK_EQ(b.freed_count, 12);
  CHECK_EQ(o.allocated_bytes, 44 * MiB);
  CHECK_EQ(o.allocated_count, 11);
  CHECK_EQ(o.freed_bytes, 12 * MiB);
  /* Live now, by the phase that allocated it. */
  CHECK_EQ(d.live_bytes, 16 * MiB);
  CHECK_EQ(f.live_bytes, 0);
  CHECK_EQ(b.live_bytes, 16 * MiB);
  CHECK_EQ(o.live_bytes, 32 * MiB);
  CHECK_EQ(f.live_peak_bytes, 20 * MiB);
  CHECK_EQ(b.live_peak_bytes, 18 * MiB);
  CHECK_EQ(o.live_peak_bytes, 36 * MiB);
  /* Device-wide allocated high-water mark while each phase was current. */
  CHECK_EQ(d.peak_allocated_bytes, 16 * MiB);
  CHECK_EQ(f.peak_allocated_bytes, 84 * MiB);
  CHECK_EQ(b.peak_allocated_bytes, 84 * MiB);
  CHECK_EQ(o.peak_allocated_bytes, 68 * MiB);
  /* The last step: everything transient. */
  CHECK_EQ(f.last_persistent_bytes, 18 * MiB);
  CHECK_EQ(b.last_persistent_bytes, 0);
  CHECK_EQ(b.last_transient_bytes, 2 * MiB);
  CHECK_EQ(o.last_persistent_bytes, 0);
  CHECK_EQ(o.last_transient_bytes, 4 * MiB);
  /* Where the policies differ: who made the device allocations. */
  CHECK_EQ(d.reserved_growth_bytes, e->dflt * MiB);
  CHECK_EQ(f.reserved_growth_bytes, e->forward * MiB);
  CHECK_EQ(b.reserved_growth_bytes, e->backward * MiB);
  CHECK_EQ(o.reserved_growth_bytes, e->optimizer * MiB);
  CHECK_EQ(f.reserved_released_bytes, e->released_forward * MiB);
  CHECK_EQ(b.reserved_released_bytes, e->released_backward * MiB);
  CHECK_EQ(o.reserved_released_bytes, e->released_optimizer * MiB);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 64 * MiB);
  CHECK_EQ(s.allocated_bytes[ALL].peak, 84 * MiB);
  CHECK_EQ(s.reserved_bytes[ALL].current,
           (e->dflt + e->forward + e->backward + e->optimizer - e->released_forward - e->released_backward -
            e->released_optimizer) * MiB);
  CHECK_INVARIANTS();
}

TEST(training_sequence_caching) {
  /* Hand-traced best fit: forward needs a second activation segment in step
   * 2 because Adam state filled the first one's free space. */
  expected_growth e = {"policy:caching", 20, 40, 20, 20, 0, 0, 0};
  check_training(&e);
}

TEST(training_sequence_exact) {
  /* One device allocation per request, released on free. */
  expected_growth e = {"policy:exact", 16, 60, 22, 44, 6, 60, 12};
  check_training(&e);
}

TEST(training_sequence_phase_arena) {
  /* Each phase's arena grows once: 20 each, and 40 for the 32 MiB of state. */
  expected_growth e = {"policy:phase_arena", 20, 20, 20, 40, 0, 0, 0};
  check_training(&e);
}

/* Gradients are allocated in backward while activations are freed. Under
 * caching each gradient lands in a freshly freed activation hole (best fit)
 * and stays there, so the next forward finds no room and grows the device by
 * 40 MiB; phase_arena keeps gradients in backward's own arena. Sizes: four
 * activations of 9 MiB, four gradients of 5 MiB. */
static int64_t reserved_after_two_forwards(const char *policy, int64_t *backward_arena) {
  if (sim_reset(policy) != 0) return -1;
  void *act[4], *grad[4];
  torchalloc_phase_begin("forward");
  for (int i = 0; i < 4; i++) act[i] = must(9 * MiB);
  torchalloc_phase_end("forward");
  torchalloc_phase_begin("backward");
  for (int i = 3; i >= 0; i--) {
    torchalloc_free(act[i], 9 * MiB, 0, S0);
    grad[i] = must(5 * MiB);
  }
  torchalloc_phase_end("backward");
  torchalloc_phase_begin("forward");
  for (int i = 0; i < 4; i++) act[i] = must(9 * MiB);
  torchalloc_phase_end("forward");
  CHECK_INVARIANTS();
  *backward_arena = torchalloc_arena_reserved(0, torchalloc_phase_id("backward"));
  int64_t reserved = stats0().reserved_bytes[ALL].current;
  for (int i = 0; i < 4; i++) {
    torchalloc_free(act[i], 9 * MiB, 0, S0);
    torchalloc_free(grad[i], 5 * MiB, 0, S0);
  }
  return reserved;
}

TEST(phase_arena_keeps_gradients_from_pinning_activation_segments) {
  int64_t arena_caching, arena_phase;
  int64_t caching = reserved_after_two_forwards("policy:caching", &arena_caching);
  int64_t phase = reserved_after_two_forwards("policy:phase_arena", &arena_phase);
  CHECK_EQ(caching, 80 * MiB);
  CHECK_EQ(phase, 60 * MiB);
  CHECK_EQ(arena_caching, 0);       /* no phase_arena policy instance in that run */
  CHECK_EQ(arena_phase, 20 * MiB);  /* the four gradients, packed in one segment */
  /* Trimming backward's arena alone releases nothing while gradients live,
   * and everything once they are gone. */
  REQUIRE(sim_reset("policy:phase_arena") == 0);
  torchalloc_phase_begin("backward");
  void *g = must(5 * MiB);
  torchalloc_phase_end("backward");
  int bw = torchalloc_phase_id("backward");
  CHECK_EQ(torchalloc_arena_trim(0, bw), 0);
  torchalloc_free(g, 5 * MiB, 0, S0);
  CHECK_EQ(torchalloc_arena_trim(0, bw), 20 * MiB);
  CHECK_EQ(torchalloc_arena_reserved(0, bw), 0);
  CHECK_EQ(torchalloc_arena_reserved(0, -1), 0);
}

TEST(blocks_go_back_to_the_arena_that_made_them) {
  REQUIRE(sim_reset("policy:phase_arena") == 0);
  torchalloc_phase_begin("forward");
  void *x = must(3 * MiB);
  torchalloc_phase_end("forward");
  torchalloc_phase_begin("optimizer");
  torchalloc_free(x, 3 * MiB, 0, S0); /* freed in another phase */
  void *y = must(3 * MiB);            /* optimizer's own arena: a new segment */
  CHECK(y != x);
  torchalloc_phase_end("optimizer");
  torchalloc_phase_begin("forward");
  void *z = must(3 * MiB); /* forward's cached block */
  CHECK(z == x);
  torchalloc_phase_end("forward");
  CHECK_EQ(torchalloc_arena_reserved(0, torchalloc_phase_id("forward")), 20 * MiB);
  CHECK_EQ(torchalloc_arena_reserved(0, torchalloc_phase_id("optimizer")), 20 * MiB);
  torchalloc_free(y, 3 * MiB, 0, S0);
  torchalloc_free(z, 3 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(switching_policy_under_live_blocks_keeps_stats_exact) {
  REQUIRE(sim_reset("policy:caching") == 0);
  void *a = must(3 * MiB); /* caching: 20 MiB segment */
  CHECK_EQ(torchalloc_set_policy("exact"), 0);
  CHECK(strcmp(torchalloc_policy_name(), "exact") == 0);
  void *b = must(3 * MiB); /* exact: 3 MiB segment */
  CHECK_EQ(torchalloc_set_policy("phase_arena"), 0);
  void *c = must(3 * MiB); /* phase_arena default arena: 20 MiB */
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 9 * MiB);
  CHECK_EQ(s.reserved_bytes[ALL].current, 43 * MiB);
  CHECK_INVARIANTS();
  CHECK_EQ(torchalloc_set_policy("caching"), 0);
  torchalloc_free(b, 3 * MiB, 0, S0); /* exact releases it at once, whatever is current */
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 40 * MiB);
  torchalloc_free(c, 3 * MiB, 0, S0); /* back into phase_arena's cache */
  torchalloc_free(a, 3 * MiB, 0, S0);
  s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 0);
  CHECK_EQ(s.reserved_bytes[ALL].current, 40 * MiB);
  void *d = must(3 * MiB); /* caching again: its own cached block */
  CHECK(d == a);
  torchalloc_free(d, 3 * MiB, 0, S0);
  CHECK_EQ(torchalloc_empty_cache(0), 40 * MiB);
  CHECK_INVARIANTS();
  CHECK_EQ(torchalloc_set_policy("bogus"), -1);
  CHECK(strstr(torchalloc_last_error(), "bogus") != NULL);
}

TEST(phase_api_nesting_names_and_errors) {
  REQUIRE(sim_reset("") == 0);
  CHECK_EQ(torchalloc_phase_current(), 0);
  CHECK(strcmp(torchalloc_phase_name(0), "default") == 0);
  int fw = torchalloc_phase_begin("forward");
  int inner = torchalloc_phase_begin("attention");
  CHECK_EQ(torchalloc_phase_current(), inner);
  void *p = must(512);
  CHECK_EQ(pstats("attention").live_bytes, 512); /* innermost wins */
  CHECK_EQ(pstats("forward").live_bytes, 0);
  CHECK_EQ(torchalloc_phase_end("forward"), -1); /* not the innermost */
  CHECK(strstr(torchalloc_last_error(), "attention") != NULL);
  CHECK_EQ(torchalloc_phase_end("attention"), 0);
  CHECK_EQ(torchalloc_phase_current(), fw);
  CHECK_EQ(torchalloc_phase_end(NULL), 0);
  CHECK_EQ(torchalloc_phase_current(), 0);
  CHECK_EQ(torchalloc_phase_end(NULL), -1); /* nothing open */
  CHECK_EQ(torchalloc_phase_begin(""), -1);
  char name[128];
  memset(name, 'x', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  CHECK_EQ(torchalloc_phase_begin(name), -1); /* too long */
  /* At least 64 distinct names; the same name keeps its id. */
  for (int i = 0; i < 100; i++) {
    snprintf(name, sizeof name, "layer.%d", i);
    int id = torchalloc_phase_id(name);
    CHECK(id > 0);
    CHECK_EQ(torchalloc_phase_id(name), id);
  }
  torchalloc_free(p, 512, 0, S0);
}

/* A begin refused for depth must not use up a name: 300 of them used to
 * turn the error into "too many distinct phase names". */
TEST(a_begin_refused_for_depth_takes_no_name) {
  REQUIRE(sim_reset("") == 0);
  char name[32];
  for (int i = 0; i < 64; i++) {
    snprintf(name, sizeof name, "level.%d", i);
    REQUIRE(torchalloc_phase_begin(name) > 0);
  }
  int names = torchalloc_phase_count();
  for (int i = 0; i < 300; i++) {
    snprintf(name, sizeof name, "deeper.%d", i);
    CHECK_EQ(torchalloc_phase_begin(name), -1);
    if (i == 299) CHECK(strstr(torchalloc_last_error(), "nested deeper than 64") != NULL);
  }
  CHECK_EQ(torchalloc_phase_count(), names);
  for (int i = 0; i < 64; i++) CHECK_EQ(torchalloc_phase_end(NULL), 0);
  CHECK(torchalloc_phase_begin("a new name") > 0);
  CHECK_EQ(torchalloc_phase_end(NULL), 0);
}

/* The phase_begin records of a log: (phase name, occurrence) in order. */
static int begins_are(const parsed *p, const char *const *names, const uint64_t *epochs, int n) {
  char text[80];
  int ok = (int)count_kind(p, TA_LOG_PHASE_BEGIN) == n;
  for (int i = 0; ok && i < n; i++) {
    const ta_log_record *r = nth_kind(p, TA_LOG_PHASE_BEGIN, (size_t)i);
    ok = strcmp(string_of(p, r->stack, text, sizeof text), names[i]) == 0 && r->size == epochs[i];
  }
  return ok;
}

/* Every alloc record comes after the phase_begin of its phase's occurrence. */
static int allocs_follow_their_begin(const parsed *p) {
  for (size_t i = 0; i < p->nslots; i++) {
    const ta_log_record *a = &p->slots[i];
    if (a->kind != TA_LOG_ALLOC || a->phase == 0) continue;
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++) seen = p->slots[j].kind == TA_LOG_PHASE_BEGIN && p->slots[j].phase == a->phase;
    if (!seen) return 0;
  }
  return 1;
}

TEST(phases_open_when_the_log_opens_are_logged_first) {
  char path[256];
  temp_path(path, sizeof path, "open-phases");
  REQUIRE(sim_reset("") == 0);
  torchalloc_phase_begin("outer");
  torchalloc_phase_begin("inner");
  torchalloc_phase_end("inner");
  torchalloc_phase_begin("inner"); /* its second occurrence */
  torchalloc_phase_begin("inner"); /* and a third, nested in the second */
  REQUIRE(torchalloc_log_open(path) == 0);
  void *a = must(4096);
  for (int i = 0; i < 3; i++) CHECK_EQ(torchalloc_phase_end(NULL), 0);
  torchalloc_free(a, 4096, 0, S0);
  torchalloc_log_close();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  const char *names[] = {"outer", "inner", "inner"};
  const uint64_t epochs[] = {1, 2, 3};
  CHECK(begins_are(&p, names, epochs, 3));
  CHECK_EQ(count_kind(&p, TA_LOG_PHASE_END), 3);
  CHECK(allocs_follow_their_begin(&p));
  free(p.data);
  unlink(path);
}

/* The usual way in: TORCHALLOC_CONF names the log, the script enters a
 * phase, and the first allocation initialises torchalloc and opens the log. */
TEST(phases_begun_before_a_lazy_init_are_logged) {
  char path[256], conf[400];
  temp_path(path, sizeof path, "lazy-phases");
  snprintf(conf, sizeof conf, "backend:sim,warn:0,oom_report:off,log:%s", path);
  torchalloc_teardown();
  setenv("TORCHALLOC_CONF", conf, 1);
  for (int step = 0; step < 3; step++) {
    torchalloc_phase_begin("forward");
    void *x = must(4096); /* the first one opens the log */
    torchalloc_phase_end("forward");
    torchalloc_phase_begin("backward");
    torchalloc_free(x, 4096, 0, S0);
    torchalloc_phase_end("backward");
  }
  unsetenv("TORCHALLOC_CONF");
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  const char *names[] = {"forward", "backward", "forward", "backward", "forward", "backward"};
  const uint64_t epochs[] = {1, 1, 2, 2, 3, 3};
  CHECK(begins_are(&p, names, epochs, 6));
  CHECK_EQ(count_kind(&p, TA_LOG_PHASE_END), 6);
  CHECK(allocs_follow_their_begin(&p));
  free(p.data);
  unlink(path);
}

typedef struct thread_arg {
  void *ptr;
} thread_arg;

static void *allocate_on_other_thread(void *arg) {
  ((thread_arg *)arg)->ptr = torchalloc_malloc(1 * MiB, 0, S0);
  return NULL;
}

TEST(allocations_on_other_threads_belong_to_the_current_phase) {
  /* The autograd engine allocates on its own threads while the main thread
   * sits in backward(): the phase is process-wide, not per thread. */
  REQUIRE(sim_reset("") == 0);
  torchalloc_phase_begin("backward");
  thread_arg arg = {NULL};
  pthread_t t;
  pthread_create(&t, NULL, allocate_on_other_thread, &arg);
  pthread_join(t, NULL);
  torchalloc_phase_end("backward");
  REQUIRE(arg.ptr);
  CHECK_EQ(pstats("backward").live_bytes, 1 * MiB);
  torchalloc_free(arg.ptr, 1 * MiB, 0, S0);
}

TEST(exact_policy_has_no_cache_and_no_slack) {
  REQUIRE(sim_reset("policy:exact") == 0);
  void *a = must(1000);
  void *b = must(3 * MiB + 1);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.reserved_bytes[ALL].current, 1024 + 3 * MiB + 512);
  CHECK_EQ(s.allocated_bytes[ALL].current, s.reserved_bytes[ALL].current);
  CHECK_EQ(s.reserved_bytes[SMALL].current, 1024);
  CHECK_EQ(s.inactive_split[ALL].current, 0);
  torchalloc_free(a, 1000, 0, S0);
  torchalloc_free(b, 3 * MiB + 1, 0, S0);
  s = stats0();
  CHECK_EQ(s.reserved_bytes[ALL].current, 0);
  CHECK_EQ(s.num_device_alloc, 2);
  CHECK_EQ(s.num_device_free, 2);
  CHECK_INVARIANTS();
}
