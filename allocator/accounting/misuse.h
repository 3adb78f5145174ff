/* Bad input from the caller: reported once per kind on stderr, counted
 * always, and never allowed to touch a live block. */
#ifndef TA_MISUSE_H
#define TA_MISUSE_H

#include "base/common.h"

enum ta_misuse_kind {
  TA_MISUSE_FREE_UNKNOWN,
  TA_MISUSE_DOUBLE_FREE,
  TA_MISUSE_FREE_SIZE,
  TA_MISUSE_BAD_SIZE,
  TA_MISUSE_BAD_DEVICE,
  TA_MISUSE_RECORD_STREAM_UNKNOWN,
  TA_MISUSE_FREE_STREAM,
  TA_MISUSE_KINDS
};

/* Prints "torchalloc: warning: <message> (...)" the first time `kind` is seen
 * in this process when `warn` is set; silent afterwards. */
ta_internal void ta_misuse_report(int warn, enum ta_misuse_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Forget which kinds were printed (torchalloc_init does this). */
ta_internal void ta_misuse_reset(void);

#endif
