/* The list of policies, between them and the registry: each policy file in
 * policies/ defines its ops table `ta_NAME_policy`; TA_POLICY_LIST names
 * every one of them once, and the registry builds its table from it. */
#ifndef TA_POLICY_LIST_H
#define TA_POLICY_LIST_H

#include "policy/policy.h"

/* Every policy, in id order. The id is an index into this list, stored in
 * every block and every log record, so a new policy goes at the end (and its
 * name into python/torchalloc/_records.py's POLICY_NAMES, which a test
 * compares with this list). The first entry is the default policy. */
#define TA_POLICY_LIST(X) \
  X(caching)              \
  X(exact)                \
  X(phase_arena)

#define TA_DECLARE_POLICY(name) ta_internal extern const ta_policy_ops ta_##name##_policy;
TA_POLICY_LIST(TA_DECLARE_POLICY)
#undef TA_DECLARE_POLICY

#endif
