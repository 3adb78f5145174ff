/* An arena: segments carved into blocks with splitting and coalescing, one
 * free index per (stream, pool). `caching` is one arena; `phase_arena` is
 * one arena per phase. A freed block is reused only by requests on its own
 * stream, as in PyTorch.
 *
 * Expandable (TA_POLICY_EXPANDABLE): each (stream, pool) has one expandable
 * segment instead of many fixed ones. A request no free block fits grows it
 * at its end, by what the free block there lacks; releasing cached memory
 * unmaps its free granules. Compact (TA_POLICY_COMPACT): before reserving
 * past the most it ever reserved, the device unmaps free granules of any
 * expandable segment first, so reserved memory follows live memory.
 * Reclaim (TA_POLICY_RECLAIM): the same without a synchronize: free
 * granules the device is past move to where memory is needed, and those of
 * the requester's own stream it may still use are lent (mapped there too;
 * their old addresses retire, as blocks of this arena, once their marker
 * completes). */
#ifndef TA_ARENA_H
#define TA_ARENA_H

#include "policy/policy.h"
#include "segments/services.h"
#include "bins.h"

/* A stream's part of an arena: made at its first request, dropped with its
 * bins once none of its segments is left (so none of its blocks, live, free
 * or retiring): a trace may name tens of thousands of streams, most used
 * once. */
typedef struct ta_stream_bins {
  cudaStream_t stream;
  ta_bins *pool[3]; /* indexed by TA_POOL_SMALL / TA_POOL_LARGE; [0] unused */
  ta_segment *expandable[3]; /* the stream's expandable segment of each pool; NULL until the first */
  size_t segments;  /* the arena's segments on this stream */
  uint8_t newest;   /* the pool whose expandable segment was made last */
} ta_stream_bins;

typedef struct ta_arena {
  ta_segments *segments;
  ta_policy *policy;  /* the policy object the arena belongs to */
  ta_stream_bins *streams; /* in no order: an entry dropped takes the last one's place */
  size_t nstreams, cap_streams;
  uint32_t *index;    /* hash index of `streams` (entry + 1; 0: empty), 2 * cap_streams slots */
  size_t index_mask;
  size_t last;        /* index of the last stream used: most requests repeat it */
  ta_segment *owned;  /* this arena's segments, linked through owner_next */
  int expandable;     /* grow expandable segments (TA_POLICY_EXPANDABLE and the device can) */
  int compact;        /* TA_POLICY_COMPACT or _RECLAIM: free granules elsewhere first, rather than reserve past
                       * the high-water mark */
  int reclaim;        /* TA_POLICY_RECLAIM: ... without a synchronize */
  ta_block **retiring; /* reclaim: this arena's TA_BLOCK_RETIRING blocks */
  size_t nretiring, cap_retiring;
  /* The arenas of one policy object (phase_arena's, one per phase): reclaim
   * lends and retires across them, as they share the device. NULL: alone. */
  struct ta_arena **family;
  struct ta_arena *family_next;
  ta_free_census *census; /* the segment layer's (ta_segments_census), told of every block entering or leaving a
                           * free index; NULL: none */
} ta_arena;

ta_internal ta_arena *ta_arena_create(ta_segments *segments, ta_policy *policy);
/* `a` joins the family whose first arena `*family` is (the policy keeps
 * `*family`, NULL before the first; it must outlive the arenas). */
ta_internal void ta_arena_join(ta_arena *a, ta_arena **family);
ta_internal void ta_arena_destroy(ta_arena *a);
ta_internal ta_block *ta_arena_malloc(ta_arena *a, size_t size, cudaStream_t stream);
ta_internal void ta_arena_free(ta_arena *a, ta_block *b);
/* Device memory its segments hold now (walks them: not for the hot path). */
ta_internal size_t ta_arena_reserved(const ta_arena *a);
ta_internal size_t ta_arena_release_cached(ta_arena *a);
/* Make exactly [addr, addr + size) of `seg` (this arena's) a live block,
 * splitting the free block around it; NULL when that range is not free. */
ta_internal ta_block *ta_arena_claim(ta_arena *a, ta_segment *seg, uintptr_t addr, size_t size);

#endif
