/* roundup_power2_divisions on the sim device: the block sizes PyTorch's
 * caching allocator gives a table of requests (round_size and
 * roundup_power2_next_division of c10/cuda/CUDACachingAllocator.cpp, the
 * option's syntax of c10/core/AllocatorConfig.cpp, torch 2.11), whether the
 * option comes from TORCHALLOC_CONF or from PyTorch's settings string, under
 * every policy and memory mode; the caller's requested bytes stay what it
 * asked for. */
#include "sim.h"

typedef struct rounding {
  size_t request, block; /* what PyTorch's allocator makes a block of for that request */
} rounding;

/* roundup_power2_divisions:4. 1200 and 2048: below 4 x 512 B the 512 B
 * rounding holds; 1 MiB + 1 in steps of 256 KiB; 84 MiB (PyTorch's
 * test_allocator_settings: 21 Mi floats) in steps of 16 MiB. */
static const rounding by_4[] = {
    {1, 512},
    {1200, 1536},
    {2048, 2048},
    {3000, 3072},
    {5000, 5120},
    {9000, 10240}, /* 512 B rounding would give 9216 */
    {1048576, 1048576},
    {1048577, 1310720},
    {3145733, 3670016},
    {88080384, 100663296},
    {8388608, 8388608}, /* a power of 2 stays */
    {629145600, 671088640},
    {1610612737, 1879048192},
};

/* [256:1,512:2,>:8]: 1 below 512 MiB (the first entry covers those below
 * it), 2 from 512 MiB, 8 from 1 GiB. */
static const rounding by_list[] = {
    {3000, 3072},
    {1048577, 1049088},
    {3145733, 3146240},
    {88080384, 88080384},
    {629145600, 805306368},
    {1610612736, 1610612736},
    {1610612737, 1744830464},
};

/* [2:4,>:16]: 4 up to 4 MiB, 16 above. */
static const rounding by_short_list[] = {
    {1048577, 1310720},
    {3145733, 3670016},
    {88080384, 88080384},
    {629145600, 637534208},
    {1610612737, 1677721600},
};

/* Each request alone on a fresh device: its block's size (allocated bytes)
 * and the bytes the caller asked for (requested bytes). */
static void check_table(const char *conf, const char *settings, const rounding *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (sim_reset(conf) != 0) {
      g_failures++;
      return;
    }
    if (settings && torchalloc_set_allocator_settings(settings) != 0) {
      fprintf(stderr, "  torchalloc_set_allocator_settings(\"%s\"): %s\n", settings, torchalloc_last_error());
      g_failures++;
      return;
    }
    void *p = torchalloc_malloc(t[i].request, 0, S0);
    torchalloc_stats s = stats0();
    if (!p || s.allocated_bytes[ALL].current != (int64_t)t[i].block ||
        s.requested_bytes[ALL].current != (int64_t)t[i].request) {
      fprintf(stderr, "  conf \"%s\", settings \"%s\": request %zu gave a block of %lld (requested %lld), "
                      "PyTorch's is %zu\n",
              conf, settings ? settings : "", t[i].request, (long long)s.allocated_bytes[ALL].current,
              (long long)s.requested_bytes[ALL].current, t[i].block);
      g_failures++;
    }
    if (p) torchalloc_free(p, t[i].request, 0, S0);
    CHECK_INVARIANTS();
    CHECK_EQ(stats0().requested_bytes[ALL].current, 0);
  }
}

#define N(t) (sizeof t / sizeof t[0])

TEST(torchalloc_conf_gives_pytorchs_sizes_under_every_policy) {
  static const char *const modes[] = {
      "policy:caching",     "policy:caching,expandable:reclaim", "policy:caching,expandable:on",
      "policy:phase_arena", "policy:phase_arena,expandable:reclaim", "policy:exact",
  };
  char conf[256];
  for (size_t m = 0; m < N(modes); m++) {
    snprintf(conf, sizeof conf, "%s,roundup_power2_divisions:4", modes[m]);
    check_table(conf, NULL, by_4, N(by_4));
    snprintf(conf, sizeof conf, "roundup_power2_divisions:[256:1,512:2,>:8],%s", modes[m]);
    check_table(conf, NULL, by_list, N(by_list));
  }
  check_table("roundup_power2_divisions: [ 2:4 , >:16 ]", NULL, by_short_list, N(by_short_list));
}

TEST(pytorch_settings_give_pytorchs_sizes) {
  check_table("", "roundup_power2_divisions:4", by_4, N(by_4));
  check_table("policy:exact", "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:8],"
                              "max_split_size_mb:200",
              by_list, N(by_list));
  check_table("", "garbage_collection_threshold:0.5,roundup_power2_divisions:[2:4,>:16]", by_short_list,
              N(by_short_list));
}

TEST(a_settings_string_without_the_option_resets_it_as_pytorch_does) {
  REQUIRE(sim_reset("roundup_power2_divisions:4") == 0);
  void *a = torchalloc_malloc(9000, 0, S0); /* 4 divisions: steps of 2 KiB between 8 and 16 KiB */
  REQUIRE(a);
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 10240);
  REQUIRE(torchalloc_set_allocator_settings("expandable_segments:False") == 0);
  void *b = torchalloc_malloc(9000, 0, S0);
  REQUIRE(b);
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 10240 + 9216); /* 9000 rounds to 512 B again */
  REQUIRE(torchalloc_set_allocator_settings("roundup_power2_divisions:8") == 0);
  void *c = torchalloc_malloc(17000, 0, S0); /* 8 divisions: steps of 2 KiB between 16 and 32 KiB */
  REQUIRE(c);
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 10240 + 9216 + 18432);
  torchalloc_free(a, 9000, 0, S0); /* freed with the sizes asked for, whatever the blocks' */
  torchalloc_free(b, 9000, 0, S0);
  torchalloc_free(c, 17000, 0, S0);
  torchalloc_stats s = stats0();
  CHECK_EQ(s.allocated_bytes[ALL].current, 0);
  CHECK_EQ(s.requested_bytes[ALL].current, 0);
  CHECK_EQ(s.num_bad_free_size, 0);
  CHECK_INVARIANTS();
}

TEST(the_default_rounds_to_512_bytes) {
  REQUIRE(sim_reset("") == 0);
  void *p = torchalloc_malloc(88080384 + 1, 0, S0);
  REQUIRE(p);
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 88080384 + 512);
  torchalloc_free(p, 88080384 + 1, 0, S0);
}

/* The settings must be refused with a message containing `needle`, and change nothing. */
static void check_settings_refused(const char *settings, const char *needle) {
  int rc = torchalloc_set_allocator_settings(settings);
  const char *err = torchalloc_last_error();
  if (rc != -1 || !strstr(err, needle)) {
    fprintf(stderr, "  torchalloc_set_allocator_settings(\"%s\") = %d, \"%s\" (expected -1 and \"%s\")\n", settings,
            rc, err, needle);
    g_failures++;
  }
}

static void check_conf_refused(const char *conf, const char *needle) {
  torchalloc_teardown();
  int rc = torchalloc_init(conf);
  const char *err = torchalloc_last_error();
  if (rc != -1 || !strstr(err, needle)) {
    fprintf(stderr, "  torchalloc_init(\"%s\") = %d, \"%s\" (expected -1 and \"%s\")\n", conf, rc, err, needle);
    g_failures++;
  }
}

TEST(bad_values_are_refused_with_the_reason) {
  check_conf_refused("backend:sim,roundup_power2_divisions:3", "'3' is not a power of 2, or a list");
  check_conf_refused("backend:sim,roundup_power2_divisions:0", "'0' is not a power of 2");
  check_conf_refused("backend:sim,roundup_power2_divisions:[300:2]", "'300' is not a size in MiB that is a power of 2");
  check_conf_refused("backend:sim,roundup_power2_divisions:[256:3]", "needs ':' and 0 or a power of 2");
  check_conf_refused("backend:sim,roundup_power2_divisions:[256:2", "closing ']'");
  check_conf_refused("backend:sim,roundup_power2_divisions:4]", "']' after the value");
  check_conf_refused("backend:sim,roundup_power2_divisions:[256:2:512:4]", "closing ']'");
  REQUIRE(sim_reset("roundup_power2_divisions:4") == 0);
  check_settings_refused("roundup_power2_divisions:5", "'5' is not a power of 2");
  check_settings_refused("roundup_power2_divisions", "'roundup_power2_divisions' is not key:value");
  check_settings_refused("max_split_size_mb:[1,2", "opens a list that does not close");
  check_settings_refused("expandable_segments:True;roundup_power2_divisions:2", "',' expected after the value");
  void *p = torchalloc_malloc(9000, 0, S0); /* the refused strings changed nothing */
  REQUIRE(p);
  CHECK_EQ(stats0().allocated_bytes[ALL].current, 10240);
  torchalloc_free(p, 9000, 0, S0);
}
