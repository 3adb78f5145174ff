/* Public out-of-memory functions: the last failure in words (torchalloc.h:
 * summary, report, where the report went) and in numbers with the rules its
 * words rest on (torchalloc_oom.h: facts, detail, verdict, advice). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accounting/oom_advice.h"
#include "accounting/oom_verdict.h"
#include "runtime/runtime.h"
#include "torchalloc_oom.h"

TORCHALLOC_API int torchalloc_oom_summary(int device, char *buf, size_t len) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_oom_info oom;
  ta_heap_last_oom(h, &oom);
  if (!oom.count) {
    if (buf && len) buf[0] = '\0';
    return 0;
  }
  return ta_heap_format_oom(&oom, device, buf, len);
}

TORCHALLOC_API int torchalloc_last_oom(int device, torchalloc_oom_facts *facts, int *verdict) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  ta_oom_info oom;
  ta_heap_last_oom(h, &oom);
  if (facts) *facts = oom.count ? oom.facts : (torchalloc_oom_facts){0};
  if (verdict) *verdict = oom.count ? oom.verdict : TORCHALLOC_OOM_NONE;
  return 0;
}

TORCHALLOC_API int torchalloc_last_oom_detail(int device, torchalloc_oom_detail *detail) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h || !detail || detail->struct_size < sizeof(uint64_t)) return -1;
  ta_oom_info oom;
  ta_heap_last_oom(h, &oom);
  torchalloc_oom_detail d = oom.count ? oom.detail : (torchalloc_oom_detail){0};
  /* No byte past what the caller's struct has: an older caller's is shorter. */
  size_t n = detail->struct_size < sizeof d ? (size_t)detail->struct_size : sizeof d;
  d.struct_size = n;
  memcpy(detail, &d, n);
  return 0;
}

TORCHALLOC_API int torchalloc_oom_report(int device, char *buf, size_t len) {
  ta_heap *h = ta_runtime_heap_for_control(device);
  if (!h) return -1;
  char *text = ta_heap_oom_report_copy(h);
  int n = snprintf(buf, buf ? len : 0, "%s", text ? text : "");
  free(text);
  return n;
}

TORCHALLOC_API const char *torchalloc_oom_report_path(int device) {
  static _Thread_local char path[1024];
  ta_heap *h = ta_runtime_heap_for_control(device);
  path[0] = '\0';
  if (h) {
    ta_oom_info oom;
    ta_heap_last_oom(h, &oom);
    snprintf(path, sizeof path, "%s", oom.report_path);
  }
  return path;
}

TORCHALLOC_API const char *torchalloc_oom_facts_fields(void) {
  return TORCHALLOC_OOM_FACTS_FIELDS(TORCHALLOC_FIELD_LINE);
}

TORCHALLOC_API int torchalloc_oom_verdict(const torchalloc_oom_facts *facts) {
  return facts ? ta_oom_verdict(facts) : -1;
}

/* torchalloc_oom_advice's phase names come from an array (a log's names,
 * from Python): ta_oom_advice_write asks for each through this. */
typedef struct name_table {
  const char *const *names;
  size_t n;
} name_table;

static const char *from_table(void *ctx, int phase) {
  const name_table *t = ctx;
  return t->names && phase >= 0 && (size_t)phase < t->n ? t->names[phase] : NULL;
}

TORCHALLOC_API int torchalloc_oom_advice(const torchalloc_oom_facts *facts, const torchalloc_oom_detail *detail,
                                         const char *const *phase_names, size_t nnames, char *buf, size_t len) {
  if (!facts) return -1;
  torchalloc_oom_detail d = {0};
  if (detail) { /* only the bytes the caller's struct has; the rest stays 0 */
    size_t n = detail->struct_size < sizeof d ? (size_t)detail->struct_size : sizeof d;
    memcpy(&d, detail, n);
  }
  name_table t = {phase_names, nnames};
  return ta_oom_advice_write(facts, detail ? &d : NULL, from_table, &t, "", buf, len);
}
