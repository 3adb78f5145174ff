#include "text.h"

#include <stdio.h>

ta_size_text ta_format_size(uint64_t bytes) {
  ta_size_text t;
  if (bytes <= 1024) snprintf(t.text, sizeof t.text, "%llu bytes", (unsigned long long)bytes);
  else if (bytes <= ((uint64_t)1 << 20)) snprintf(t.text, sizeof t.text, "%.2f KiB", (double)bytes / 1024.0);
  else if (bytes <= ((uint64_t)1 << 30)) snprintf(t.text, sizeof t.text, "%.2f MiB", (double)bytes / 1048576.0);
  else snprintf(t.text, sizeof t.text, "%.2f GiB", (double)bytes / 1073741824.0);
  return t;
}
