/* Why a request failed, decided from a few numbers: the one rule behind
 * the OOM report at the failure, torchalloc.last_oom() and `torchalloc
 * report` on a log (which calls torchalloc_oom_verdict with the numbers it
 * read back). A leaf: it calls nothing. */
#ifndef TA_OOM_VERDICT_H
#define TA_OOM_VERDICT_H

#include "base/common.h"
#include "torchalloc_oom.h"

/* TORCHALLOC_OOM_*; see oom_verdict.c for the rule. */
ta_internal int ta_oom_verdict(const torchalloc_oom_facts *f);
/* What a verdict means, in a few words ("the bytes were there, ..."); the
 * advice, computed from the numbers, is oom_advice.h's. */
ta_internal const char *ta_oom_verdict_meaning(int verdict);
ta_internal const char *ta_oom_verdict_name(int verdict);

#endif
