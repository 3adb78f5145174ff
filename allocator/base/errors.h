/* The thread-local "why did the last control call fail" message that
 * torchalloc_last_error() returns. The bottom layer: every other file may
 * set it, it calls nothing. */
#ifndef TA_ERRORS_H
#define TA_ERRORS_H

#include "base/common.h"

ta_internal void ta_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
ta_internal void ta_clear_error(void);
/* The calling thread's message; "" when the last call succeeded. */
ta_internal const char *ta_error_text(void);

#endif
