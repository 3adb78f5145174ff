/* The registry: every policy, by name and id (policy.h), built from
 * TA_POLICY_LIST (policy_list.h). A block stores its policy's id, so it is
 * freed to the policy that made it, whatever policy is current. The core
 * finds policies only through these functions: it names none. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "policy_list.h"

#define TA_POLICY_ENTRY(name) &ta_##name##_policy,
static const ta_policy_ops *const all_policies[] = {TA_POLICY_LIST(TA_POLICY_ENTRY)};
#undef TA_POLICY_ENTRY
#define NPOLICIES ((int)(sizeof all_policies / sizeof all_policies[0]))
_Static_assert(sizeof all_policies / sizeof all_policies[0] <= TA_MAX_POLICIES, "raise TA_MAX_POLICIES");

int ta_policy_count(void) { return NPOLICIES; }

const ta_policy_ops *ta_policy_by_name(const char *name, uint8_t *id) {
  for (int i = 0; name && i < NPOLICIES; i++) {
    if (strcmp(all_policies[i]->name, name) == 0) {
      if (id) *id = (uint8_t)i;
      return all_policies[i];
    }
  }
  return NULL;
}

const ta_policy_ops *ta_policy_by_id(uint8_t id) { return id < NPOLICIES ? all_policies[id] : NULL; }

uint8_t ta_policy_for_private_pools(void) { return 0; /* caching */ }

/* Both lists are built once from the table; after that they are only read. */
static pthread_once_t lists_once = PTHREAD_ONCE_INIT;
static char choices[256], names[256];

static void build_lists(void) {
  size_t c = 0, n = 0;
  for (int i = 0; i < NPOLICIES; i++) {
    const char *sep = i == 0 ? "" : i == NPOLICIES - 1 ? " or " : ", ";
    c += (size_t)snprintf(choices + c, sizeof choices - c, "%s%s", sep, all_policies[i]->name);
    n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? " " : "", all_policies[i]->name);
  }
}

const char *ta_policy_choices(void) {
  pthread_once(&lists_once, build_lists);
  return choices;
}

const char *ta_policy_names(void) {
  pthread_once(&lists_once, build_lists);
  return names;
}
