#include "accounting/misuse.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

static const char *const counter_names[TA_MISUSE_KINDS] = {
    "num_bad_free_unknown", "num_bad_double_free", "num_bad_free_size", "num_bad_size", "num_bad_device",
    "num_bad_free_unknown", "num_bad_free_stream",
};

static atomic_int printed[TA_MISUSE_KINDS];

void ta_misuse_report(int warn, enum ta_misuse_kind kind, const char *fmt, ...) {
  if (!warn || atomic_exchange(&printed[kind], 1)) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "torchalloc: warning: %s (printed once; every occurrence is counted in stats as %s)\n", msg,
          counter_names[kind]);
}

void ta_misuse_reset(void) {
  for (int k = 0; k < TA_MISUSE_KINDS; k++) atomic_store(&printed[k], 0);
}
