/* The one table every policy fills. A policy turns requests into blocks and
 * blocks back into cache; the heap around it does locking, the pointer map,
 * stats, phases and logging, so a new policy gets all of those for free. */
#ifndef TA_POLICY_H
#define TA_POLICY_H

#include "../allocator/block.h"

struct ta_heap;
typedef struct ta_policy ta_policy;

enum ta_policy_id { TA_POLICY_CACHING = 0, TA_POLICY_EXACT = 1, TA_POLICY_PHASE_ARENA = 2, TA_NPOLICIES = 3 };

typedef struct ta_policy_ops {
  const char *name;
  ta_policy *(*create)(struct ta_heap *heap, uint8_t id);
  /* Release every segment; only called when no block of this policy is live. */
  void (*destroy)(ta_policy *p);
  /* A block of at least `size` bytes on `stream` for the current `phase`, its
   * state set to TA_BLOCK_LIVE; NULL when the device is out of memory. */
  ta_block *(*malloc)(ta_policy *p, size_t size, cudaStream_t stream, int phase);
  /* Take back a block this policy made (state TA_BLOCK_LIVE or PENDING). */
  void (*free)(ta_policy *p, ta_block *b);
  /* Release every fully free cached segment; returns the bytes released. */
  size_t (*release_cached)(ta_policy *p);
  /* Optional (phase_arena): the arena of `phase`, -1 for all. */
  size_t (*arena_reserved)(ta_policy *p, int phase);
  size_t (*arena_release)(ta_policy *p, int phase);
} ta_policy_ops;

struct ta_policy {
  const ta_policy_ops *ops;
  struct ta_heap *heap;
  uint8_t id;
};

ta_internal extern const ta_policy_ops ta_caching_policy;
ta_internal extern const ta_policy_ops ta_exact_policy;
ta_internal extern const ta_policy_ops ta_phase_arena_policy;

/* Policy ops by name or id; NULL when unknown. */
ta_internal const ta_policy_ops *ta_policy_by_name(const char *name, uint8_t *id);
ta_internal const ta_policy_ops *ta_policy_by_id(uint8_t id);

#endif
