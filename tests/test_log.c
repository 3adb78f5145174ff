/* The block log: every event kind with its fields, string interning, the
 * size cap, concurrent writers, fork, and a writer killed with SIGKILL. The
 * file is read back with nothing but the documented layout (log_reader.h),
 * every slot's checksum checked. */
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log/log_clock.h"  /* the clock test reads clock_gettime only */
#include "log/log_intern.h" /* interning a stack by hand: C has no Python frames */
#include "log_reader.h"

/* ------------------------------------------------------------------------
 * Tests
 * ---------------------------------------------------------------------- */

TEST(every_event_kind_with_its_fields) {
  char path[256], text[128];
  temp_path(path, sizeof path, "kinds");
  REQUIRE(log_reset(path, "sim_capacity:64MiB") == 0);
  REQUIRE(torchalloc_log_path() && strcmp(torchalloc_log_path(), path) == 0);
  int fwd = torchalloc_phase_begin("forward");
  void *a = torchalloc_malloc(1000, 0, S1);
  REQUIRE(a);
  CHECK_EQ(torchalloc_mark("step 1"), 0);
  torchalloc_free(a, 1000, 0, S1);
  CHECK_EQ(torchalloc_phase_end("forward"), 0);
  CHECK_EQ(torchalloc_empty_cache(0), 2 * MiB);
  CHECK(torchalloc_malloc(GiB, 0, S0) == NULL); /* sim device of 64 MiB */
  torchalloc_teardown();                       /* closes the log */
  CHECK(torchalloc_log_path() == NULL);

  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_CLOSED);
  CHECK_EQ(p.len, TA_LOG_HEADER_SIZE + p.nslots * TA_LOG_RECORD_SIZE); /* cut to what was written */
  CHECK(seq_contiguous(&p));
  CHECK_EQ(p.slots[p.nslots - 1].kind, TA_LOG_END);

  const ta_log_record *r = nth_kind(&p, TA_LOG_PHASE_BEGIN, 0);
  REQUIRE(r);
  CHECK_EQ(r->phase, fwd);
  CHECK_EQ(r->size, 1); /* first occurrence */
  CHECK(strcmp(string_of(&p, r->stack, text, sizeof text), "forward") == 0);

  r = nth_kind(&p, TA_LOG_SEGMENT_ALLOC, 0);
  REQUIRE(r);
  CHECK_EQ(r->size, 2 * MiB);
  CHECK_EQ(r->pool, TORCHALLOC_POOL_SMALL);
  CHECK_EQ(r->stream, (uintptr_t)S1);
  CHECK_EQ(r->phase, fwd);
  uint64_t seg_addr = r->addr;
  /* The device's memory, said once before its first segment (later segments, after the trim, say nothing). */
  const ta_log_record *d = nth_kind(&p, TA_LOG_DEVICE, 0);
  REQUIRE(d);
  CHECK(d < r);
  CHECK_EQ(d->device, 0);
  CHECK_EQ(d->addr, 64 * MiB);
  CHECK_EQ(d->size, 0); /* no memory fraction */
  CHECK(nth_kind(&p, TA_LOG_DEVICE, 1) == NULL);

  r = nth_kind(&p, TA_LOG_ALLOC, 0);
  REQUIRE(r);
  CHECK_EQ(r->addr, (uintptr_t)a);
  CHECK_EQ(r->size, 1000);
  CHECK_EQ(r->block_size, 1024);
  CHECK_EQ(r->stream, (uintptr_t)S1);
  CHECK_EQ(r->device, 0);
  CHECK_EQ(r->phase, fwd);
  CHECK_EQ(r->policy, 0); /* caching */
  CHECK_EQ(r->pool, TORCHALLOC_POOL_SMALL);
  CHECK_EQ(r->stack, 0);
  CHECK_EQ(r->tid, (uint32_t)getpid()); /* the main thread's tid is the pid */
  CHECK(r->time_ns > 0);

  r = nth_kind(&p, TA_LOG_MARKER, 0);
  REQUIRE(r);
  CHECK(strcmp(string_of(&p, r->stack, text, sizeof text), "step 1") == 0);
  CHECK_EQ(r->phase, fwd);

  r = nth_kind(&p, TA_LOG_FREE, 0);
  REQUIRE(r);
  CHECK_EQ(r->addr, (uintptr_t)a);
  CHECK_EQ(r->size, 1000);
  CHECK_EQ(r->block_size, 1024);
  CHECK_EQ(r->flags, 0);

  r = nth_kind(&p, TA_LOG_PHASE_END, 0);
  REQUIRE(r);
  CHECK_EQ(r->phase, fwd);

  r = nth_kind(&p, TA_LOG_TRIM, 0);
  REQUIRE(r);
  CHECK_EQ(r->size, 2 * MiB);
  CHECK_EQ(r->flags, TA_LOG_TRIM_EMPTY_CACHE);
  r = nth_kind(&p, TA_LOG_SEGMENT_FREE, 0);
  REQUIRE(r);
  CHECK_EQ(r->addr, seg_addr);

  r = nth_kind(&p, TA_LOG_TRIM, 1); /* the OOM's retry */
  REQUIRE(r);
  CHECK_EQ(r->flags, TA_LOG_TRIM_OOM_RETRY);
  r = nth_kind(&p, TA_LOG_OOM, 0);
  REQUIRE(r);
  CHECK_EQ(r->size, GiB);
  CHECK_EQ(r->block_size, 0); /* nothing reserved any more */

  /* Order: begin < segment < alloc < marker < free < end < trim < oom. */
  int order[] = {TA_LOG_PHASE_BEGIN, TA_LOG_SEGMENT_ALLOC, TA_LOG_ALLOC, TA_LOG_MARKER, TA_LOG_FREE,
                 TA_LOG_PHASE_END,   TA_LOG_TRIM,          TA_LOG_OOM,   TA_LOG_END};
  size_t at = 0;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    while (at < p.nslots && p.slots[at].kind != order[i]) at++;
    CHECK(at < p.nslots);
  }
  free(p.data);
  unlink(path);
}

TEST(strings_are_written_once) {
  char path[256], text[8192];
  temp_path(path, sizeof path, "strings");
  REQUIRE(log_reset(path, "") == 0);
  for (int i = 0; i < 3; i++) {
    torchalloc_phase_begin("loop");
    torchalloc_mark("again");
    torchalloc_phase_end("loop");
  }
  char longest[300];
  memset(longest, 'x', sizeof longest - 1);
  longest[sizeof longest - 1] = '\0';
  torchalloc_mark(longest); /* seven chunks of 46 bytes */
  torchalloc_mark(longest);
  torchalloc_log_close();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), 5);
  CHECK_EQ(count_kind(&p, TA_LOG_PHASE_BEGIN), 3);
  CHECK_EQ(count_kind(&p, TA_LOG_STRING), 2 + 7); /* "loop", "again", the long one in 7 chunks */
  const ta_log_record *r = nth_kind(&p, TA_LOG_MARKER, 4);
  REQUIRE(r);
  CHECK(strcmp(string_of(&p, r->stack, text, sizeof text), longest) == 0);
  CHECK_EQ(nth_kind(&p, TA_LOG_PHASE_BEGIN, 2)->size, 3); /* third occurrence */
  free(p.data);
  unlink(path);
}

TEST(cap_ends_with_a_truncated_record) {
  char path[256];
  temp_path(path, sizeof path, "cap");
  REQUIRE(log_reset(path, "log_max:8192") == 0);
  for (int i = 0; i < 1000; i++) {
    void *a = torchalloc_malloc(512, 0, S0);
    REQUIRE(a);
    torchalloc_free(a, 512, 0, S0);
  }
  torchalloc_mark("after the cap"); /* dropped, quietly */
  CHECK_INVARIANTS();
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK(p.len <= 8192);
  CHECK_EQ(p.len, TA_LOG_HEADER_SIZE + p.nslots * TA_LOG_RECORD_SIZE);
  CHECK_EQ(p.status, TA_LOG_STATUS_CAP);
  CHECK_EQ(p.nslots, (8192 - 128) / 64); /* every slot used, the last for TRUNCATED */
  CHECK_EQ(p.slots[p.nslots - 1].kind, TA_LOG_TRUNCATED);
  CHECK_EQ(p.slots[p.nslots - 1].flags, TA_LOG_STATUS_CAP);
  CHECK_EQ(count_kind(&p, TA_LOG_TRUNCATED), 1);
  CHECK_EQ(count_kind(&p, TA_LOG_END), 0);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), 0);
  CHECK(seq_contiguous(&p));
  free(p.data);
  unlink(path);
  CHECK(torchalloc_init("backend:sim,log:/tmp/x.talog,log_max:100") != 0); /* below the minimum: a clear error */
  CHECK(strstr(torchalloc_last_error(), "log_max") != NULL);
}

TEST(path_expands_pid_and_rank) {
  char want[256];
  setenv("RANK", "3", 1);
  REQUIRE(sim_reset("log:/tmp/talog-%p-r%r.talog") == 0);
  snprintf(want, sizeof want, "/tmp/talog-%d-r3.talog", (int)getpid());
  REQUIRE(torchalloc_log_path());
  CHECK(strcmp(torchalloc_log_path(), want) == 0);
  unsetenv("RANK");
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(want, &p) == 0);
  int32_t rank, world;
  memcpy(&rank, p.data + TA_LOG_HEADER_RANK_OFFSET, 4);
  memcpy(&world, p.data + TA_LOG_HEADER_WORLD_SIZE_OFFSET, 4);
  CHECK_EQ(rank, 3);
  CHECK_EQ(world, 0); /* $WORLD_SIZE unset */
  free(p.data);
  unlink(want);
  CHECK(torchalloc_log_open("/nonexistent-dir/x.talog") != 0);
  CHECK(strstr(torchalloc_last_error(), "/nonexistent-dir/x.talog") != NULL);
}

/* What %r and the header say under torchrun, under a launcher that sets
 * only LOCAL_RANK, without a launcher, and when $RANK is not a number. */
static void rank_case(const char *rank, const char *local_rank, const char *world, const char *want_name,
                      int32_t want_rank, int32_t want_world) {
  char pattern[256], want[256];
  if (rank) setenv("RANK", rank, 1);
  if (local_rank) setenv("LOCAL_RANK", local_rank, 1);
  if (world) setenv("WORLD_SIZE", world, 1);
  snprintf(pattern, sizeof pattern, "log:/tmp/talog-%d-rank%%r.talog", (int)getpid());
  snprintf(want, sizeof want, "/tmp/talog-%d-rank%s.talog", (int)getpid(), want_name);
  int opened = sim_reset(pattern);
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("WORLD_SIZE");
  REQUIRE(opened == 0);
  REQUIRE(torchalloc_log_path());
  CHECK(strcmp(torchalloc_log_path(), want) == 0);
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(want, &p) == 0);
  int32_t got_rank, got_world;
  memcpy(&got_rank, p.data + TA_LOG_HEADER_RANK_OFFSET, 4);
  memcpy(&got_world, p.data + TA_LOG_HEADER_WORLD_SIZE_OFFSET, 4);
  CHECK_EQ(got_rank, want_rank);
  CHECK_EQ(got_world, want_world);
  const ta_log_header *h = (const ta_log_header *)(const void *)p.data;
  CHECK_EQ(ta_log_header_checksum(h), h->checksum); /* world_size is summed with the rest */
  free(p.data);
  unlink(want);
}

TEST(rank_from_the_launchers_environment) {
  rank_case("1", "1", "2", "1", 1, 2);          /* torchrun: RANK, LOCAL_RANK, WORLD_SIZE */
  rank_case("5", "1", "8", "5", 5, 8);          /* second node: the global rank wins */
  rank_case(NULL, "2", NULL, "2", 2, 0);        /* a launcher that sets LOCAL_RANK only */
  rank_case(NULL, NULL, NULL, "0", -1, 0);      /* no launcher: file rank0, header -1 (not set) */
  rank_case("../x", NULL, "2", "0", -1, 2);     /* not a number: never put into the path */
  rank_case("-1", "3", "x", "3", 3, 0);         /* signed: ignored, LOCAL_RANK used; a bad WORLD_SIZE is 0 */
  rank_case("12345678901", NULL, NULL, "0", -1, 0); /* too long for a rank */
}

TEST(reopen_starts_a_self_contained_file) {
  char a_path[256], b_path[256], text[64];
  temp_path(a_path, sizeof a_path, "reopen-a");
  temp_path(b_path, sizeof b_path, "reopen-b");
  REQUIRE(sim_reset("") == 0);
  CHECK(torchalloc_log_path() == NULL);
  CHECK_EQ(torchalloc_mark("nobody hears this"), 0);
  REQUIRE(torchalloc_log_open(a_path) == 0);
  torchalloc_mark("same");
  REQUIRE(torchalloc_log_open(b_path) == 0); /* closes a */
  torchalloc_mark("same");
  torchalloc_log_close();
  const char *paths[] = {a_path, b_path};
  for (int i = 0; i < 2; i++) {
    parsed p;
    REQUIRE(parse(paths[i], &p) == 0);
    CHECK_EQ(p.status, TA_LOG_STATUS_CLOSED);
    const ta_log_record *m = nth_kind(&p, TA_LOG_MARKER, 0);
    REQUIRE(m);
    CHECK(strcmp(string_of(&p, m->stack, text, sizeof text), "same") == 0);
    free(p.data);
    unlink(paths[i]);
  }
}

/* Every file says each device's memory before the device's first segment in it (a plan of the log needs the
 * recording GPU's capacity), a memory fraction set while it is open at once, and each device its own. */
TEST(each_file_says_the_devices_memory_and_its_fraction) {
  char a_path[256], b_path[256];
  temp_path(a_path, sizeof a_path, "device-a");
  temp_path(b_path, sizeof b_path, "device-b");
  REQUIRE(log_reset(a_path, "sim_capacity:64MiB,sim_devices:2") == 0);
  void *x = torchalloc_malloc(4 * MiB, 0, S0);
  REQUIRE(x);
  torchalloc_set_memory_fraction(0.5, 0);
  torchalloc_free(x, 4 * MiB, 0, S0);
  torchalloc_empty_cache(0);
  REQUIRE(torchalloc_log_open(b_path) == 0); /* closes a */
  void *y = torchalloc_malloc(4 * MiB, 0, S0); /* a new segment: b hears of the device first */
  void *z = torchalloc_malloc(4 * MiB, 1, S0); /* and of device 1 before its first */
  REQUIRE(y && z);
  torchalloc_free(y, 4 * MiB, 0, S0);
  torchalloc_free(z, 4 * MiB, 1, S0);
  torchalloc_log_close();
  parsed a, b;
  REQUIRE(parse(a_path, &a) == 0);
  REQUIRE(parse(b_path, &b) == 0);
  const ta_log_record *d0 = nth_kind(&a, TA_LOG_DEVICE, 0), *d1 = nth_kind(&a, TA_LOG_DEVICE, 1);
  const ta_log_record *d = nth_kind(&b, TA_LOG_DEVICE, 0), *seg = nth_kind(&b, TA_LOG_SEGMENT_ALLOC, 0);
  REQUIRE(d0);
  REQUIRE(d1);
  REQUIRE(seg);
  REQUIRE(d);
  CHECK(d0 < nth_kind(&a, TA_LOG_SEGMENT_ALLOC, 0));
  CHECK_EQ(d0->addr, 64 * MiB);
  CHECK_EQ(d0->size, 0);
  CHECK_EQ(d1->addr, 64 * MiB);
  CHECK_EQ(d1->size, 32 * MiB); /* the fraction, said when it was set */
  CHECK(d < seg);
  CHECK_EQ(d->size, 32 * MiB);
  const ta_log_record *other = nth_kind(&b, TA_LOG_DEVICE, 1);
  REQUIRE(other);
  CHECK_EQ(other->device, 1);
  CHECK_EQ(other->size, 0); /* device 0's fraction is not device 1's */
  CHECK(nth_kind(&b, TA_LOG_DEVICE, 2) == NULL);
  free(a.data);
  free(b.data);
  unlink(a_path);
  unlink(b_path);
}

/* stacks:1 in a process without Python: every stack is 0, nothing breaks. */
TEST(stacks_without_python_are_empty) {
  char path[256];
  temp_path(path, sizeof path, "nopy");
  REQUIRE(log_reset(path, "stacks:1,stack_depth:8") == 0);
  void *a = torchalloc_malloc(4096, 0, S0);
  REQUIRE(a);
  torchalloc_free(a, 4096, 0, S0);
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(nth_kind(&p, TA_LOG_ALLOC, 0)->stack, 0);
  CHECK_EQ(nth_kind(&p, TA_LOG_FREE, 0)->stack, 0);
  CHECK_EQ(count_kind(&p, TA_LOG_STACK), 0);
  free(p.data);
  unlink(path);
}

typedef struct seen_frames {
  int n;
  char text[4][64];
} seen_frames;

static void collect(void *ctx, const char *file, const char *function, uint32_t line) {
  seen_frames *s = ctx;
  if (s->n < 4) snprintf(s->text[s->n], sizeof s->text[0], "%s:%u:%s", file, (unsigned)line, function);
  s->n++;
}

TEST(stack_frames_reads_an_interned_stack_back) {
  char path[256];
  temp_path(path, sizeof path, "frames");
  REQUIRE(log_reset(path, "stacks:1") == 0);
  ta_log_frame_text frames[2] = {{"train.py", "step", 12}, {"main.py", "<module>", 3}};
  uint32_t id = ta_log_intern_stack(frames, 2);
  REQUIRE(id != 0);
  seen_frames seen = {0};
  CHECK_EQ(torchalloc_stack_frames(id, collect, &seen), 2);
  CHECK_EQ(seen.n, 2);
  CHECK(strcmp(seen.text[0], "train.py:12:step") == 0);
  CHECK(strcmp(seen.text[1], "main.py:3:<module>") == 0);
  CHECK_EQ(torchalloc_stack_frames(id + 1000, collect, &seen), 0); /* unknown id */
  uint32_t file_id = ta_log_string("train.py");
  CHECK_EQ(torchalloc_stack_frames(file_id, collect, &seen), 0); /* a string's id is no stack */
  torchalloc_log_close();
  CHECK_EQ(torchalloc_stack_frames(id, collect, &seen), 0); /* forgotten with the file */
  unlink(path);
}

/* ------------------------------------------------------------------------
 * Concurrency
 * ---------------------------------------------------------------------- */

#define THREADS 4
#define OPS 5000

static void *churn(void *arg) {
  int device = (int)(intptr_t)arg % 2;
  for (int i = 0; i < OPS; i++) {
    size_t size = 512 + (size_t)(i % 7) * 4096;
    void *a = torchalloc_malloc(size, device, S0);
    if (a) torchalloc_free(a, size, device, S0);
    if (i % 1000 == 0) torchalloc_mark("tick");
  }
  return NULL;
}

TEST(concurrent_writers_leave_no_gap) {
  char path[256];
  temp_path(path, sizeof path, "threads");
  REQUIRE(log_reset(path, "sim_devices:2") == 0);
  pthread_t t[THREADS];
  int busy = torchalloc_phase_begin("busy"); /* process-wide: the workers' records carry it */
  for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, churn, (void *)(intptr_t)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  torchalloc_phase_end("busy");
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK(seq_contiguous(&p));
  CHECK_EQ(p.len, TA_LOG_HEADER_SIZE + p.nslots * TA_LOG_RECORD_SIZE);
  CHECK_EQ(count_kind(&p, TA_LOG_ALLOC), THREADS * OPS);
  CHECK_EQ(count_kind(&p, TA_LOG_FREE), THREADS * OPS);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), THREADS * (OPS / 1000));
  CHECK_EQ(count_kind(&p, TA_LOG_STRING), 2); /* "tick" and "busy", once each */
  /* Per device, an address is never allocated twice without a free between. */
  size_t live[2] = {0, 0};
  int ok = 1;
  for (size_t i = 0; i < p.nslots; i++) {
    const ta_log_record *r = &p.slots[i];
    if (r->kind == TA_LOG_ALLOC || r->kind == TA_LOG_FREE) ok &= r->phase == busy && r->tid != (uint32_t)getpid();
    if (r->kind == TA_LOG_ALLOC) live[r->device]++;
    if (r->kind == TA_LOG_FREE) ok &= live[r->device]-- > 0;
  }
  CHECK(ok);
  free(p.data);
  unlink(path);
}

/* A forked child inherits the mapping but must not write into the parent's
 * file, nor trim it when it closes. */
TEST(fork_child_leaves_the_parent_log_alone) {
  char path[256];
  temp_path(path, sizeof path, "fork");
  REQUIRE(log_reset(path, "") == 0);
  torchalloc_mark("before");
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (int i = 0; i < 100; i++) {
      void *a = torchalloc_malloc(512, 0, S0);
      torchalloc_free(a, 512, 0, S0);
    }
    torchalloc_log_close();
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  torchalloc_mark("after");
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK(seq_contiguous(&p));
  CHECK_EQ(count_kind(&p, TA_LOG_ALLOC), 0);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), 2);
  CHECK_EQ(p.slots[p.nslots - 1].kind, TA_LOG_END);
  free(p.data);
  unlink(path);
}

/* SIGKILL mid-write: every record up to the last complete one decodes, the
 * sequence numbers are contiguous, and the header says the file is open. */
TEST(sigkill_leaves_every_complete_record) {
  char path[256];
  temp_path(path, sizeof path, "kill");
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (log_reset(path, "") != 0) _exit(1);
    for (uint64_t i = 0;; i++) {
      size_t size = 512 * (1 + i % 64);
      void *a = torchalloc_malloc(size, 0, S0);
      torchalloc_free(a, size, 0, S0);
      if (i % 4096 == 0) torchalloc_mark("k");
    }
  }
  /* Let it write well past the first 16 MiB chunk (slot 300000 complete), then kill it. */
  const off_t probe = TA_LOG_HEADER_SIZE + (off_t)300000 * TA_LOG_RECORD_SIZE + TA_LOG_RECORD_SIZE - 1;
  unsigned char kind = 0;
  for (int i = 0; i < 4000 && !kind; i++) {
    struct timespec ms = {0, 5000000};
    nanosleep(&ms, NULL);
    FILE *f = fopen(path, "rb");
    if (f && fseeko(f, probe, SEEK_SET) == 0 && fread(&kind, 1, 1, f) != 1) kind = 0;
    if (f) fclose(f);
  }
  CHECK(kind != 0);
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_OPEN);
  CHECK(p.nslots > 300000); /* it wrote past the first 16 MiB chunk */
  CHECK(seq_contiguous(&p));
  size_t allocs = count_kind(&p, TA_LOG_ALLOC), frees = count_kind(&p, TA_LOG_FREE);
  CHECK(allocs == frees || allocs == frees + 1);
  /* After the last complete record: at most one torn slot (the kill can land
   * while the one writer thread fills it: fields written, kind byte still 0),
   * then nothing but untouched zeros. */
  size_t torn = TA_LOG_HEADER_SIZE + p.nslots * TA_LOG_RECORD_SIZE;
  if (torn + TA_LOG_RECORD_SIZE <= p.len) CHECK_EQ(p.data[torn + TA_LOG_RECORD_SIZE - 1], 0);
  int zeros = 1;
  for (size_t i = torn + TA_LOG_RECORD_SIZE; i < p.len; i++) zeros &= p.data[i] == 0;
  CHECK(zeros);
  for (size_t i = 0; i < p.nslots; i++)
    if (p.slots[i].kind < TA_LOG_ALLOC || p.slots[i].kind > TA_LOG_DEVICE) { /* DEVICE: the last kind */
      CHECK(!"bad kind");
      break;
    }
  free(p.data);
  unlink(path);
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Timestamps are CLOCK_MONOTONIC: each record's lies between clock readings
 * taken just before and just after the call that wrote it, and never goes
 * back on one thread. Here every timestamp is a clock_gettime read inside
 * the call (the TSC fit is switched off), so the bounds are exact and hold
 * however loaded the machine is; with the fit, a preemption at the wrong
 * moment used to fail all 20 marker checks at once. The fit itself is
 * checked on fake clocks (test_log_clock.c). */
TEST(timestamps_follow_clock_monotonic) {
  char path[256];
  temp_path(path, sizeof path, "clock");
  ta_log_clock_test_gettime_only(1);
  int opened = log_reset(path, ""); /* the clock is chosen when the log opens */
  ta_log_clock_test_gettime_only(0);
  REQUIRE(opened == 0);
  uint64_t before = mono_ns(), marks[20], marks_returned[20];
  for (int round = 0; round < 20; round++) {
    marks[round] = mono_ns();
    torchalloc_mark("tick");
    marks_returned[round] = mono_ns();
    for (int i = 0; i < 2000; i++) torchalloc_free(torchalloc_malloc(512, 0, S0), 512, 0, S0);
  }
  torchalloc_teardown(); /* writes the END record */
  uint64_t after = mono_ns();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  uint64_t last = 0;
  int in_span = 1, forward = 1;
  for (size_t i = 0; i < p.nslots; i++) {
    const ta_log_record *r = &p.slots[i];
    if (r->kind >= TA_LOG_STRING && r->kind <= TA_LOG_STACK) continue;
    if (!(r->time_ns >= before && r->time_ns <= after) && in_span)
      fprintf(stderr, "  record %zu (kind %d) at %+lld ns from the start, span %llu ns\n", i, r->kind,
              (long long)(r->time_ns - before), (unsigned long long)(after - before));
    in_span &= r->time_ns >= before && r->time_ns <= after;
    forward &= r->time_ns >= last;
    last = r->time_ns;
  }
  CHECK(in_span);
  CHECK(forward);
  for (int round = 0; round < 20; round++) {
    const ta_log_record *m = nth_kind(&p, TA_LOG_MARKER, (size_t)round);
    REQUIRE(m);
    CHECK(m->time_ns >= marks[round] && m->time_ns <= marks_returned[round]);
  }
  free(p.data);
  unlink(path);
}

/* A file that cannot grow (here: RLIMIT_FSIZE, as a full disk would) stops
 * the log, says so in the header, and the program goes on. */
TEST(full_disk_stops_the_log_not_the_program) {
  char path[256];
  temp_path(path, sizeof path, "full");
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {20 * MiB, 20 * MiB};
    setrlimit(RLIMIT_FSIZE, &lim);
    if (log_reset(path, "") != 0) _exit(1);
    for (int i = 0; i < 400000; i++) {
      void *a = torchalloc_malloc(512, 0, S0);
      if (!a) _exit(2);
      torchalloc_free(a, 512, 0, S0);
    }
    if (torchalloc_check_invariants(0) != 0) _exit(3);
    torchalloc_teardown();
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_NO_SPACE);
  CHECK(p.len <= 20 * MiB);
  CHECK(p.nslots > 100000);
  CHECK(seq_contiguous(&p));
  free(p.data);
  unlink(path);
}
