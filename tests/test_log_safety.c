/* The log's path and lifetime: a log path never destroys what torchalloc
 * did not create (a FIFO, a directory, a device behind a symlink, a user's
 * file), a second process naming the same path is refused instead of
 * killing the first, and a process that exits normally closes its log
 * (while a forked child that exits leaves its parent's alone). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log_reader.h"

static int is_fifo(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISFIFO(st.st_mode);
}

static int is_symlink(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static int error_says(const char *a, const char *b) {
  const char *e = torchalloc_last_error();
  int ok = strstr(e, a) != NULL && (!b || strstr(e, b) != NULL);
  if (!ok) fprintf(stderr, "  the error was: %s\n", e);
  return ok;
}

/* ------------------------------------------------------------------------
 * What a log path may be
 * ---------------------------------------------------------------------- */

TEST(a_fifo_is_refused_and_left_alone) {
  char path[256];
  temp_path(path, sizeof path, "fifo");
  REQUIRE(mkfifo(path, 0600) == 0);
  REQUIRE(sim_reset("") == 0);
  CHECK(torchalloc_log_open(path) != 0);
  CHECK(error_says(path, "is a FIFO, not a regular file"));
  CHECK(is_fifo(path));                      /* it used to be unlinked */
  CHECK(torchalloc_log_path() == NULL);
  char conf[300];
  snprintf(conf, sizeof conf, "backend:sim,log:%s", path);
  CHECK(torchalloc_init(conf) != 0);         /* the same through the configuration */
  CHECK(error_says(path, "a FIFO"));
  CHECK(is_fifo(path));
  unlink(path);
}

TEST(a_directory_is_refused) {
  char path[256];
  temp_path(path, sizeof path, "dir");
  rmdir(path);
  REQUIRE(mkdir(path, 0700) == 0);
  REQUIRE(sim_reset("") == 0);
  CHECK(torchalloc_log_open(path) != 0);
  CHECK(error_says(path, "is a directory"));
  struct stat st;
  CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
  rmdir(path);
}

TEST(a_symlink_is_never_followed) {
  char fifo[256], link[256], dev_link[256];
  temp_path(fifo, sizeof fifo, "link-target");
  temp_path(link, sizeof link, "link");
  temp_path(dev_link, sizeof dev_link, "devnull-link");
  unlink(fifo), unlink(link), unlink(dev_link);
  REQUIRE(mkfifo(fifo, 0600) == 0);
  REQUIRE(symlink(fifo, link) == 0);
  REQUIRE(symlink("/dev/null", dev_link) == 0);
  REQUIRE(sim_reset("") == 0);
  CHECK(torchalloc_log_open(link) != 0);
  CHECK(error_says(link, "is a symbolic link"));
  CHECK(is_symlink(link) && is_fifo(fifo));
  CHECK(torchalloc_log_open(dev_link) != 0);
  CHECK(error_says(dev_link, "is a symbolic link"));
  CHECK(is_symlink(dev_link));
  struct stat st;
  CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
  unlink(link), unlink(dev_link), unlink(fifo);
}

TEST(a_users_file_is_not_overwritten) {
  char path[256], back[64] = {0};
  temp_path(path, sizeof path, "precious");
  const char text[] = "results that took a week\n";
  FILE *f = fopen(path, "w");
  REQUIRE(f);
  fputs(text, f);
  fclose(f);
  REQUIRE(sim_reset("") == 0);
  CHECK(torchalloc_log_open(path) != 0);
  CHECK(error_says(path, "not a torchalloc log"));
  f = fopen(path, "r");
  REQUIRE(f);
  CHECK(fread(back, 1, sizeof back - 1, f) == strlen(text));
  fclose(f);
  CHECK(strcmp(back, text) == 0);
  unlink(path);
}

TEST(an_old_log_or_an_empty_file_may_be_reused) {
  char path[256];
  temp_path(path, sizeof path, "reuse");
  REQUIRE(log_reset(path, "") == 0);
  torchalloc_mark("first run");
  torchalloc_teardown();
  REQUIRE(log_reset(path, "") == 0); /* the old log is replaced */
  torchalloc_mark("second run");
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), 1);
  char text[64];
  CHECK(strcmp(string_of(&p, nth_kind(&p, TA_LOG_MARKER, 0)->stack, text, sizeof text), "second run") == 0);
  free(p.data);
  REQUIRE(truncate(path, 0) == 0);   /* an empty file: nothing to lose */
  REQUIRE(log_reset(path, "") == 0);
  torchalloc_teardown();
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_CLOSED);
  free(p.data);
  unlink(path);
}

/* A file that cannot be set up (here the first 16 MiB cannot be allocated:
 * RLIMIT_FSIZE) is deleted only when this open created it. */
TEST(a_failed_open_deletes_only_what_it_created) {
  char fresh[256], old[256];
  temp_path(fresh, sizeof fresh, "fail-fresh");
  temp_path(old, sizeof old, "fail-old");
  unlink(fresh);
  REQUIRE(log_reset(old, "") == 0); /* an old log, well under the limit below */
  torchalloc_teardown();
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1 * MiB, 1 * MiB};
    setrlimit(RLIMIT_FSIZE, &lim);
    if (sim_reset("") != 0) _exit(1);
    if (torchalloc_log_open(fresh) == 0 || !strstr(torchalloc_last_error(), "cannot write the first")) _exit(2);
    if (torchalloc_log_open(old) == 0) _exit(3);
    torchalloc_teardown();
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(!exists(fresh)); /* made by the failed open: gone */
  CHECK(exists(old));    /* was there before: still there */
  unlink(old);
}

/* ------------------------------------------------------------------------
 * One writer per file
 * ---------------------------------------------------------------------- */

TEST(a_second_process_on_the_same_path_is_refused) {
  char path[256];
  temp_path(path, sizeof path, "shared");
  REQUIRE(log_reset(path, "") == 0);
  torchalloc_mark("before");
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) { /* opens the path its parent is writing: refused, the parent unharmed */
    close(pipefd[0]);
    int rc = torchalloc_log_open(path);
    const char *e = rc ? torchalloc_last_error() : "opened it";
    if (write(pipefd[1], e, strlen(e)) < 0) _exit(2);
    _exit(rc ? 0 : 1);
  }
  close(pipefd[1]);
  char said[600] = {0};
  ssize_t n = read(pipefd[0], said, sizeof said - 1);
  close(pipefd[0]);
  int st;
  waitpid(pid, &st, 0);
  CHECK(n > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char pid_text[32];
  snprintf(pid_text, sizeof pid_text, "in use by process %d", (int)getpid());
  CHECK(strstr(said, pid_text) != NULL);
  if (!strstr(said, pid_text)) fprintf(stderr, "  the child said: %s\n", said);
  for (int i = 0; i < 50000; i++) torchalloc_free(torchalloc_malloc(512, 0, S0), 512, 0, S0); /* past 2 MiB */
  torchalloc_mark("after");
  torchalloc_teardown();
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_CLOSED);
  CHECK(seq_contiguous(&p));
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), 2);
  CHECK_EQ(count_kind(&p, TA_LOG_ALLOC), 50000);
  free(p.data);
  unlink(path);
}

/* The lock is what a reader asks to tell "still being written" from
 * "its writer died": held while the writer runs, gone once it is killed. */
static int lock_is_held(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd); /* drops a lock it got */
  return held;
}

TEST(the_lock_is_held_while_the_writer_lives) {
  char path[256];
  temp_path(path, sizeof path, "alive");
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    if (log_reset(path, "") != 0) _exit(1);
    torchalloc_mark("running");
    if (write(ready[1], "r", 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(ready[1]);
  char c;
  CHECK(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  CHECK_EQ(lock_is_held(path), 1);
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  CHECK_EQ(lock_is_held(path), 0);
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_OPEN);
  CHECK_EQ(p.pid, (uint32_t)pid);
  free(p.data);
  unlink(path);
}

/* ------------------------------------------------------------------------
 * Closing at exit
 * ---------------------------------------------------------------------- */

TEST(a_normal_exit_closes_the_log) {
  char path[256];
  temp_path(path, sizeof path, "exit");
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (log_reset(path, "") != 0) _exit(1);
    void *a = torchalloc_malloc(4096, 0, S0); /* left live: the exit path must not need a clean heap */
    torchalloc_mark("last words");
    exit(a ? 0 : 2); /* atexit handlers run; no teardown */
  }
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_CLOSED);
  CHECK_EQ(p.len, TA_LOG_HEADER_SIZE + p.nslots * TA_LOG_RECORD_SIZE); /* the preallocation trimmed */
  CHECK(p.nslots > 0 && p.slots[p.nslots - 1].kind == TA_LOG_END);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), 1);
  CHECK_EQ(lock_is_held(path), 0);
  free(p.data);
  unlink(path);
}

TEST(a_forked_child_exiting_leaves_the_parent_log_open) {
  char path[256];
  temp_path(path, sizeof path, "exit-fork");
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) { /* the writer */
    if (log_reset(path, "") != 0) _exit(1);
    torchalloc_mark("before the worker");
    fflush(NULL);
    pid_t worker = fork();
    if (worker == 0) exit(0); /* a worker (DataLoader-like) ends normally: runs the atexit handlers */
    int wst;
    waitpid(worker, &wst, 0);
    if (lock_is_held(path) != 1) _exit(3); /* the worker did not unlock the parent's file */
    torchalloc_mark("after the worker");
    exit(WIFEXITED(wst) && WEXITSTATUS(wst) == 0 ? 0 : 4);
  }
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  parsed p;
  REQUIRE(parse(path, &p) == 0);
  CHECK_EQ(p.status, TA_LOG_STATUS_CLOSED);
  CHECK_EQ(count_kind(&p, TA_LOG_MARKER), 2); /* the writer kept logging after its worker exited */
  CHECK_EQ(count_kind(&p, TA_LOG_END), 1);
  CHECK(seq_contiguous(&p));
  free(p.data);
  unlink(path);
}
