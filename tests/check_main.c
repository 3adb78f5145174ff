#include "check.h"

test_case g_tests[MAX_TESTS];
int g_ntests;
int g_failures;

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  for (int i = 0; i < g_ntests; i++) {
    if (argc > 1 && !strstr(g_tests[i].name, argv[1])) continue;
    g_failures = 0;
    g_tests[i].fn();
    if (g_failures) {
      failed++;
      fprintf(stderr, "FAIL %s\n", g_tests[i].name);
    } else {
      passed++;
      printf("ok   %s\n", g_tests[i].name);
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
