/* TLSF-style free index; the bitmap math is explained in bins.h. */
#include "bins.h"

#include <limits.h>
#include <stdlib.h>

static inline uint32_t bin_of(size_t size) {
  size_t units = size >> TA_UNIT_SHIFT;
  if (units < TA_LINEAR_BINS) return (uint32_t)units;
  unsigned fl = 63u - (unsigned)__builtin_clzll((unsigned long long)units);
  unsigned sl = (unsigned)(units >> (fl - TA_SL_BITS)) & ((1u << TA_SL_BITS) - 1u);
  return TA_LINEAR_BINS + ((fl - 12u) << TA_SL_BITS) + sl;
}

static inline void mark_nonempty(ta_bins *bins, uint32_t bin) {
  uint32_t w = bin >> 6;
  bins->map[w] |= 1ull << (bin & 63);
  bins->top[w >> 6] |= 1ull << (w & 63);
}

static inline void mark_empty(ta_bins *bins, uint32_t bin) {
  uint32_t w = bin >> 6;
  bins->map[w] &= ~(1ull << (bin & 63));
  if (bins->map[w] == 0) bins->top[w >> 6] &= ~(1ull << (w & 63));
}

/* The group of every range no block has entered yet: all heads NULL, so a
 * lookup reads any bin's head without asking whether its group was made;
 * never written (an insert makes the group first). */
static ta_block *const no_group[64];

ta_bins *ta_bins_create(void) {
  ta_bins *bins = calloc(1, sizeof(ta_bins));
  if (!bins) return NULL;
  for (uint32_t w = 0; w < TA_MAP_WORDS; w++) bins->group[w] = (ta_block **)no_group;
  bins->group[TA_NBINS / 64] = &bins->overflow; /* the overflow bin, its group's first */
  return bins;
}

void ta_bins_destroy(ta_bins *bins) {
  if (!bins) return;
  for (uint32_t w = 0; w < TA_NBINS / 64; w++)
    if (bins->group[w] != no_group) free(bins->group[w]);
  free(bins);
}

static inline ta_block **head_of(ta_bins *bins, uint32_t bin) { return &bins->group[bin >> 6][bin & 63]; }

/* The heads of bin's group, made now; without host memory, the overflow bin's. */
static ta_noinline ta_block **make_group(ta_bins *bins, uint32_t *bin) {
  ta_block **group = calloc(64, sizeof(ta_block *));
  if (!group) {
    *bin = TA_NBINS;
    return &bins->overflow;
  }
  bins->group[*bin >> 6] = group;
  return &group[*bin & 63];
}

void ta_bins_insert(ta_bins *bins, ta_block *b) {
  uint32_t bin = bin_of(b->size);
  ta_block **group = bins->group[bin >> 6];
  ta_block **head = ta_likely(group != no_group) ? &group[bin & 63] : make_group(bins, &bin);
  if (!*head) mark_nonempty(bins, bin);
  b->bin = bin;
  b->bin_prev = NULL;
  b->bin_next = *head;
  if (*head) (*head)->bin_prev = b;
  *head = b;
  bins->count++;
}

void ta_bins_remove(ta_bins *bins, ta_block *b) {
  if (b->bin_next) b->bin_next->bin_prev = b->bin_prev;
  if (b->bin_prev) b->bin_prev->bin_next = b->bin_next;
  else if ((*head_of(bins, b->bin) = b->bin_next) == NULL) mark_empty(bins, b->bin); /* it was the only one */
  b->bin_prev = b->bin_next = NULL;
  bins->count--;
}

/* First non-empty bin at or after `bin`, or TA_NBINS (the overflow bin's
 * index: non-empty or not, the caller searches it whole). */
static inline uint32_t next_nonempty(const ta_bins *bins, uint32_t bin) {
  if (bin >= TA_NBINS) return TA_NBINS;
  uint32_t w = bin >> 6;
  uint64_t bits = bins->map[w] & (~0ull << (bin & 63));
  if (bits) return (w << 6) + (uint32_t)__builtin_ctzll(bits);
  for (uint32_t t = (w + 1) >> 6; t < TA_TOP_WORDS; t++) {
    uint64_t words = bins->top[t];
    if (t == (w + 1) >> 6) words &= (w + 1) & 63 ? ~0ull << ((w + 1) & 63) : ~0ull;
    if (words) {
      uint32_t w2 = (t << 6) + (uint32_t)__builtin_ctzll(words);
      return (w2 << 6) + (uint32_t)__builtin_ctzll(bins->map[w2]);
    }
  }
  return TA_NBINS;
}

/* Smallest block >= size among the first `limit` of `head`'s list; ties go
 * to the lower address, as in PyTorch's allocator. */
static ta_block *probe(ta_block *head, size_t size, long limit) {
  ta_block *best = NULL;
  long n = 0;
  for (ta_block *b = head; b && n < limit; b = b->bin_next, n++) {
    if (b->size < size) continue;
    if (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)) best = b;
  }
  return best;
}

ta_block *ta_bins_find(ta_bins *bins, size_t size) {
  uint32_t bin = bin_of(size);
  ta_block *head = *head_of(bins, bin);
  if (bin < TA_LINEAR_BINS) {
    if (head) return head; /* exact size */
  } else if (head) {
    ta_block *b = probe(head, size, TA_BIN_PROBE);
    if (b) return b;
  }
  uint32_t next = next_nonempty(bins, bin + 1);
  if (next >= TA_NBINS) return ta_unlikely(bins->overflow != NULL) ? probe(bins->overflow, size, LONG_MAX) : NULL;
  return next < TA_LINEAR_BINS ? *head_of(bins, next) : probe(*head_of(bins, next), 0, TA_BIN_PROBE);
}

ta_block *ta_bins_find_where(ta_bins *bins, size_t size, ta_bins_filter *fits, void *ctx, int probes) {
  ta_block *best = NULL;
  /* The request's own bin may hold smaller blocks (from 2 MiB a bin spans sizes); the first bin with
   * an accepted block ends the search: the next ones hold larger blocks only. */
  for (uint32_t bin = bin_of(size); bin <= TA_NBINS && !best && probes > 0; bin = next_nonempty(bins, bin + 1)) {
    for (ta_block *b = *head_of(bins, bin); b && probes > 0; b = b->bin_next) {
      if (b->size < size || (best && b->size >= best->size)) continue;
      probes--;
      if (fits(b, size, ctx)) best = b;
    }
    if (bin == TA_NBINS) break;
  }
  return best;
}
