/* Replays fuzz inputs through LLVMFuzzerTestOneInput without libFuzzer:
 * every file named on the command line, and every file in every directory
 * named. ctest runs it over tests/fuzz/corpus/api in every build (gcc,
 * ASan+UBSan, TSan), so the corpus guards against regressions even where
 * clang's libFuzzer is missing. A failed check aborts, as under libFuzzer.
 * Linked with api_driver.c, whose totals it prints. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api_driver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  uint8_t *data = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap && !(data = realloc(data, cap = cap ? cap * 2 : 4096))) break;
    size_t got = fread(data + len, 1, cap - len, f);
    if (!got) break;
    len += got;
  }
  fclose(f);
  if (!data) return -1;
  LLVMFuzzerTestOneInput(data, len);
  free(data);
  return 0;
}

int main(int argc, char **argv) {
  int inputs = 0, errors = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "cannot read %s\n", argv[i]);
      errors++;
    } else if (S_ISDIR(st.st_mode)) {
      DIR *dir = opendir(argv[i]);
      for (struct dirent *e; dir && (e = readdir(dir));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
        if (run_file(path) == 0) inputs++;
        else errors++;
      }
      if (dir) closedir(dir);
    } else if (run_file(argv[i]) == 0) {
      inputs++;
    } else {
      errors++;
    }
  }
  const drv_counts *n = drv_totals();
  printf("%d inputs replayed: %llu operations, %llu blocks handed out, %llu freed, %llu OOMs, %llu bad calls "
         "refused, %llu captures, %llu full checks\n",
         inputs, (unsigned long long)n->ops, (unsigned long long)n->mallocs, (unsigned long long)n->frees,
         (unsigned long long)n->ooms, (unsigned long long)n->misuse, (unsigned long long)n->captures,
         (unsigned long long)n->checks);
  printf("%d passed, %d failed\n", inputs, errors);
  return errors || !inputs ? 1 : 0;
}
