/* Between the registry and the policies it lists: each policy file defines
 * its ops table, the registry collects them. */
#ifndef TA_REGISTRY_H
#define TA_REGISTRY_H

#include "../allocator/policy.h"

ta_internal extern const ta_policy_ops ta_caching_policy;
ta_internal extern const ta_policy_ops ta_exact_policy;
ta_internal extern const ta_policy_ops ta_phase_arena_policy;

#endif
