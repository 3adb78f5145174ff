/* libFuzzer target: the public C API on the simulated device, driven by
 * api_driver.c (the byte format and every check are described in
 * api_driver.h). One input is one fresh allocator: its first 8 bytes are
 * the configuration, every further 8 bytes one operation; a full check
 * follows every operation.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined when
 * -DTORCHALLOC_FUZZ=ON (tests/run.sh runs it for $FUZZ_SECONDS); without
 * libFuzzer, fuzz_corpus_main.c replays the committed corpus through the
 * same function. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_driver.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's own statistics count inputs; the figures that matter are the
 * operations behind them, printed when it exits (-max_total_time,
 * -runs). Only libFuzzer calls LLVMFuzzerInitialize: the corpus replayer
 * prints its own line. */
static void print_totals(void) {
  const drv_counts *n = drv_totals();
  fprintf(stderr,
          "fuzz_api: %llu operations executed: %llu blocks handed out, %llu freed, %llu OOMs, %llu bad calls "
          "refused, %llu captures, %llu full checks, 0 violations\n",
          (unsigned long long)n->ops, (unsigned long long)n->mallocs, (unsigned long long)n->frees,
          (unsigned long long)n->ooms, (unsigned long long)n->misuse, (unsigned long long)n->captures,
          (unsigned long long)n->checks);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  atexit(print_totals);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t config[DRV_CONFIG_BYTES] = {0};
  memcpy(config, data, size < DRV_CONFIG_BYTES ? size : DRV_CONFIG_BYTES);
  drv_start(config, 1);
  for (size_t at = DRV_CONFIG_BYTES; at + DRV_OP_BYTES <= size; at += DRV_OP_BYTES) drv_step(data + at);
  drv_finish();
  return 0;
}
