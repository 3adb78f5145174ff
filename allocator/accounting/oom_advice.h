/* The advice for an out-of-memory failure, computed from the numbers at the
 * failure (the verdict's facts and the segments' detail): one line per thing
 * to try, each with the figures that make it worth trying and what they
 * rest on. The one rule behind the summary (the bridge's OutOfMemoryError,
 * the plain route's last words), the report file and `torchalloc report`
 * (which calls torchalloc_oom_advice with the numbers it reads from a log).
 * A leaf: it formats sizes (base/) and calls nothing else. */
#ifndef TA_OOM_ADVICE_H
#define TA_OOM_ADVICE_H

#include "base/common.h"
#include "torchalloc_oom.h"

/* The settings the advice names, spelt as TORCHALLOC_CONF takes them.
 * Expandable segments are advised in the reclaim mode, install()'s default
 * where the driver has virtual memory (a run that fails without them set
 * expandable:0 or had no VMM): it serves what expandable:1 serves and
 * reserves less. `torchalloc report` maps each to the replay variant that
 * checks it (replay/oom_alternatives.py). */
#define TA_ADVICE_EXPANDABLE "expandable:reclaim"
#define TA_ADVICE_PHASES "policy:phase_arena"

/* A phase's name for the advice (NULL: "phase N"). */
typedef const char *(*ta_oom_phase_namer)(void *ctx, int phase);

/* The advice lines into buf, each "<indent><n>. <line>\n"; `d` may be NULL.
 * Returns the length the whole text needs (snprintf's convention). No
 * allocation: it runs while the heap reports a failure. */
ta_internal int ta_oom_advice_write(const torchalloc_oom_facts *f, const torchalloc_oom_detail *d,
                                    ta_oom_phase_namer name, void *ctx, const char *indent, char *buf, size_t len);

#endif
