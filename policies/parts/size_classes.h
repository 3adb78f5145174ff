/* Sizes as PyTorch's caching allocator chooses them, so memory_allocated()
 * moves by the same amounts under torchalloc as under the native allocator:
 *   - requests round up to 512 B;
 *   - <= 1 MiB: small pool, carved from 2 MiB segments;
 *   - 1-10 MiB: large pool, 20 MiB segments;
 *   - >= 10 MiB: large pool, own segment rounded up to 2 MiB;
 *   - a free block is split when the remainder is >= 512 B (small pool) or
 *     > 1 MiB (large pool); otherwise the caller gets the whole block.
 * Expandable segments (arena.h) grow in the device's granule instead. */
#ifndef TA_SIZE_CLASSES_H
#define TA_SIZE_CLASSES_H

#include "policy/policy.h"

#define TA_MIN_BLOCK ((size_t)512)
#define TA_SMALL_SIZE TA_MiB
#define TA_SMALL_SEGMENT (2 * TA_MiB)
#define TA_MIN_LARGE_ALLOC (10 * TA_MiB)
#define TA_LARGE_SEGMENT (20 * TA_MiB)
#define TA_ROUND_LARGE (2 * TA_MiB)

static inline size_t ta_round_size(size_t size) {
  return size < TA_MIN_BLOCK ? TA_MIN_BLOCK : ta_align_up(size, TA_MIN_BLOCK);
}

static inline int ta_pool_for(size_t rounded) { return rounded <= TA_SMALL_SIZE ? TA_POOL_SMALL : TA_POOL_LARGE; }

/* ta_policy_ops.pool_for of a policy that sizes by these rules. */
static inline int ta_size_class_pool(const ta_policy *p, size_t size) {
  (void)p;
  return ta_pool_for(ta_round_size(size));
}

static inline size_t ta_segment_size_for(size_t rounded) {
  if (rounded <= TA_SMALL_SIZE) return TA_SMALL_SEGMENT;
  if (rounded < TA_MIN_LARGE_ALLOC) return TA_LARGE_SEGMENT;
  return ta_align_up(rounded, TA_ROUND_LARGE);
}

/* In an expandable segment any remainder of 512 B or more is split off, as
 * PyTorch does with expandable_segments: a large block's unsplit slack would
 * otherwise sit in the middle of the one range, where it cannot be given
 * back, instead of at its end. */
static inline int ta_should_split(size_t block_size, size_t rounded, int pool, int expandable) {
  size_t remaining = block_size - rounded;
  return pool == TA_POOL_SMALL || expandable ? remaining >= TA_MIN_BLOCK : remaining > TA_SMALL_SIZE;
}

#endif
