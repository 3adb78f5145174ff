/* torchalloc_init and the TORCHALLOC_CONF syntax, on the sim device: every
 * key, bad values, units, whitespace, and what a refused init leaves behind. */
#include "sim.h"

#include "context/config.h" /* the defaults, which the public API shows only in part */

/* init must fail, and its message must contain `needle`. */
static void check_refused(const char *conf, const char *needle) {
  int rc = torchalloc_init(conf);
  const char *err = torchalloc_last_error();
  if (rc != -1 || !strstr(err, needle)) {
    fprintf(stderr, "  torchalloc_init(\"%s\") = %d, last_error \"%s\" (expected -1 and a message naming %s)\n",
            conf, rc, err, needle);
    g_failures++;
  }
}

static void check_accepted(const char *conf) {
  if (torchalloc_init(conf) != 0) {
    fprintf(stderr, "  torchalloc_init(\"%s\") failed: %s\n", conf, torchalloc_last_error());
    g_failures++;
  }
}

/* The sim device of `conf` holds exactly `bytes` (a multiple of 512): under
 * `exact` (one device allocation per request, rounded to 512 B) a request of
 * `bytes` fits and then 512 more do not; a fresh device cannot serve
 * `bytes` + 512 at once. */
static void check_capacity(const char *conf, size_t bytes) {
  char full[256];
  snprintf(full, sizeof full, "backend:sim,warn:0,oom_report:off,policy:exact,%s", conf);
  torchalloc_teardown();
  if (torchalloc_init(full) != 0) {
    fprintf(stderr, "  torchalloc_init(\"%s\") failed: %s\n", full, torchalloc_last_error());
    g_failures++;
    return;
  }
  void *p = torchalloc_malloc(bytes, 0, S0);
  void *q = p ? torchalloc_malloc(512, 0, S0) : NULL;
  if (!p || q) {
    fprintf(stderr, "  %s: expected a capacity of exactly %zu bytes (full request %s, then 512 B %s)\n", conf,
            bytes, p ? "fits" : "does NOT fit", q ? "fits too" : "does not");
    g_failures++;
  }
  if (q) torchalloc_free(q, 512, 0, S0);
  if (p) torchalloc_free(p, bytes, 0, S0);
  CHECK(torchalloc_malloc(bytes + 512, 0, S0) == NULL);
  CHECK_INVARIANTS();
  torchalloc_teardown();
}

/* ------------------------------------------------------------------------ */

TEST(unknown_key_is_named_and_keeps_the_state) {
  REQUIRE(sim_reset("sim_capacity:64MiB,policy:exact") == 0);
  void *p = torchalloc_malloc(4 * MiB, 0, S0);
  REQUIRE(p);
  torchalloc_free(p, 4 * MiB, 0, S0);
  torchalloc_stats before = stats0();
  check_refused("backend:sim,sim_capacity:1GiB,bogus_key:1", "bogus_key");
  check_refused("backend:sim,Policy:caching", "Policy"); /* keys are case-sensitive */
  check_refused("backend:sim,:caching", "unknown key");  /* empty key */
  /* Nothing changed: same policy, same 64 MiB device, same stats. */
  CHECK(strcmp(torchalloc_policy_name(), "exact") == 0);
  torchalloc_stats after = stats0();
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  void *q = torchalloc_malloc(4 * MiB, 0, S0);
  CHECK(q != NULL);
  CHECK(torchalloc_malloc(64 * MiB, 0, S0) == NULL); /* still 64 MiB, not 1 GiB */
  torchalloc_free(q, 4 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

TEST(unknown_key_with_live_blocks_leaves_them_usable) {
  REQUIRE(sim_reset("") == 0);
  void *a = torchalloc_malloc(1000, 0, S0);
  void *b = torchalloc_malloc(12 * MiB, 0, S1);
  REQUIRE(a && b);
  torchalloc_stats before = stats0();
  CHECK_EQ(torchalloc_init("backend:sim,bogus_key:1"), -1);
  CHECK(torchalloc_last_error()[0] != '\0');
  torchalloc_stats after = stats0();
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  void *c = torchalloc_malloc(1000, 0, S0);
  CHECK(c && c != a);
  torchalloc_free(c, 1000, 0, S0);
  torchalloc_free(a, 1000, 0, S0);
  torchalloc_free(b, 12 * MiB, 0, S1);
  CHECK_EQ(stats0().allocation[ALL].current, 0);
  CHECK_EQ(stats0().num_bad_free_size + stats0().num_bad_free_unknown + stats0().num_bad_double_free, 0);
  CHECK_INVARIANTS();
}

TEST(bad_values_name_their_key) {
  static const struct {
    const char *conf, *key;
  } cases[] = {
      {"policy:nope", "policy"},
      {"policy:", "policy"},
      {"policy:Caching", "policy"},
      {"policy:caching2", "policy"},
      {"backend:rocm", "backend"},
      {"backend:", "backend"},
      {"backend:SIM", "backend"},
      {"sim_capacity:80XB", "sim_capacity"},
      {"sim_capacity:-1", "sim_capacity"},
      {"sim_capacity:", "sim_capacity"},
      {"sim_capacity:99999999999TiB", "sim_capacity"},          /* overflows 64 bits */
      {"sim_capacity:18446744073709551616", "sim_capacity"},    /* 2^64 */
      {"sim_capacity:0", "sim_capacity"},
      {"sim_capacity:GiB", "sim_capacity"},
      {"sim_capacity:1.5GiB", "sim_capacity"},
      {"sim_capacity:0x100", "sim_capacity"},
      {"sim_capacity:1 GiB", "sim_capacity"},
      {"sim_capacity:1025TiB", "sim_capacity"},                 /* above 1 PiB */
      {"sim_devices:0", "sim_devices"},
      {"sim_devices:65", "sim_devices"},
      {"sim_devices:-1", "sim_devices"},
      {"sim_devices:two", "sim_devices"},
      {"sim_devices:2x", "sim_devices"},
      {"sim_devices:", "sim_devices"},
      {"sim_fail_alloc:-1", "sim_fail_alloc"},
      {"sim_fail_alloc:x", "sim_fail_alloc"},
      {"warn:2", "warn"},
      {"warn:-1", "warn"},
      {"warn:yes", "warn"},
      {"warn:", "warn"},
      {"stacks:2", "stacks"},
      {"stacks:on", "stacks"},
      {"stacks:", "stacks"},
      {"stack_depth:0", "stack_depth"},
      {"stack_depth:65", "stack_depth"},
      {"stack_depth:-3", "stack_depth"},
      {"stack_depth:deep", "stack_depth"},
      {"log:", "log"},
      {"log_max:lots", "log_max"},
      {"log_max:-1", "log_max"},
  };
  REQUIRE(sim_reset("") == 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char conf[256], needle[64];
    snprintf(conf, sizeof conf, "backend:sim,%s", cases[i].conf);
    snprintf(needle, sizeof needle, "'%s'", cases[i].key);
    check_refused(conf, needle);
    CHECK(strstr(torchalloc_last_error(), "unknown key") == NULL);
  }
  /* The state from sim_reset survives all of that. */
  void *p = torchalloc_malloc(4096, 0, S0);
  CHECK(p != NULL);
  torchalloc_free(p, 4096, 0, S0);
  CHECK_INVARIANTS();
}

/* An integer out of range says the range (it once said only "in range"). */
TEST(bad_integers_say_the_range) {
  check_refused("backend:sim,expandable:4", "or an integer from 0 to 3)");
  check_refused("backend:sim,sim_devices:65", "(expected an integer from 1 to 64)");
  check_refused("backend:sim,stack_depth:x", "(expected an integer from 1 to 64)");
  check_refused("backend:sim,warn:2", "'warn' (expected an integer from 0 to 1)");
  /* sim_lag's range was left out of its message: "from 0 to 0". */
  check_refused("backend:sim,sim_lag:x", "'sim_lag' (expected an integer from 0 to 1000000000)");
  check_refused("backend:sim,sim_lag:-1", "'sim_lag' (expected an integer from 0 to 1000000000)");
  check_refused("backend:sim,sim_lag:1000000001", "'sim_lag' (expected an integer from 0 to 1000000000)");
}

TEST(good_values_of_every_key_are_accepted) {
  static const char *const confs[] = {
      "policy:caching",       "policy:exact",       "policy:phase_arena", "sim_capacity:1",
      "sim_capacity:1024TiB", "sim_devices:1",      "sim_devices:64",     "sim_fail_alloc:0",
      "sim_fail_alloc:3",     "warn:0",             "warn:1",             "stacks:0",
      "stacks:1",             "stack_depth:1",      "stack_depth:64",     "log_max:0",
      "log_max:1GiB",         "sim_lag:0",          "sim_lag:1000000000",
  };
  for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
    char conf[256];
    snprintf(conf, sizeof conf, "backend:sim,warn:0,%s", confs[i]);
    torchalloc_teardown();
    check_accepted(conf);
  }
  torchalloc_teardown();
}

TEST(missing_colon_is_an_error) {
  REQUIRE(sim_reset("") == 0);
  check_refused("backend:sim,warn", "'warn'");
  check_refused("backend:sim,warn", "key:value");
  check_refused("backend", "'backend'");
  check_refused("backend=sim", "'backend=sim'");
  check_refused("backend:sim;policy:exact", "backend"); /* ';' is not a separator: bad backend value */
  CHECK(strcmp(torchalloc_policy_name(), "caching") == 0);
}

TEST(whitespace_and_empty_items_are_tolerated) {
  torchalloc_teardown();
  check_accepted("  backend : sim ,\tsim_capacity :\t1GiB ,, policy: exact , warn:0 , oom_report:off");
  CHECK(strcmp(torchalloc_policy_name(), "exact") == 0);
  void *p = torchalloc_malloc(1 * GiB, 0, S0);
  CHECK(p != NULL);
  CHECK(torchalloc_malloc(512, 0, S0) == NULL); /* the 1 GiB took */
  if (p) torchalloc_free(p, 1 * GiB, 0, S0);
  torchalloc_teardown();
  check_accepted(" , ,backend:sim, ");
  CHECK_EQ(torchalloc_device_count(), 1);
  torchalloc_teardown();
}

TEST(later_keys_override_earlier_ones) {
  torchalloc_teardown();
  check_accepted("backend:sim,warn:0,policy:exact,policy:phase_arena,sim_devices:3,sim_devices:2");
  CHECK(strcmp(torchalloc_policy_name(), "phase_arena") == 0);
  CHECK_EQ(torchalloc_device_count(), 2);
  check_capacity("sim_capacity:1GiB,sim_capacity:2MiB", 2 * MiB);
}

TEST(size_units) {
  check_capacity("sim_capacity:80GiB", 80 * GiB);
  check_capacity("sim_capacity:512MB", 512000000);
  check_capacity("sim_capacity:1024", 1024);
  check_capacity("sim_capacity:1024B", 1024);
  check_capacity("sim_capacity:1KiB", 1024);
  check_capacity("sim_capacity:1K", 1024);
  check_capacity("sim_capacity:3MiB", 3 * MiB);
  check_capacity("sim_capacity:3M", 3 * MiB);
  check_capacity("sim_capacity:2GB", 2000000000);
  check_capacity("sim_capacity:2G", 2 * GiB);
}

TEST(decimal_units_are_not_binary) {
  /* 1000 B: two 512 B requests need 1024. */
  torchalloc_teardown();
  check_accepted("backend:sim,warn:0,oom_report:off,policy:exact,sim_capacity:1KB");
  void *a = torchalloc_malloc(1, 0, S0);
  CHECK(a != NULL);
  CHECK(torchalloc_malloc(1, 0, S0) == NULL);
  if (a) torchalloc_free(a, 1, 0, S0);
  /* 512 MB is not 512 MiB. */
  torchalloc_teardown();
  check_accepted("backend:sim,warn:0,oom_report:off,policy:exact,sim_capacity:512MB");
  CHECK(torchalloc_malloc(512 * MiB, 0, S0) == NULL);
  torchalloc_teardown();
  check_accepted("backend:sim,warn:0,oom_report:off,policy:exact,sim_capacity:512MiB");
  void *b = torchalloc_malloc(512 * MiB, 0, S0);
  CHECK(b != NULL);
  if (b) torchalloc_free(b, 512 * MiB, 0, S0);
  torchalloc_teardown();
}

TEST(two_sim_devices_have_separate_heaps_and_stats) {
  REQUIRE(sim_reset("sim_devices:2") == 0);
  CHECK_EQ(torchalloc_device_count(), 2);
  void *a = torchalloc_malloc(1000, 0, S0);
  void *b = torchalloc_malloc(5 * MiB, 1, S0);
  void *c = torchalloc_malloc(1000, 1, S0);
  REQUIRE(a && b && c);
  CHECK(a != c); /* separate address spaces: the first small block of each device differs */
  torchalloc_stats s0, s1;
  REQUIRE(torchalloc_get_stats(0, &s0) == 0);
  REQUIRE(torchalloc_get_stats(1, &s1) == 0);
  CHECK_EQ(s0.allocation[ALL].current, 1);
  CHECK_EQ(s0.allocated_bytes[ALL].current, 1024);
  CHECK_EQ(s0.reserved_bytes[ALL].current, 2 * MiB);
  CHECK_EQ(s1.allocation[ALL].current, 2);
  CHECK_EQ(s1.allocated_bytes[ALL].current, 1024 + 5 * MiB);
  CHECK_EQ(s1.reserved_bytes[ALL].current, 2 * MiB + 20 * MiB);
  /* A block of device 1 freed on device 0 is unknown there; device 1's block stays. */
  torchalloc_free(b, 5 * MiB, 0, S0);
  REQUIRE(torchalloc_get_stats(0, &s0) == 0);
  REQUIRE(torchalloc_get_stats(1, &s1) == 0);
  CHECK_EQ(s0.num_bad_free_unknown, 1);
  CHECK_EQ(s1.num_bad_free_unknown, 0);
  CHECK_EQ(s1.allocation[ALL].current, 2);
  /* empty_cache of one device leaves the other alone. */
  torchalloc_free(a, 1000, 0, S0);
  CHECK_EQ(torchalloc_empty_cache(0), 2 * MiB);
  REQUIRE(torchalloc_get_stats(1, &s1) == 0);
  CHECK_EQ(s1.reserved_bytes[ALL].current, 22 * MiB);
  torchalloc_free(b, 5 * MiB, 1, S0);
  torchalloc_free(c, 1000, 1, S0);
  CHECK_EQ(torchalloc_check_invariants(0), 0);
  CHECK_EQ(torchalloc_check_invariants(1), 0);
  CHECK_EQ(torchalloc_empty_cache(-1), 22 * MiB);
  REQUIRE(torchalloc_get_stats(1, &s1) == 0);
  CHECK_EQ(s1.reserved_bytes[ALL].current, 0);
  CHECK_EQ(s1.allocation[ALL].allocated, 2);
  /* Device 2 does not exist. */
  CHECK(torchalloc_malloc(512, 2, S0) == NULL);
  CHECK_EQ(torchalloc_get_stats(2, &s1), -1);
}

TEST(each_sim_device_has_its_own_capacity) {
  REQUIRE(sim_reset("sim_devices:2,sim_capacity:64MiB,policy:exact") == 0);
  void *a = torchalloc_malloc(64 * MiB, 0, S0);
  void *b = torchalloc_malloc(64 * MiB, 1, S0);
  CHECK(a != NULL);
  CHECK(b != NULL);
  if (a) torchalloc_free(a, 64 * MiB, 0, S0);
  if (b) torchalloc_free(b, 64 * MiB, 1, S0);
}

TEST(init_is_refused_while_blocks_are_live) {
  REQUIRE(sim_reset("sim_devices:2") == 0);
  void *p = torchalloc_malloc(4096, 1, S0); /* live on device 1 only */
  REQUIRE(p);
  torchalloc_stats before;
  REQUIRE(torchalloc_get_stats(1, &before) == 0);
  CHECK_EQ(torchalloc_init("backend:sim,policy:exact"), -1);
  CHECK(strstr(torchalloc_last_error(), "allocated") != NULL);
  CHECK_EQ(torchalloc_init(NULL), -1);
  CHECK(strcmp(torchalloc_policy_name(), "caching") == 0);
  torchalloc_stats after;
  REQUIRE(torchalloc_get_stats(1, &after) == 0);
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  torchalloc_free(p, 4096, 1, S0);
  CHECK_EQ(torchalloc_check_invariants(1), 0);
  /* Freed: now it is allowed, even with segments still cached. */
  check_accepted("backend:sim,warn:0,policy:exact");
  CHECK(strcmp(torchalloc_policy_name(), "exact") == 0);
  CHECK_EQ(torchalloc_device_count(), 1);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  CHECK_EQ(torchalloc_last_error()[0], '\0'); /* a successful init clears the error */
}

TEST(init_null_reads_the_environment) {
  const char *old = getenv("TORCHALLOC_CONF");
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", old ? old : "");
  torchalloc_teardown();
  setenv("TORCHALLOC_CONF", "backend:sim,warn:0,sim_devices:3,policy:phase_arena", 1);
  int rc = torchalloc_init(NULL);
  int count = torchalloc_device_count();
  char policy[64];
  snprintf(policy, sizeof policy, "%s", torchalloc_policy_name());
  setenv("TORCHALLOC_CONF", "backend:sim,bogus_env_key:1", 1);
  int rc_bad = torchalloc_init(NULL);
  char err[512];
  snprintf(err, sizeof err, "%s", torchalloc_last_error());
  if (old) setenv("TORCHALLOC_CONF", saved, 1);
  else unsetenv("TORCHALLOC_CONF");
  CHECK_EQ(rc, 0);
  CHECK_EQ(count, 3);
  CHECK(strcmp(policy, "phase_arena") == 0);
  CHECK_EQ(rc_bad, -1);
  CHECK(strstr(err, "bogus_env_key") != NULL);
  CHECK_EQ(torchalloc_device_count(), 3); /* the refused init kept the old state */
  torchalloc_teardown();
}

TEST(config_keys_lists_every_key) {
  static const char *const known[] = {"policy", "backend", "sim_capacity", "sim_devices", "sim_fail_alloc",
                                      "warn",   "log",     "log_max",      "stacks",      "stack_depth"};
  const char *keys = torchalloc_config_keys();
  REQUIRE(keys && *keys);
  /* Every key this test knows is listed, as a whole word. */
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    int found = 0;
    for (const char *k = keys; (k = strstr(k, known[i])) != NULL; k++) {
      size_t n = strlen(known[i]);
      if ((k == keys || k[-1] == ' ') && (k[n] == ' ' || k[n] == '\0')) found = 1;
    }
    if (!found) fprintf(stderr, "  key %s missing from \"%s\"\n", known[i], keys);
    CHECK(found);
  }
  /* Every listed key is one the parser knows: an empty value is a bad value
   * for that key, never an unknown key. */
  REQUIRE(sim_reset("") == 0);
  char copy[512];
  snprintf(copy, sizeof copy, "%s", keys);
  int listed = 0;
  for (char *save = NULL, *k = strtok_r(copy, " ", &save); k; k = strtok_r(NULL, " ", &save)) {
    char conf[128], needle[80];
    snprintf(conf, sizeof conf, "backend:sim,%s:", k);
    snprintf(needle, sizeof needle, "'%s'", k);
    check_refused(conf, needle);
    if (strstr(torchalloc_last_error(), "unknown key")) {
      fprintf(stderr, "  listed key %s is unknown to the parser\n", k);
      g_failures++;
    }
    listed++;
  }
  CHECK(listed >= (int)(sizeof known / sizeof known[0]));
}

/* ------------------------------------------------------------------------
 * torchalloc_config_help: the parser's table (config.c) as users and the
 * README see it; what it says must be what the parser does.
 * ---------------------------------------------------------------------- */

typedef struct help_row {
  char key[48], values[160], default_value[32], help[200];
} help_row;

/* `src` into `dst` (`n` bytes); -1 when it does not fit (memcpy: the
 * compiler cannot bound a %s into a field, and a cut field would hide a
 * wrong description). */
static int copy_field(char *dst, size_t n, const char *src) {
  size_t len = strlen(src);
  if (len >= n) return -1;
  memcpy(dst, src, len + 1);
  return 0;
}

/* Split the "key\tvalues\tdefault\thelp\n" lines into `rows`. Returns the
 * number of rows, or -1 (reported) when a line does not have four fields. */
static int read_help(help_row *rows, int max) {
  const char *text = torchalloc_config_help();
  int n = 0;
  for (const char *start = text; *start && n < max; n++) {
    const char *end = strchr(start, '\n');
    char line[600], *field[4] = {line, NULL, NULL, NULL};
    snprintf(line, sizeof line, "%.*s", end ? (int)(end - start) : (int)strlen(start), start);
    int fields = 1;
    for (char *p = line; *p && fields <= 4; p++)
      if (*p == '\t') {
        *p = '\0';
        if (fields < 4) field[fields] = p + 1;
        fields++;
      }
    if (!end || fields != 4) {
      fprintf(stderr, "  torchalloc_config_help line %d is not key, values, default, help: \"%s\"\n", n + 1, start);
      g_failures++;
      return -1;
    }
    if (copy_field(rows[n].key, sizeof rows[n].key, field[0]) || copy_field(rows[n].values, sizeof rows[n].values,
                                                                            field[1]) ||
        copy_field(rows[n].default_value, sizeof rows[n].default_value, field[2]) ||
        copy_field(rows[n].help, sizeof rows[n].help, field[3])) {
      fprintf(stderr, "  torchalloc_config_help line %d has a field longer than this test reads: \"%s\"\n", n + 1,
              start);
      g_failures++;
      return -1;
    }
    start = end + 1;
  }
  return n;
}

TEST(config_help_has_one_row_per_key_in_order) {
  help_row rows[64];
  int n = read_help(rows, 64);
  REQUIRE(n > 0);
  char joined[1024] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    used += (size_t)snprintf(joined + used, sizeof joined - used, "%s%s", i ? " " : "", rows[i].key);
    CHECK(rows[i].values[0] && rows[i].default_value[0] && rows[i].help[0]);
  }
  if (strcmp(joined, torchalloc_config_keys()) != 0) {
    fprintf(stderr, "  help's keys \"%s\"\n  config_keys \"%s\"\n", joined, torchalloc_config_keys());
    g_failures++;
  }
}

/* The help's values are the words of the key's error message. */
TEST(config_help_values_are_what_a_bad_value_is_told) {
  help_row rows[64];
  int n = read_help(rows, 64);
  REQUIRE(n > 0);
  for (int i = 0; i < n; i++) {
    char conf[128], needle[256];
    snprintf(conf, sizeof conf, "backend:sim,%.47s:", rows[i].key); /* the fields' sizes bound them */
    snprintf(needle, sizeof needle, "'%.47s' (expected %.159s)", rows[i].key, rows[i].values);
    check_refused(conf, needle);
  }
}

/* Each default is a value its key accepts, and spelling every default out
 * changes nothing a program sees. */
TEST(config_help_defaults_are_accepted_and_in_force) {
  help_row rows[64];
  int n = read_help(rows, 64);
  REQUIRE(n > 0);
  char all[2048] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    if (strcmp(rows[i].default_value, "none") == 0) continue; /* log: no value means no log */
    char conf[160];
    snprintf(conf, sizeof conf, "%.47s:%.31s,backend:sim,warn:0,oom_report:off", rows[i].key,
             rows[i].default_value);
    torchalloc_teardown();
    check_accepted(conf);
    used += (size_t)snprintf(all + used, sizeof all - used, "%.47s:%.31s,", rows[i].key, rows[i].default_value);
  }
  REQUIRE(used < sizeof all);
  snprintf(all + used, sizeof all - used, "backend:sim,warn:0,oom_report:off");
  int asked_plain = -1, asked_spelled = -1;
  torchalloc_teardown();
  check_accepted("backend:sim,warn:0,oom_report:off");
  char policy[64];
  snprintf(policy, sizeof policy, "%s", torchalloc_policy_name());
  int devices = torchalloc_device_count(), mode = torchalloc_segment_mode(0, &asked_plain);
  torchalloc_teardown();
  check_accepted(all);
  REQUIRE(torchalloc_last_error()[0] == '\0');
  CHECK(strcmp(policy, torchalloc_policy_name()) == 0);
  CHECK_EQ(devices, torchalloc_device_count());
  CHECK_EQ(mode, torchalloc_segment_mode(0, &asked_spelled));
  CHECK_EQ(asked_plain, asked_spelled);
  CHECK_EQ(asked_plain, 3); /* reclaim */
  torchalloc_teardown();
}

/* `handle` given holds under a memory fraction; its default does not
 * (config.h): the default is stored without the key's given flag. */
TEST(the_default_handle_is_not_a_given_one) {
  ta_config c;
  ta_config_defaults(&c);
  CHECK_EQ(c.large_handle, TA_DEFAULT_LARGE_HANDLE);
  CHECK_EQ(c.large_handle_set, 0);
  char err[256];
  REQUIRE(ta_config_parse(&c, "handle:8MiB", err, sizeof err) == 0);
  CHECK_EQ(c.large_handle, TA_DEFAULT_LARGE_HANDLE);
  CHECK_EQ(c.large_handle_set, 1);
}

/* ------------------------------------------------------------------------
 * Regressions: behaviour the core once got wrong.
 * ---------------------------------------------------------------------- */

/* A block freed after record_stream waits in the pending list (even on the
 * sim device, where its events are already complete) until the next malloc
 * or empty_cache. Meanwhile torchalloc_init counts it as live and refuses
 * with "blocks are still allocated", though the caller freed everything and
 * allocation.current is 0. */
TEST(init_accepted_after_freeing_a_record_stream_block) {
  REQUIRE(sim_reset("") == 0);
  void *p = torchalloc_malloc(4096, 0, S0);
  REQUIRE(p);
  torchalloc_record_stream(p, S1);
  torchalloc_free(p, 4096, 0, S0);
  CHECK_EQ(stats0().allocation[ALL].current, 0);
  check_accepted("backend:sim,warn:0");
}

/* Every size the message allows is accepted: 1 PiB was refused while the
 * message said "between 1 B and 1 PiB" (no unit spelled a petabyte). */
TEST(the_largest_size_a_message_names_is_accepted) {
  static const struct {
    const char *conf;
    size_t bytes;
  } sizes[] = {{"sim_capacity:1PiB", (size_t)1 << 50}, {"sim_capacity:1P", (size_t)1 << 50},
               {"sim_capacity:1PB", (size_t)1000000000000000}, {"sim_capacity:1024TiB", (size_t)1 << 50}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    ta_config c;
    char err[512] = "";
    ta_config_defaults(&c);
    CHECK_EQ(ta_config_parse(&c, sizes[i].conf, err, sizeof err), 0);
    CHECK_EQ(c.sim_capacity, sizes[i].bytes);
    if (err[0]) fprintf(stderr, "  %s: %s\n", sizes[i].conf, err);
  }
  torchalloc_teardown();
  check_accepted("backend:sim,warn:0,sim_capacity:1PiB");
  torchalloc_teardown();
  check_refused("backend:sim,sim_capacity:1025TiB", "between 1 B and 1 PiB");
}

/* A long bad value is shown cut, so the message keeps what the key expects
 * (it was cut at 511 bytes, "(expected ...)" lost). */
TEST(a_long_bad_value_keeps_the_expected_part) {
  char conf[2048];
  int n = snprintf(conf, sizeof conf, "backend:sim,sim_capacity:");
  memset(conf + n, '9', 1500);
  snprintf(conf + n + 1500, sizeof conf - (size_t)n - 1500, "x");
  check_refused(conf, "(expected a size such as 80GiB, between 1 B and 1 PiB)");
  CHECK(strlen(torchalloc_last_error()) < 300);
  CHECK(strstr(torchalloc_last_error(), "1501 characters") != NULL);
  n = snprintf(conf, sizeof conf, "backend:sim,");
  memset(conf + n, 'k', 1000);
  snprintf(conf + n + 1000, sizeof conf - (size_t)n - 1000, ":1");
  check_refused(conf, "unknown key");
  CHECK(strstr(torchalloc_last_error(), "(known keys: ") != NULL);
  CHECK(strstr(torchalloc_last_error(), "sim_held_elsewhere") != NULL);
}

/* Another user's memory on a sim device is part of that device: more than
 * its capacity cannot be held elsewhere (2^64-1 was accepted). */
TEST(memory_held_elsewhere_fits_on_the_device) {
  check_refused("backend:sim,sim_capacity:1GiB,sim_held_elsewhere:18446744073709551615", "'sim_held_elsewhere'");
  check_refused("backend:sim,sim_capacity:1GiB,sim_held_elsewhere:2GiB",
                "sim_held_elsewhere 2.00 GiB is more than sim_capacity");
  check_refused("backend:sim,sim_held_elsewhere:2GiB,sim_capacity:1GiB", "more than sim_capacity");
  torchalloc_teardown();
  check_accepted("backend:sim,warn:0,sim_capacity:1GiB,sim_held_elsewhere:1GiB");
  CHECK(torchalloc_try_malloc(512, 0, S0) == NULL); /* all of it held elsewhere */
  torchalloc_teardown();
}

/* A fraction just past 1 is named as given ("memory fraction 1 is outside
 * [0, 1]" was the message for 1.0000001). */
TEST(a_refused_memory_fraction_is_shown_as_given) {
  REQUIRE(sim_reset("sim_capacity:1GiB") == 0);
  torchalloc_set_memory_fraction(1.0000001, 0);
  CHECK(strstr(torchalloc_last_error(), "memory fraction 1.0000001 is outside [0, 1]") != NULL);
  torchalloc_set_memory_fraction(1.0 + 1e-15, 0);
  CHECK(strstr(torchalloc_last_error(), "memory fraction 1.000000000000001 is outside [0, 1]") != NULL);
  torchalloc_set_memory_fraction(-0.5, 0);
  CHECK(strstr(torchalloc_last_error(), "memory fraction -0.5 is outside [0, 1]") != NULL);
  torchalloc_teardown();
}
