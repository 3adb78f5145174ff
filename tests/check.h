/* A minimal test harness: TEST(name) registers a function, CHECK* records a
 * failure with file:line and continues, main() runs every test and ends with
 * the line "N passed, N failed". */
#ifndef TA_TEST_CHECK_H
#define TA_TEST_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*: a seeded random run, the same every time (the state must
 * not start at 0). */
static inline uint64_t check_xorshift64star(uint64_t *state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return *state * 0x2545F4914F6CDD1Dull;
}

typedef void (*test_fn)(void);
typedef struct test_case {
  const char *name;
  test_fn fn;
} test_case;

#define MAX_TESTS 256
extern test_case g_tests[MAX_TESTS];
extern int g_ntests;
extern int g_failures; /* failures in the running test */

#define TEST(fn_)                                                           \
  static void fn_(void);                                                    \
  __attribute__((constructor)) static void register_##fn_(void) {           \
    g_tests[g_ntests].name = #fn_;                                          \
    g_tests[g_ntests++].fn = fn_;                                           \
  }                                                                         \
  static void fn_(void)

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      g_failures++;                                                              \
    }                                                                            \
  } while (0)

#define CHECK_EQ(a, b)                                                                                  \
  do {                                                                                                  \
    long long va_ = (long long)(a), vb_ = (long long)(b);                                               \
    if (va_ != vb_) {                                                                                   \
      fprintf(stderr, "  %s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b, va_, vb_); \
      g_failures++;                                                                                     \
    }                                                                                                   \
  } while (0)

#define REQUIRE(cond)                                                              \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "  %s:%d: REQUIRE(%s) failed\n", __FILE__, __LINE__, #cond); \
      g_failures++;                                                                \
      return;                                                                      \
    }                                                                              \
  } while (0)

#endif
