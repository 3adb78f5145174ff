/* Sizes in words, as PyTorch's own messages print them ("64.00 MiB"), so a
 * torchalloc OOM message reads like the one users know. */
#ifndef TA_TEXT_H
#define TA_TEXT_H

#include "common.h"

typedef struct ta_size_text {
  char text[32];
} ta_size_text;

/* "512 bytes", "1.50 KiB", "64.00 MiB", "3.96 GiB" (c10's format_size). */
ta_internal ta_size_text ta_format_size(uint64_t bytes);

#endif
