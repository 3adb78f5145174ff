/* A brute-force check of an arena over the fake segment layer: everything
 * the arena keeps incrementally (its free indices, stream entries, the
 * census it tells, the split notes it sends the segment layer) recounted
 * from the segments themselves. */
#ifndef TA_TEST_ARENA_CHECK_H
#define TA_TEST_ARENA_CHECK_H

#include "fake_segments.h"
#include "policies/parts/arena.h"

/* What an arena test works on: a fake layer, a policy object, an arena of
 * it that tells a census. */
typedef struct arena_rig {
  ta_segments *s;
  ta_policy policy;
  ta_arena *a;
  ta_free_census *census;
} arena_rig;

/* `flags`: TA_POLICY_*; `granule`: the fake device's (0: no expandable
 * segments). 0, or -1 without host memory. */
int arena_rig_up(arena_rig *r, unsigned flags, size_t granule);
/* The arena destroyed, then the layer (with what the arena left it). */
void arena_rig_down(arena_rig *r);

/* The problems found (each printed on stderr), 0 when none:
 *   - the segments: every segment of the layer is the arena's (in its list),
 *     each tiled by its blocks (in address order, no gap, 512-byte
 *     multiples, seg->first/last right), each block naming its segment,
 *     stream, arena and policy;
 *   - coalescing: no two free blocks side by side;
 *   - mapping: every live block of an expandable segment lies on mapped
 *     granules, and seg->unmapped is what the granules say;
 *   - the indices: each free block is in the bin its size gives, of its
 *     stream's index of its pool, and each index holds exactly the free
 *     blocks of its (stream, pool);
 *   - the stream entries: one per stream with segments, found by its
 *     stream, counting its segments (so an emptied stream has none);
 *   - the census (when the arena has one): the bytes and the largest free
 *     block a walk finds;
 *   - the split notes: the free blocks that are part of a split segment;
 *   - the fake's descriptors: as many as the blocks, and no misuse. */
int arena_check(const ta_arena *a, const ta_segments *s);

/* Free blocks and their bytes, over every segment of the layer. */
size_t arena_free_blocks(const ta_segments *s, size_t *bytes);

#endif
