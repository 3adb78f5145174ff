/* A broken TORCHALLOC_CONF, on the sim device: every allocation is refused
 * with one line naming the key, control calls fail with the reason in
 * torchalloc_last_error() (not a stale one), and a good configuration
 * works again. (Split from test_misuse.c, whose other kinds of bad input
 * leave the allocator working.) */
#include "capture.h"
#include "sim.h"


typedef struct saved_env {
  int had;
  char value[1024];
} saved_env;

static void env_save(saved_env *e) {
  const char *v = getenv("TORCHALLOC_CONF");
  e->had = v != NULL;
  snprintf(e->value, sizeof e->value, "%s", v ? v : "");
}

/* The environment's TORCHALLOC_CONF saved into `e`, `conf` put in its
 * place, and the library torn down: the next call configures from it. */
static void use_environment_conf(saved_env *e, const char *conf) {
  env_save(e);
  setenv("TORCHALLOC_CONF", conf, 1);
  torchalloc_teardown();
}

static void env_restore(const saved_env *e) {
  if (e->had) setenv("TORCHALLOC_CONF", e->value, 1);
  else unsetenv("TORCHALLOC_CONF");
}

TEST(broken_conf_in_the_environment_refuses_every_allocation) {
  REQUIRE(sim_reset("warn:1") == 0);
  saved_env env;
  /* oom:null: without it a broken conf for the real device stops the process at the first malloc */
  use_environment_conf(&env, "policy:nope,oom:null");
  void *got[4];
  capture c;
  int captured = capture_begin(&c) == 0;
  got[0] = torchalloc_malloc(4096, 0, S0);
  got[1] = torchalloc_malloc(5 * MiB, 0, S1);
  torchalloc_free((void *)(uintptr_t)0x1000, 4096, 0, S0); /* nothing to free into: silently ignored */
  got[2] = torchalloc_malloc(4096, 0, S0);
  got[3] = torchalloc_malloc(4096, 3, S0);
  int lines = captured ? capture_end(&c) : -1;
  char last_error[512];
  snprintf(last_error, sizeof last_error, "%s", torchalloc_last_error());
  torchalloc_stats s;
  int stats_rc = torchalloc_get_stats(0, &s);
  int64_t empty_rc = torchalloc_empty_cache(0);
  int count = torchalloc_device_count();
  /* Put everything back before any REQUIRE can return early. */
  env_restore(&env);
  torchalloc_teardown();

  for (int i = 0; i < 4; i++) CHECK(got[i] == NULL);
  CHECK_EQ(lines, 1);
  CHECK(strstr(c.text, "error") != NULL);
  CHECK(strstr(c.text, "'policy'") != NULL);
  CHECK(strstr(c.text, "nope") != NULL);
  if (lines != 1 || !strstr(c.text, "'policy'")) capture_dump(&c, "allocations under a broken conf");
  CHECK(strstr(last_error, "policy") != NULL);
  CHECK(strstr(last_error, "nope") != NULL);
  CHECK_EQ(stats_rc, -1);
  CHECK_EQ(empty_rc, -1);
  CHECK_EQ(count, 0);

  /* Restored: a good conf works again. */
  REQUIRE(sim_reset("") == 0);
  void *p = torchalloc_malloc(4096, 0, S0);
  CHECK(p != NULL);
  torchalloc_free(p, 4096, 0, S0);
  CHECK_EQ(stats0().allocation[ALL].current, 0);
  CHECK_INVARIANTS();
}

TEST(broken_conf_then_explicit_init_recovers) {
  saved_env env;
  use_environment_conf(&env, "backend:sim,sim_capacity:80XB");
  capture c;
  int captured = capture_begin(&c) == 0;
  void *p = torchalloc_malloc(4096, 0, S0);
  int lines = captured ? capture_end(&c) : -1;
  int rc = torchalloc_init("backend:sim,warn:0"); /* explicit conf: the environment is not read */
  void *q = torchalloc_malloc(4096, 0, S0);
  env_restore(&env);
  CHECK(p == NULL);
  CHECK_EQ(lines, 1);
  CHECK(strstr(c.text, "sim_capacity") != NULL);
  CHECK_EQ(rc, 0);
  CHECK(q != NULL);
  if (q) torchalloc_free(q, 4096, 0, S0);
  CHECK_INVARIANTS();
  torchalloc_teardown();
}

/* Regression: behaviour the core once got wrong. */
/* torchalloc_last_error() only falls back to the config error when this
 * thread's last_error is empty; a stale message from an earlier failure hides
 * why a control call fails under a broken TORCHALLOC_CONF. */
TEST(broken_conf_error_replaces_a_stale_last_error) {
  REQUIRE(sim_reset("") == 0);
  CHECK_EQ(torchalloc_check_invariants(5), -1); /* "device index 5 is out of range" */
  saved_env env;
  use_environment_conf(&env, "policy:nope");
  capture c;
  int captured = capture_begin(&c) == 0;
  torchalloc_stats s;
  int rc = torchalloc_get_stats(0, &s);
  if (captured) capture_end(&c);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", torchalloc_last_error());
  env_restore(&env);
  torchalloc_teardown();
  CHECK_EQ(rc, -1);
  CHECK(strstr(msg, "policy") != NULL);
  if (!strstr(msg, "policy")) fprintf(stderr, "  last_error: %s\n", msg);
}
