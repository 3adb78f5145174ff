/* The policy boundary: what a policy is, as the core calls it.
 *
 * The core owns it because the core calls it. A policy turns requests into
 * blocks and freed blocks back into cache; the heap around it does locking,
 * the pointer map, stats, phases and logging, so a new policy gets all of
 * those for free. A policy sees three things of the core and nothing else:
 *   - the block and segment descriptors (block.h);
 *   - this header: the ops table it fills, its flags, its object;
 *   - the segment layer's services (segments/services.h), on an opaque
 *     `ta_segments`: block descriptors, ordinary segments and expandable
 *     ones; device memory comes only from there.
 * The core finds a policy by name or id through the registry (declared
 * below, built from policies/policy_list.h) and names none itself.
 * Adding a policy: a file in policies/ filling a ta_policy_ops, its name in
 * TA_POLICY_LIST (policies/policy_list.h) and in _records.py's POLICY_NAMES
 * (docs/ARCHITECTURE.md). */
#ifndef TA_POLICY_H
#define TA_POLICY_H

#include <stdlib.h>

#include "block/block.h"

typedef struct ta_segments ta_segments; /* the segment layer (segments/services.h): opaque here */
typedef struct ta_policy ta_policy;

/* Policies a process can have; a block stores its policy's id in a byte. */
#define TA_MAX_POLICIES 8

typedef struct ta_policy_ops {
  const char *name;
  /* `flags`: TA_POLICY_* */
  ta_policy *(*create)(ta_segments *segments, uint8_t id, unsigned flags);
  /* Release every fully free segment and the policy's own memory; blocks
   * still live stay with the segment layer, which frees them at teardown. */
  void (*destroy)(ta_policy *p);
  /* A block of at least `size` bytes on `stream` for `phase`, its state set
   * to TA_BLOCK_LIVE; NULL when the device is out of memory. */
  ta_block *(*malloc)(ta_policy *p, size_t size, cudaStream_t stream, int phase);
  /* Take back a block this policy made (state TA_BLOCK_LIVE or PENDING). */
  void (*free)(ta_policy *p, ta_block *b);
  /* The pool (TA_POOL_SMALL or TA_POOL_LARGE) whose segments would serve a
   * request of `size` bytes: at a failure the OOM account names the granule
   * that pool's expandable segments give back. */
  int (*pool_for)(const ta_policy *p, size_t size);
  /* Release every fully free cached segment; returns the bytes released. */
  size_t (*release_cached)(ta_policy *p);
  /* Optional (NULL when the policy keeps no per-phase arenas): bytes held by
   * the arena of `phase` (-1: all), and releasing its free segments. */
  size_t (*arena_reserved)(ta_policy *p, int phase);
  size_t (*arena_release)(ta_policy *p, int phase);
  /* Optional (NULL when the policy cannot): make exactly [addr, addr+size)
   * of `seg`, a segment of this policy, a live block; NULL when that range
   * is not free. Restoring a private pool's checkpoint needs it. */
  ta_block *(*claim)(ta_policy *p, ta_segment *seg, uintptr_t addr, size_t size);
  /* 1 when `free` may give memory back to the device (exact): the heap then
   * holds such frees while a capture may be underway, when a device free
   * would invalidate it. */
  int frees_to_device;
} ta_policy_ops;

/* Grow expandable segments instead of allocating new ones (the heap sets it
 * only where the backend has virtual memory, and never for private pools:
 * a captured graph's addresses must stay as they were). */
#define TA_POLICY_EXPANDABLE 1u
/* With it: before reserving past the most ever reserved, give back free
 * granules elsewhere (least memory; each time costs a device synchronize). */
#define TA_POLICY_COMPACT 2u
/* With TA_POLICY_EXPANDABLE, as compact but never synchronizing: free
 * granules move to where memory is needed once per-stream progress markers
 * say the device is past their last use, and before that, on their own
 * stream, are mapped at the new place too (the old addresses retire when
 * their marker completes). */
#define TA_POLICY_RECLAIM 4u

/* Never split a block: each is a whole segment of its own (a private
 * pool's MemPool(no_split=True); the heap may set it after create). */
#define TA_POLICY_NO_SPLIT 8u

struct ta_policy {
  const ta_policy_ops *ops;
  ta_segments *segments;
  uint8_t id;
  unsigned flags; /* TA_POLICY_* */
  /* A private pool's own allocator (torch.cuda.MemPool(allocator=...)):
   * ta_segments_alloc takes this policy's segments from it. NULL: the device. */
  struct ta_segment_source *source;
};

/* A policy's object is its own struct with a ta_policy first. Every
 * policy's create starts with ta_policy_new, `size` bytes of that struct
 * zeroed and the ta_policy filled in (NULL without host memory), and its
 * destroy ends with ta_policy_delete. */
static inline ta_policy *ta_policy_new(size_t size, const ta_policy_ops *ops, ta_segments *segments, uint8_t id,
                                       unsigned flags) {
  ta_policy *p = calloc(1, size);
  if (p) *p = (ta_policy){.ops = ops, .segments = segments, .id = id, .flags = flags};
  return p;
}

static inline void ta_policy_delete(ta_policy *p) { free(p); }

/* ---------------------------------------------------------------------------
 * The list (policies/policy_list.h): the only place that names policies.
 * Ids are indices into it, stored in every block and in the log.
 * ------------------------------------------------------------------------- */

ta_internal int ta_policy_count(void);
/* NULL when unknown. *id (may be NULL) receives the id. */
ta_internal const ta_policy_ops *ta_policy_by_name(const char *name, uint8_t *id);
ta_internal const ta_policy_ops *ta_policy_by_id(uint8_t id);
/* "caching, exact or phase_arena": for messages that list the choices. */
ta_internal const char *ta_policy_choices(void);
/* "caching exact phase_arena": the names in id order. */
ta_internal const char *ta_policy_names(void);
/* The policy that serves private pools (CUDA graphs, MemPool): one that
 * caches, since a captured graph's memory must never go back to the device
 * while the graph lives, and frees during a capture must stay on the host. */
ta_internal uint8_t ta_policy_for_private_pools(void);

#endif
