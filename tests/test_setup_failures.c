/* What setup does when something is wrong (issue 23, findings 3 and 9).
 *
 * - The first torchalloc_malloc of a process configures the library from
 *   TORCHALLOC_CONF. It used to read the config before that ran, so under
 *   oom:null a first request that fails (a device out of range, more than
 *   the device has) stopped the process as if oom were abort; and a
 *   configuration that could not be used stopped it whatever it said.
 * - Values out of range are refused with the range (log_max past what can
 *   be mapped used to pass, and then every allocation failed).
 * - A log whose first 16 MiB cannot be written is refused at
 *   torchalloc_init with the reason, and every allocation after that fails
 *   with that reason (it used to fall back silently to $TORCHALLOC_CONF).
 *
 * A failure here can be the process stopping, so each case runs in a child. */
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sim.h"

/* Runs `body` in a fresh process (this program again, told by
 * TA_SETUP_CHILD to run only that) with TORCHALLOC_CONF set to `conf`
 * (NULL: unset), so its first call is the first of a process: no state
 * left by earlier tests. Returns the child's wait status. */
static int in_child(const char *conf, const char *body) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (conf) setenv("TORCHALLOC_CONF", conf, 1);
    else unsetenv("TORCHALLOC_CONF");
    setenv("TA_SETUP_CHILD", body, 1);
    execl("/proc/self/exe", "/proc/self/exe", (char *)NULL);
    _exit(98);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

static int exited_0(int status) {
  if (WIFSIGNALED(status)) fprintf(stderr, "  the child was stopped by signal %d\n", WTERMSIG(status));
  else if (WEXITSTATUS(status)) fprintf(stderr, "  the child failed check %d\n", WEXITSTATUS(status));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#define QUIET "backend:sim,warn:0,oom_report:off"

static int first_call_bad_device(void) { return torchalloc_malloc(4096, 5, S0) == NULL ? 0 : 1; }

static int first_call_beyond_device(void) {
  if (torchalloc_malloc(2 * GiB, 0, S0) != NULL) return 1;
  torchalloc_stats s;
  if (torchalloc_get_stats(0, &s) != 0 || s.num_ooms != 1) return 2; /* counted as the OOM it is */
  void *p = torchalloc_malloc(4096, 0, S0); /* and the process goes on */
  if (!p) return 3;
  torchalloc_free(p, 4096, 0, S0);
  return 0;
}

TEST(first_call_out_of_range_device_under_oom_null_returns_null) {
  CHECK(exited_0(in_child(QUIET ",oom:null", "bad_device")));
  CHECK(exited_0(in_child(QUIET, "bad_device"))); /* the sim device's default is null too */
}

TEST(first_call_larger_than_the_device_under_oom_null_returns_null) {
  CHECK(exited_0(in_child(QUIET ",oom:null,sim_capacity:1GiB", "beyond_device")));
}

/* oom:abort still stops the process on the first call (the plain route's contract). */
TEST(first_call_under_oom_abort_still_stops) {
  int status = in_child(QUIET ",oom:abort,sim_capacity:1GiB", "beyond_device");
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static int broken_config_returns_null(void) {
  if (torchalloc_malloc(4096, 0, S0) != NULL) return 1;
  if (!strstr(torchalloc_last_error(), "cachng")) return 2; /* the reason, naming the bad value */
  if (torchalloc_malloc(4096, 0, S0) != NULL) return 3;
  return 0;
}

/* A configuration that cannot be used fails every allocation, the way it says to. */
TEST(unusable_config_still_obeys_oom_null) {
  CHECK(exited_0(in_child("backend:sim,warn:0,oom:null,policy:cachng", "broken_config")));
  CHECK(exited_0(in_child("policy:cachng,oom:null,backend:sim", "broken_config"))); /* any order */
  int status = in_child("backend:sim,warn:0,oom:abort,policy:cachng", "broken_config");
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static void check_refused_with(const char *conf, const char *needle) {
  torchalloc_teardown();
  CHECK(torchalloc_init(conf) != 0);
  if (!strstr(torchalloc_last_error(), needle)) {
    fprintf(stderr, "  %s: '%s' does not say '%s'\n", conf, torchalloc_last_error(), needle);
    CHECK(!"the error does not name it");
  }
}

TEST(out_of_range_values_name_the_range) {
  check_refused_with("backend:sim,expandable:4", "from 0 to 3");
  check_refused_with("backend:sim,stack_depth:65", "from 1 to 64");
  check_refused_with("backend:sim,sim_devices:0", "from 1 to 64");
  check_refused_with("backend:sim,log_max:18446744073709551615", "4 KiB to 1 TiB");
  check_refused_with("backend:sim,log_max:18446744073709551616", "4 KiB to 1 TiB");
  check_refused_with("backend:sim,log_max:2TiB", "4 KiB to 1 TiB");
  check_refused_with("backend:sim,log_max:100", "4 KiB to 1 TiB");
  torchalloc_teardown();
  CHECK(torchalloc_init("backend:sim,log_max:1TiB") == 0); /* both ends are in range */
  CHECK(torchalloc_init("backend:sim,log_max:4096") == 0);
  CHECK(torchalloc_init("backend:sim,log_max:0") == 0);
  torchalloc_teardown();
}


/* RLIMIT_FSIZE makes writing the log fail as a full disk does (EFBIG instead of ENOSPC). */
static int log_cannot_be_written(void) {
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = {1 * MiB, 1 * MiB};
  if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return 1;
  const char *full_disk_log = getenv("TA_SETUP_LOG");
  if (!full_disk_log) return 9;
  char conf[512];
  snprintf(conf, sizeof conf, QUIET ",oom:null,log:%s", full_disk_log);
  if (torchalloc_init(conf) == 0) return 2;
  const char *why = torchalloc_last_error();
  if (!strstr(why, full_disk_log) || !strstr(why, "File too large") || !strstr(why, "first")) return 3;
  if (access(full_disk_log, F_OK) == 0) return 4; /* the file it created is gone again */
  /* Every allocation fails, for that reason: not the environment's config taken up silently. */
  if (torchalloc_malloc(4096, 0, S0) != NULL) return 5;
  if (!strstr(torchalloc_last_error(), full_disk_log)) return 6;
  /* A working config afterwards works. */
  if (torchalloc_init(QUIET) != 0) return 7;
  void *p = torchalloc_malloc(4096, 0, S0);
  if (!p) return 8;
  torchalloc_free(p, 4096, 0, S0);
  return 0;
}

TEST(a_log_that_cannot_be_written_fails_init_with_the_reason) {
  char full_disk_log[256];
  snprintf(full_disk_log, sizeof full_disk_log, "/tmp/talog-%d-full-at-open.talog", (int)getpid());
  unlink(full_disk_log);
  setenv("TA_SETUP_LOG", full_disk_log, 1);
  CHECK(exited_0(in_child(NULL, "log_cannot_be_written")));
  unlink(full_disk_log);
}

/* The child's side of in_child: before main(), run the body named and exit. */
__attribute__((constructor)) static void run_as_child(void) {
  static const struct {
    const char *name;
    int (*body)(void);
  } bodies[] = {{"bad_device", first_call_bad_device},
                {"beyond_device", first_call_beyond_device},
                {"broken_config", broken_config_returns_null},
                {"log_cannot_be_written", log_cannot_be_written}};
  const char *which = getenv("TA_SETUP_CHILD");
  if (!which) return;
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    if (strcmp(which, bodies[i].name) == 0) _exit(bodies[i].body());
  _exit(99);
}
