/* The free index of one (arena, stream, pool): TLSF-style segregated lists
 * with two-level bitmaps, so finding a fitting block is O(1).
 *
 * Bin layout, in units of 512 B (every block size is a multiple of 512):
 *   - units < 4096 (sizes below 2 MiB): one bin per size. Every block in a bin
 *     has the same size, so the head of the first non-empty bin at or above
 *     the request is an exact best fit.
 *   - units >= 4096: bin = 4096 + (fl - 12) * 64 + sl, where fl = floor(log2
 *     units) and sl = the next 6 bits. A bin spans 1/64 of its power of two,
 *     so a block in the next non-empty bin wastes at most 1/64 (1.6 %) more
 *     than the best fit; the request's own bin is probed too (up to
 *     TA_BIN_PROBE entries) so an exact-size block freed earlier is found.
 * Bitmaps: bit b of map[] is set iff bin b is non-empty; bit w of top[] is
 * set iff map[w] != 0. Finding the next non-empty bin at or after b takes
 * one masked word of map[] and one ctz over top[] — constant time.
 * List heads: in groups of 64 (those of one map[] word), each made when a
 * block first enters one of its bins. An index holds a few sizes: made
 * whole it would be 43 KiB, and a trace may name tens of thousands of
 * streams, each with an index per pool. A block whose group cannot be made
 * (no host memory) goes to one more bin, TA_NBINS (`overflow`, past every
 * size), searched whole when no block of the others fits. */
#ifndef TA_BINS_H
#define TA_BINS_H

#include "policy/policy.h"

#define TA_UNIT_SHIFT 9
#define TA_LINEAR_BINS 4096u
#define TA_SL_BITS 6u
#define TA_MAX_FL 31u /* sizes below 2^(31+9) = 1 TiB */
#define TA_NBINS (TA_LINEAR_BINS + (TA_MAX_FL - 12u + 1u) * (1u << TA_SL_BITS))
#define TA_MAP_WORDS ((TA_NBINS + 1u + 63u) / 64u) /* with the overflow bin */
#define TA_TOP_WORDS ((TA_MAP_WORDS + 63u) / 64u)
#define TA_BIN_PROBE 16
#define TA_MAX_BLOCK_SIZE (((size_t)1 << (TA_MAX_FL + 1 + TA_UNIT_SHIFT)) - 1)
/* The core refuses requests above TA_MAX_REQUEST; rounded up by a policy
 * (at most 2 MiB), each must still have a bin. */
_Static_assert(TA_MAX_REQUEST + 2 * TA_MiB <= TA_MAX_BLOCK_SIZE, "bins must reach the largest request");

typedef struct ta_bins {
  uint64_t top[TA_TOP_WORDS];
  uint64_t map[TA_MAP_WORDS];
  size_t count;
  ta_block **group[TA_MAP_WORDS]; /* group[w][k]: head of bin 64 w + k; a shared empty group until a block enters */
  ta_block *overflow;             /* bin TA_NBINS's head: group[TA_NBINS / 64] points here */
} ta_bins;
_Static_assert(TA_NBINS % 64 == 0, "the overflow bin is the first of its group");

/* An empty index (calloc'ed), and back; NULL when host memory runs out. */
ta_internal ta_bins *ta_bins_create(void);
ta_internal void ta_bins_destroy(ta_bins *bins);
ta_internal void ta_bins_insert(ta_bins *bins, ta_block *b);
ta_internal void ta_bins_remove(ta_bins *bins, ta_block *b);
/* Best-fitting free block of at least `size` bytes, or NULL; not removed. */
ta_internal ta_block *ta_bins_find(ta_bins *bins, size_t size);
/* The best-fitting free block of at least `size` bytes that `fits` accepts,
 * or NULL; not removed. Asks `fits` of at most `probes` blocks, smallest
 * bins first (a bounded search for the slow path: a list is not sorted). */
typedef int ta_bins_filter(const ta_block *b, size_t size, void *ctx);
ta_internal ta_block *ta_bins_find_where(ta_bins *bins, size_t size, ta_bins_filter *fits, void *ctx, int probes);

#endif
