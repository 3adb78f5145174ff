/* The log against other users and programs: a file another user planted,
 * or that others may write, is never taken as a log; a live log cut short
 * by another program, or a file-size limit (ulimit -f), stops logging and
 * never kills the process that trains. Each case runs in a child, whose
 * exit status says whether it survived. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "log/log_format.h"
#include "log/log_guard.h"
#include "log_reader.h"

/* Under ThreadSanitizer two cases cannot be judged: it runs signal handlers
 * at points of its own choosing (a store that faults may be retried before
 * the guard ran), and its shadow memory counts in VmRSS (about 2 GB here). */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif
#define SKIP_UNDER_TSAN(why)                                  \
  do {                                                        \
    if (UNDER_TSAN) {                                         \
      fprintf(stderr, "  skipped under ThreadSanitizer: %s\n", why); \
      return;                                                 \
    }                                                         \
  } while (0)

static void churn(int n) {
  for (int i = 0; i < n; i++) {
    void *p = torchalloc_malloc(4096, 0, S0);
    if (!p) _exit(3);
    torchalloc_free(p, 4096, 0, S0);
  }
}

static void truncate_while_logging(const void *arg) {
  const char *path = arg;
  if (log_reset(path, "") != 0) _exit(1);
  churn(1000);
  if (truncate(path, 0) != 0) _exit(2); /* logrotate's copytruncate, `: > run.talog` */
  churn(100000);
  torchalloc_log_close();
  struct stat st;
  _exit(stat(path, &st) == 0 && st.st_size == 0 ? 0 : 4); /* the other program's cut is left as it is */
}

/* `child` run on a temporary path named after `name`: its log is cut by
 * another program; it ends cleanly and says so. What it printed: `out`. */
static void the_cut_is_reported(void (*child)(const void *), const char *name, char *out, size_t len) {
  char path[256];
  temp_path(path, sizeof path, name);
  CHECK(child_exited_cleanly(run_in_child(child, path, out, len)));
  CHECK(strstr(out, "cut short by another program") != NULL);
  unlink(path);
}

TEST(a_log_cut_short_by_another_program_stops_logging_and_training_goes_on) {
  SKIP_UNDER_TSAN("it defers the SIGBUS handler");
  char out[4096];
  the_cut_is_reported(truncate_while_logging, "truncated", out, sizeof out);
}

/* The state a cut leaves when it falls between the guard's check and the
 * file's growth: the growth extended the shorter file from the length this
 * process gave it, so the file is as long as before but a hole where the
 * log was. The growth reads the header back, puts the cut back and trips
 * the guard (a race test_log_hostile's cut above met about once in 150
 * runs under load, this state made on purpose). */
static void grow_over_a_cut(const void *arg) {
  const char *path = arg;
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)(1 * MiB)) != 0) _exit(1);
  char *base = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) _exit(1);
  memcpy(base, TA_LOG_MAGIC, 8);
  static atomic_int enabled = 1;
  static _Atomic uint64_t size = 1 * MiB;
  ta_log_guard_arm(base, 4 * MiB, &enabled, fd, &size);
  if (ta_log_guard_grow(fd, 1 * MiB, 2 * MiB, TA_LOG_MAGIC) != 0) _exit(2); /* whole: it grows */
  if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)(2 * MiB)) != 0) _exit(1); /* the cut, filled by a growth */
  if (ta_log_guard_grow(fd, 2 * MiB, 3 * MiB, TA_LOG_MAGIC) != -1) _exit(3);
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size != 0) _exit(4); /* the cut put back */
  if (atomic_load(&enabled) || !ta_log_guard_tripped()) _exit(5);
  base[100] = 1; /* the mapping is anonymous memory now: no fault */
  ta_log_guard_disarm();
  _exit(0);
}

TEST(a_cut_met_by_the_files_growth_is_put_back_and_stops_the_log) {
  char out[4096];
  the_cut_is_reported(grow_over_a_cut, "grown_over", out, sizeof out);
}

/* What Python's faulthandler does on a fault: put back the handler it
 * replaced and raise the signal again, which then carries no address. */
static struct sigaction replaced;

static void like_faulthandler(int sig) {
  static const char msg[] = "Fatal error: Bus error (as faulthandler prints it)\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  sigaction(sig, &replaced, NULL);
  raise(sig);
}

static void truncate_under_a_handler_that_raises_again(const void *arg) {
  const char *path = arg;
  /* A log whose whole file is allocated at open (log_max = the first
   * growth): nothing grows it later, so no growth check finds the cut
   * before a store faults on it. */
  if (log_reset(path, "log_max:16MiB") != 0) _exit(1);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = like_faulthandler;
  sa.sa_flags = SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, &sa, &replaced) != 0) _exit(2);
  churn(1000);
  if (truncate(path, 0) != 0) _exit(3);
  churn(100000);
  torchalloc_log_close();
  _exit(0);
}

TEST(a_cut_log_stops_logging_when_a_later_handler_raises_the_fault_again) {
  SKIP_UNDER_TSAN("it defers the SIGBUS handler");
  char out[4096];
  the_cut_is_reported(truncate_under_a_handler_that_raises_again, "reraised", out, sizeof out);
  CHECK(strstr(out, "Bus error") != NULL); /* the later handler did see the fault */
}

static void raise_sigbus_with_a_whole_log(const void *arg) {
  if (log_reset(arg, "") != 0) _exit(1);
  churn(10);
  raise(SIGBUS);
  _exit(0);
}

TEST(a_sigbus_the_log_did_not_cause_keeps_its_default) {
  char path[256], out[4096];
  temp_path(path, sizeof path, "raised");
  int status = run_in_child(raise_sigbus_with_a_whole_log, path, out, sizeof out);
  /* Ended as the signal's default ends it, or by the handler that was
   * there before the guard (a sanitizer's, in those builds): never goes on. */
  CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
  unlink(path);
}

static void log_past_a_file_size_limit(const void *arg) {
  const char *path = arg;
  struct rlimit limit = {20 << 20, 20 << 20};
  if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(1);
  if (log_reset(path, "") != 0) _exit(2);
  churn(250000); /* 500,000 records of 64 bytes: past 20 MiB */
  torchalloc_log_close();
  _exit(0);
}

TEST(a_file_size_limit_stops_the_log_as_a_full_disk_does) {
  char path[256], out[4096];
  temp_path(path, sizeof path, "fsize");
  int status = run_in_child(log_past_a_file_size_limit, path, out, sizeof out);
  CHECK(child_exited_cleanly(status)); /* SIGXFSZ's default would end it with signal 25 */
  CHECK(strstr(out, "cannot grow") != NULL);
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_NO_SPACE);
  CHECK(p.len <= (20 << 20));
  free(p.data);
  unlink(path);
}

static void open_under_a_tiny_limit(const void *arg) {
  const char *path = arg;
  struct rlimit limit = {10 << 20, 10 << 20};
  if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(1);
  if (sim_reset("") != 0) _exit(2);
  int rc = torchalloc_log_open(path);
  fprintf(stderr, "%s\n", torchalloc_last_error());
  churn(10);
  _exit(rc != 0 ? 0 : 3);
}

TEST(a_log_that_cannot_start_under_a_limit_is_refused_with_the_reason) {
  char path[256], out[4096];
  temp_path(path, sizeof path, "tiny-limit");
  int status = run_in_child(open_under_a_tiny_limit, path, out, sizeof out);
  CHECK(child_exited_cleanly(status));
  CHECK(strstr(out, "file size limit") != NULL);
  struct stat st;
  CHECK(stat(path, &st) != 0); /* the file it created is gone again */
}

TEST(a_file_others_may_write_is_not_taken_as_a_log) {
  char path[256];
  temp_path(path, sizeof path, "planted");
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
  REQUIRE(fd >= 0);
  close(fd);
  REQUIRE(chmod(path, 0666) == 0); /* as another user would leave it for the next pid */
  REQUIRE(sim_reset("") == 0);
  CHECK(torchalloc_log_open(path) != 0);
  CHECK(strstr(torchalloc_last_error(), "may be written by other users") != NULL);
  REQUIRE(chmod(path, 0644) == 0);
  CHECK_EQ(torchalloc_log_open(path), 0); /* this user's own empty file is fine */
  torchalloc_log_close();
  if (geteuid() == 0) { /* root can hand it to another user: then it is refused too */
    REQUIRE(chown(path, 65534, 65534) == 0);
    CHECK(torchalloc_log_open(path) != 0);
    CHECK(strstr(torchalloc_last_error(), "owned by another user") != NULL);
  }
  unlink(path);
}

static int holds(const char *path, const char *text) {
  char back[128] = {0};
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t got = fread(back, 1, sizeof back - 1, f);
  fclose(f);
  return got == strlen(text) && memcmp(back, text, got) == 0;
}

static void plant(const char *victim, const char *link_at) {
  FILE *f = fopen(victim, "w");
  if (f) fputs("precious", f), fclose(f);
  unlink(link_at);
  if (symlink(victim, link_at) != 0) fprintf(stderr, "  symlink %s: %s\n", link_at, strerror(errno));
}

TEST(an_oom_report_never_writes_through_a_planted_link) {
  char log[256], victim[256], report_at[300], conf[400];
  temp_path(log, sizeof log, "oom-link");
  temp_path(victim, sizeof victim, "victim");
  snprintf(report_at, sizeof report_at, "%s.oom-cuda0.txt", log);
  plant(victim, report_at);
  snprintf(conf, sizeof conf, "sim_capacity:64MiB,oom_report:on,log:%s", log);
  REQUIRE(sim_reset(conf) == 0);
  CHECK(torchalloc_try_malloc(100 * MiB, 0, S0) == NULL);
  CHECK(strcmp(torchalloc_oom_report_path(0), report_at) == 0);
  CHECK(holds(victim, "precious")); /* the link was replaced, its target left alone */
  struct stat st;
  CHECK(lstat(report_at, &st) == 0 && S_ISREG(st.st_mode));
  torchalloc_teardown();
  unlink(report_at), unlink(victim), unlink(log);
}

TEST(the_fallback_report_gets_a_name_nobody_could_predict) {
  char victim[256], predictable[256];
  temp_path(victim, sizeof victim, "victim2");
  snprintf(predictable, sizeof predictable, "/tmp/torchalloc-oom-%d-cuda0.txt", (int)getpid());
  plant(victim, predictable); /* where the fallback used to go */
  REQUIRE(sim_reset("sim_capacity:64MiB,oom_report:/nonexistent/torchalloc-reports") == 0);
  CHECK(torchalloc_try_malloc(100 * MiB, 0, S0) == NULL);
  const char *at = torchalloc_oom_report_path(0);
  CHECK(at && strncmp(at, "/tmp/torchalloc-oom-", 20) == 0 && strcmp(at, predictable) != 0);
  struct stat st;
  CHECK(at && lstat(at, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid());
  CHECK(holds(victim, "precious"));
  if (at) unlink(at);
  torchalloc_teardown();
  unlink(predictable), unlink(victim);
}

static void oom_under_a_tiny_file_size_limit(const void *arg) {
  char conf[400];
  snprintf(conf, sizeof conf, "sim_capacity:64MiB,oom_report:%s", (const char *)arg);
  if (sim_reset(conf) != 0) _exit(1);
  fprintf(stderr, "pid %d\n", (int)getpid());
  struct rlimit limit = {1024, 1024}; /* ulimit -f 1 */
  if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
  if (torchalloc_try_malloc(100 * MiB, 0, S0) != NULL) _exit(3);
  _exit(torchalloc_oom_report_path(0)[0] == '\0' ? 0 : 4); /* no report claimed */
}

/* Whether `dir` holds no file starting with `prefix`; any found is named and removed. */
static int none_left(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  int none = d != NULL;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    char file[512];
    snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
    fprintf(stderr, "  left behind: %s\n", file);
    unlink(file);
    none = 0;
  }
  if (d) closedir(d);
  return none;
}

TEST(an_oom_report_past_a_file_size_limit_is_dropped_and_the_process_lives) {
  char dir[] = "/tmp/talog-oom-fsize-XXXXXX", out[4096];
  REQUIRE(mkdtemp(dir) != NULL);
  int status = run_in_child(oom_under_a_tiny_file_size_limit, dir, out, sizeof out);
  CHECK(child_exited_cleanly(status)); /* SIGXFSZ's default ended it with signal 25 */
  if (WIFSIGNALED(status)) fprintf(stderr, "  the child died of signal %d\n", WTERMSIG(status));
  CHECK(none_left(dir, "")); /* neither the report nor its temporary file */
  CHECK(rmdir(dir) == 0);
  int pid = 0;
  const char *at = strstr(out, "pid ");
  REQUIRE(at && sscanf(at, "pid %d", &pid) == 1);
  char fallback[64]; /* /tmp/torchalloc-oom-PID-cuda0-XXXXXX.txt */
  snprintf(fallback, sizeof fallback, "torchalloc-oom-%d-cuda0-", pid);
  CHECK(none_left("/tmp", fallback));
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}

/* 4 M records (256 MiB of log): the pages written long ago leave the
 * writer's resident memory; what stays is about the window ahead of and
 * behind the write position (32 MiB each), not the log's size. */
TEST(the_writers_resident_memory_does_not_grow_with_the_log) {
  SKIP_UNDER_TSAN("its shadow memory counts in VmRSS");
  char path[256];
  temp_path(path, sizeof path, "rss");
  REQUIRE(log_reset(path, "") == 0);
  churn(1000);
  long before = rss_kib();
  churn(2 << 20);
  long after = rss_kib();
  /* The release runs on the log's helper thread: on a loaded machine it may
   * trail the writer for a while (up to 10 s here), never for good. */
  for (int i = 0; i < 1000 && after - before >= 160 * 1024; i++) {
    usleep(10000);
    torchalloc_mark("wake the helper");
    after = rss_kib();
  }
  struct stat st;
  CHECK(stat(path, &st) == 0 && st.st_size >= (off_t)(256 << 20));
  CHECK(before > 0 && after - before < 160 * 1024);
  if (after - before >= 160 * 1024) fprintf(stderr, "  VmRSS grew by %ld KiB\n", after - before);
  torchalloc_log_close();
  unlink(path);
}
