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
 * one masked word of map[] and one ctz over top[] — constant time. */
#ifndef TA_BINS_H
#define TA_BINS_H

#include "policy/policy.h"

#define TA_UNIT_SHIFT 9
#define TA_LINEAR_BINS 4096u
#define TA_SL_BITS 6u
#define TA_MAX_FL 31u /* sizes below 2^(31+9) = 1 TiB */
#define TA_NBINS (TA_LINEAR_BINS + (TA_MAX_FL - 12u + 1u) * (1u << TA_SL_BITS))
#define TA_MAP_WORDS ((TA_NBINS + 63u) / 64u)
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
  ta_block *head[TA_NBINS];
} ta_bins;

ta_internal void ta_bins_insert(ta_bins *bins, ta_block *b);
ta_internal void ta_bins_remove(ta_bins *bins, ta_block *b);
/* Best-fitting free block of at least `size` bytes, or NULL; not removed. */
ta_internal ta_block *ta_bins_find(ta_bins *bins, size_t size);

#endif
