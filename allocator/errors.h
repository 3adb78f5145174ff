/* The thread-local "why did the last control call fail" message. */
#ifndef TA_ERRORS_H
#define TA_ERRORS_H

#include "common.h"

ta_internal void ta_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
