/* TLSF-style free index; the bitmap math is explained in bins.h. */
#include "bins.h"

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

void ta_bins_insert(ta_bins *bins, ta_block *b) {
  uint32_t bin = bin_of(b->size);
  ta_block *head = bins->head[bin];
  b->bin = bin;
  b->bin_prev = NULL;
  b->bin_next = head;
  if (head) head->bin_prev = b;
  else mark_nonempty(bins, bin);
  bins->head[bin] = b;
  bins->count++;
}

void ta_bins_remove(ta_bins *bins, ta_block *b) {
  uint32_t bin = b->bin;
  if (b->bin_prev) b->bin_prev->bin_next = b->bin_next;
  else bins->head[bin] = b->bin_next;
  if (b->bin_next) b->bin_next->bin_prev = b->bin_prev;
  if (!bins->head[bin]) mark_empty(bins, bin);
  b->bin_prev = b->bin_next = NULL;
  bins->count--;
}

/* First non-empty bin at or after `bin`, or TA_NBINS. */
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

/* Smallest block >= size among the first TA_BIN_PROBE of `head`'s list;
 * ties go to the lower address, as in PyTorch's allocator. */
static ta_block *probe(ta_block *head, size_t size) {
  ta_block *best = NULL;
  int n = 0;
  for (ta_block *b = head; b && n < TA_BIN_PROBE; b = b->bin_next, n++) {
    if (b->size < size) continue;
    if (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)) best = b;
  }
  return best;
}

ta_block *ta_bins_find(ta_bins *bins, size_t size) {
  uint32_t bin = bin_of(size);
  if (bin < TA_LINEAR_BINS) {
    if (bins->head[bin]) return bins->head[bin]; /* exact size */
  } else if (bins->head[bin]) {
    ta_block *b = probe(bins->head[bin], size);
    if (b) return b;
  }
  uint32_t next = next_nonempty(bins, bin + 1);
  if (next >= TA_NBINS) return NULL;
  return next < TA_LINEAR_BINS ? bins->head[next] : probe(bins->head[next], 0);
}
