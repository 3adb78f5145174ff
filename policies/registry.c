/* Policies by name and id. The id is stored in every block, so a block is
 * freed to the policy that made it whatever policy is current. */
#include <string.h>

#include "policy.h"

static const ta_policy_ops *const all_policies[TA_NPOLICIES] = {
    [TA_POLICY_CACHING] = &ta_caching_policy,
    [TA_POLICY_EXACT] = &ta_exact_policy,
    [TA_POLICY_PHASE_ARENA] = &ta_phase_arena_policy,
};

const ta_policy_ops *ta_policy_by_name(const char *name, uint8_t *id) {
  for (uint8_t i = 0; i < TA_NPOLICIES; i++) {
    if (strcmp(all_policies[i]->name, name) == 0) {
      if (id) *id = i;
      return all_policies[i];
    }
  }
  return NULL;
}

const ta_policy_ops *ta_policy_by_id(uint8_t id) { return id < TA_NPOLICIES ? all_policies[id] : NULL; }
