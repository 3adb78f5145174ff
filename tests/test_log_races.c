/* Threads against the log's path and the phase stack (issue 23, finding 7).
 *
 * - torchalloc_log_path() used to return the buffer that log_open and
 *   log_close rewrite: a thread reading it while another opened or closed a
 *   log could see a torn path (ThreadSanitizer reported the race; Python's
 *   mark() calls it for every marker). Now each path is published once and
 *   never changed.
 * - A phase entered with a token is left by it, out of order too: thread A
 *   enters "a", thread B enters "b", A leaves first. With phase_end that was
 *   an error and "a" stayed open for ever, taking every later allocation.
 * - A NUL inside a name given with its length is refused, not cut at.
 *
 * Meant for ThreadSanitizer (build-tsan/) as much as for the checks. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "log_reader.h"

#define OPENS 300

static char paths[2][256];
static atomic_int opener_done;
static atomic_int open_errors;

static void *opener(void *arg) {
  (void)arg;
  for (int i = 0; i < OPENS; i++) {
    if (torchalloc_log_open(paths[i % 2]) != 0) atomic_fetch_add(&open_errors, 1);
    void *p = torchalloc_malloc(4096, 0, S0); /* a record or two, so the file is a log */
    torchalloc_free(p, 4096, 0, S0);
    torchalloc_log_close();
  }
  atomic_store(&opener_done, 1);
  return NULL;
}

TEST(log_path_is_safe_while_another_thread_opens_and_closes) {
  temp_path(paths[0], sizeof paths[0], "race-a");
  temp_path(paths[1], sizeof paths[1], "race-b");
  REQUIRE(sim_reset("") == 0);
  REQUIRE(torchalloc_log_open(paths[0]) == 0);
  const char *kept = torchalloc_log_path(); /* held across every later open and close */
  REQUIRE(kept && strcmp(kept, paths[0]) == 0);
  torchalloc_log_close();
  atomic_store(&opener_done, 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, opener, NULL) == 0);
  long reads = 0, seen_open = 0, torn = 0;
  while (!atomic_load(&opener_done) || reads < 1000) {
    const char *now = torchalloc_log_path();
    reads++;
    if (!now) continue;
    seen_open++;
    if (strcmp(now, paths[0]) != 0 && strcmp(now, paths[1]) != 0) torn++;
    if (torchalloc_mark("reader") != 0) torn++; /* what Python's mark() does next */
  }
  pthread_join(t, NULL);
  CHECK_EQ(atomic_load(&open_errors), 0);
  CHECK_EQ(torn, 0);
  CHECK(torchalloc_log_path() == NULL);
  CHECK(strcmp(kept, paths[0]) == 0); /* still the path it was */
  (void)seen_open; /* how often the reader caught a log open depends on scheduling: not checked */
  torchalloc_teardown();
  unlink(paths[0]);
  unlink(paths[1]);
}

static int64_t enter(const char *name) { return torchalloc_phase_enter(name, strlen(name)); }

TEST(a_phase_is_left_by_its_token_out_of_order) {
  char path[256], text[64];
  temp_path(path, sizeof path, "phase-tokens");
  REQUIRE(log_reset(path, "") == 0);
  int64_t a = enter("a"); /* thread A */
  int64_t b = enter("b"); /* thread B, while A is inside "a" */
  REQUIRE(a > 0 && b > 0);
  int id_a = torchalloc_phase_id("a"), id_b = torchalloc_phase_id("b");
  CHECK_EQ(torchalloc_phase_current(), id_b);
  CHECK_EQ(torchalloc_phase_leave(a), 0); /* A leaves first */
  CHECK_EQ(torchalloc_phase_current(), id_b);
  void *in_b = torchalloc_malloc(4096, 0, S0);
  CHECK_EQ(torchalloc_phase_leave(a), -1); /* once only */
  CHECK(strstr(torchalloc_last_error(), "not open") != NULL);
  CHECK_EQ(torchalloc_phase_leave(b), 0);
  CHECK_EQ(torchalloc_phase_current(), 0);
  void *after = torchalloc_malloc(4096, 0, S0);
  CHECK_EQ(torchalloc_phase_end(NULL), -1); /* nothing is left open */
  torchalloc_phase_stats sa, sb;
  REQUIRE(torchalloc_get_phase_stats(0, id_a, &sa) == 0 && torchalloc_get_phase_stats(0, id_b, &sb) == 0);
  CHECK_EQ(sa.occurrences, 1);
  CHECK_EQ(sb.occurrences, 1);
  CHECK_EQ(sa.allocated_count, 0); /* nothing was credited to "a" after it was left */
  CHECK_EQ(sb.allocated_count, 1);
  CHECK_EQ(sb.last_persistent_bytes, 4096);
  torchalloc_free(in_b, 4096, 0, S0);
  torchalloc_free(after, 4096, 0, S0);
  /* Not tokens: 0, negative, an id alone, an occurrence never entered. */
  CHECK_EQ(torchalloc_phase_leave(0), -1);
  CHECK_EQ(torchalloc_phase_leave(-1), -1);
  CHECK_EQ(torchalloc_phase_leave(id_a), -1);
  CHECK_EQ(torchalloc_phase_leave(((int64_t)1000 << 16) | id_a), -1);
  torchalloc_teardown();

  /* The log closes each occurrence it opened, "a" first. */
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(count_kind(&p, TA_LOG_PHASE_BEGIN), 2);
  CHECK_EQ(count_kind(&p, TA_LOG_PHASE_END), 2);
  const ta_log_record *first_end = nth_kind(&p, TA_LOG_PHASE_END, 0);
  REQUIRE(first_end);
  CHECK_EQ(first_end->phase, id_a);
  CHECK(strcmp(string_of(&p, first_end->stack, text, sizeof text), "a") == 0);
  const ta_log_record *alloc = nth_kind(&p, TA_LOG_ALLOC, 0);
  REQUIRE(alloc);
  CHECK_EQ(alloc->phase, id_b);
  free(p.data);
  unlink(path);
}

/* The same phase entered twice (recursion, or two threads): each token
 * leaves its own occurrence, and the outer one is open again after. */
TEST(two_occurrences_of_one_phase_by_token) {
  REQUIRE(sim_reset("") == 0);
  int64_t outer = enter("step"), other = enter("io"), inner = enter("step");
  REQUIRE(outer > 0 && other > 0 && inner > 0 && outer != inner);
  CHECK_EQ(torchalloc_phase_leave(outer), 0);
  CHECK_EQ(torchalloc_phase_current(), torchalloc_phase_id("step")); /* the inner one */
  CHECK_EQ(torchalloc_phase_leave(inner), 0);
  CHECK_EQ(torchalloc_phase_current(), torchalloc_phase_id("io"));
  CHECK_EQ(torchalloc_phase_leave(other), 0);
  CHECK_EQ(torchalloc_phase_current(), 0);
  torchalloc_teardown();
}

TEST(phase_enter_refuses_a_nul_inside_the_name) {
  REQUIRE(sim_reset("") == 0);
  int count = torchalloc_phase_count();
  CHECK_EQ(torchalloc_phase_enter("fwd\0x", 5), -1);
  CHECK(strstr(torchalloc_last_error(), "NUL") != NULL);
  CHECK_EQ(torchalloc_phase_enter("fwd", 0), -1);
  CHECK_EQ(torchalloc_phase_enter(NULL, 3), -1);
  char long_name[TORCHALLOC_PHASE_NAME_MAX + 2];
  memset(long_name, 'x', sizeof long_name);
  CHECK_EQ(torchalloc_phase_enter(long_name, sizeof long_name), -1);
  CHECK_EQ(torchalloc_phase_count(), count); /* nothing was interned */
  CHECK_EQ(torchalloc_phase_current(), 0);
  int64_t ok = torchalloc_phase_enter("fwd\0x", 3); /* the length says where the name ends */
  CHECK(ok > 0);
  CHECK(strcmp(torchalloc_phase_name(torchalloc_phase_current()), "fwd") == 0);
  CHECK_EQ(torchalloc_phase_leave(ok), 0);
  torchalloc_teardown();
}

/* Threads entering and leaving their own phases in any interleaving, while
 * they allocate: every leave succeeds, nothing stays open. */
#define PHASE_THREADS 4
static atomic_int phase_errors;

static void *phase_worker(void *arg) {
  char name[16];
  snprintf(name, sizeof name, "t%d", (int)(intptr_t)arg);
  for (int i = 0; i < 2000; i++) {
    int64_t token = enter(name);
    if (token <= 0) atomic_fetch_add(&phase_errors, 1);
    void *p = torchalloc_malloc(512 * (size_t)(1 + i % 8), 0, S0);
    torchalloc_free(p, 512 * (size_t)(1 + i % 8), 0, S0);
    if (torchalloc_phase_leave(token) != 0) atomic_fetch_add(&phase_errors, 1);
  }
  return NULL;
}

TEST(threads_enter_and_leave_phases_in_any_order) {
  REQUIRE(sim_reset("") == 0);
  atomic_store(&phase_errors, 0);
  pthread_t t[PHASE_THREADS];
  for (int i = 0; i < PHASE_THREADS; i++) REQUIRE(pthread_create(&t[i], NULL, phase_worker, (void *)(intptr_t)i) == 0);
  for (int i = 0; i < PHASE_THREADS; i++) pthread_join(t[i], NULL);
  CHECK_EQ(atomic_load(&phase_errors), 0);
  CHECK_EQ(torchalloc_phase_current(), 0);
  CHECK_EQ(torchalloc_phase_end(NULL), -1);
  CHECK_INVARIANTS();
  torchalloc_teardown();
}

/* Markers and module names labelled on threads while another reopens the
 * log: every label a record carries is one interned in that same file, with
 * that record's text (interning and writing used to be two holds of the
 * log's lock: a reopen between them gave a record an id of the other file,
 * a marker named after a module path or nothing). */
#define REOPENS 200
#define LABELLERS 3
static char label_paths[REOPENS][64];
static atomic_int labelling_done;
static atomic_long labels_made;

/* Labels until told to stop (a fixed count could all fall in the moments
 * between a close and the next open, when there is no log to label). */
static void *labeller(void *arg) {
  int who = (int)(intptr_t)arg;
  char text[48];
  for (int i = 0; !atomic_load(&labelling_done); i++) {
    snprintf(text, sizeof text, who ? "mark-%d-%d" : "model.layers.%d.%d", who, i % 50);
    if (who) torchalloc_mark(text);
    else torchalloc_module_name((uint32_t)(1 + i % 50), text);
    atomic_fetch_add(&labels_made, 1);
  }
  return NULL;
}

/* The text of every STRING of a parsed log, by id (ids are small and dense). */
static char **strings_by_id(const parsed *p, uint32_t *count) {
  uint32_t n = 0;
  uint32_t id;
  uint16_t len, chunk;
  for (size_t i = 0; i < p->nslots; i++) {
    string_slot(&p->slots[i], &id, &len, &chunk);
    if (p->slots[i].kind == TA_LOG_STRING && id >= n) n = id + 1;
  }
  char **texts = calloc(n ? n : 1, sizeof *texts);
  for (size_t i = 0; texts && i < p->nslots; i++) {
    const unsigned char *s = (const unsigned char *)&p->slots[i];
    string_slot(&p->slots[i], &id, &len, &chunk);
    if (p->slots[i].kind != TA_LOG_STRING) continue;
    if (!texts[id]) texts[id] = calloc(1, (size_t)len + 1);
    size_t at = (size_t)chunk * 46, take = len - at < 46 ? len - at : 46;
    if (texts[id] && at < len) memcpy(texts[id] + at, s + 16, take);
  }
  *count = n;
  return texts;
}

TEST(labels_stay_with_their_log_across_reopens) {
  REQUIRE(sim_reset("") == 0);
  for (int i = 0; i < REOPENS; i++)
    snprintf(label_paths[i], sizeof label_paths[i], "/tmp/talog-%d-label-%d.talog", (int)getpid(), i);
  atomic_store(&labelling_done, 0);
  atomic_store(&labels_made, 0);
  pthread_t t[LABELLERS];
  REQUIRE(torchalloc_log_open(label_paths[0]) == 0);
  for (int i = 0; i < LABELLERS; i++) REQUIRE(pthread_create(&t[i], NULL, labeller, (void *)(intptr_t)i) == 0);
  int files = 1;
  while (files < REOPENS) REQUIRE(torchalloc_log_open(label_paths[files++]) == 0);
  /* The last file stays open until it surely holds labels. */
  long at_last_open = atomic_load(&labels_made);
  while (atomic_load(&labels_made) < at_last_open + 3000) sched_yield();
  atomic_store(&labelling_done, 1);
  for (int i = 0; i < LABELLERS; i++) pthread_join(t[i], NULL);
  torchalloc_log_close();
  size_t checked = 0, wrong = 0;
  for (int i = 0; i < files; i++) {
    parsed p;
    if (parse(label_paths[i], &p) != 0) {
      wrong++;
      continue;
    }
    uint32_t n = 0;
    char **texts = strings_by_id(&p, &n);
    for (size_t s = 0; texts && s < p.nslots; s++) {
      const ta_log_record *r = &p.slots[s];
      if (r->kind != TA_LOG_MARKER && r->kind != TA_LOG_MODULE_NAME) continue;
      const char *text = r->stack < n && texts[r->stack] ? texts[r->stack] : "";
      int ok = r->kind == TA_LOG_MARKER ? strncmp(text, "mark-", 5) == 0 : strncmp(text, "model.layers.", 13) == 0;
      checked++;
      if (!ok && wrong++ < 5) fprintf(stderr, "  %s: slot %zu (kind %d) says '%s'\n", label_paths[i], s, r->kind, text);
    }
    for (uint32_t k = 0; texts && k < n; k++) free(texts[k]);
    free(texts);
    free(p.data);
    unlink(label_paths[i]);
  }
  CHECK(checked > 0);
  CHECK_EQ(wrong, 0);
  torchalloc_teardown();
}
