#include "base/errors.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

void ta_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
}

void ta_clear_error(void) { last_error[0] = '\0'; }

const char *ta_error_text(void) { return last_error; }
