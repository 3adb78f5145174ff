#include "base/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

ta_size_text ta_format_size(uint64_t bytes) {
  ta_size_text t;
  if (bytes <= 1024) snprintf(t.text, sizeof t.text, "%llu bytes", (unsigned long long)bytes);
  else if (bytes <= ((uint64_t)1 << 20)) snprintf(t.text, sizeof t.text, "%.2f KiB", (double)bytes / 1024.0);
  else if (bytes <= ((uint64_t)1 << 30)) snprintf(t.text, sizeof t.text, "%.2f MiB", (double)bytes / 1048576.0);
  else snprintf(t.text, sizeof t.text, "%.2f GiB", (double)bytes / 1073741824.0);
  return t;
}

void ta_text_printf(ta_text *t, const char *fmt, ...) {
  for (int attempt = 0; attempt < 2; attempt++) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->data ? t->data + t->len : NULL, t->data ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->data && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    if (ta_grow(&t->data, &t->cap, t->len + (size_t)n + 1, 4096)) {
      if (t->data) t->data[t->len] = '\0'; /* keep what fitted */
      return;
    }
  }
}

const char *ta_text_str(const ta_text *t) { return t->data ? t->data : ""; }

void ta_text_free(ta_text *t) {
  free(t->data);
  t->data = NULL;
  t->len = t->cap = 0;
}
