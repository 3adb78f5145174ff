/* Sizes in words, as PyTorch's own messages print them ("64.00 MiB"), so a
 * torchalloc OOM message reads like the one users know. */
#ifndef TA_TEXT_H
#define TA_TEXT_H

#include "base/common.h"

typedef struct ta_size_text {
  char text[32];
} ta_size_text;

/* "512 bytes", "1.50 KiB", "64.00 MiB", "3.96 GiB" (c10's format_size). */
ta_internal ta_size_text ta_format_size(uint64_t bytes);

/* A growing string for reports built at rare moments (an OOM): appends never
 * fail loudly; without host memory the text just stops growing. */
typedef struct ta_text {
  char *data;
  size_t len, cap;
} ta_text;

ta_internal void ta_text_printf(ta_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text, or "" when nothing could be kept; ta_text_free releases it. */
ta_internal const char *ta_text_str(const ta_text *t);
ta_internal void ta_text_free(ta_text *t);

#endif
