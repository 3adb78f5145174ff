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

/* ------------------------------------------------------------------------
 * The census of free blocks (bins.h)
 * ---------------------------------------------------------------------- */

ta_free_census *ta_census_create(void) { return calloc(1, sizeof(ta_free_census)); }

void ta_census_destroy(ta_free_census *c) {
  if (!c) return;
  free(c->slots);
  free(c->heap);
  free(c);
}

static void census_note_small(ta_free_census *c, uint32_t units, int delta) {
  uint32_t w = units >> 6;
  uint64_t bit = 1ull << (units & 63);
  if (delta > 0) {
    if (c->small_count[units]++ == 0) {
      c->small_map[w] |= bit;
      c->small_top |= 1ull << w;
    }
  } else if (--c->small_count[units] == 0) {
    c->small_map[w] &= ~bit;
    if (!c->small_map[w]) c->small_top &= ~(1ull << w);
  }
}

static inline size_t census_home(const ta_free_census *c, uint64_t units) {
  return (size_t)((units * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & c->mask; /* Fibonacci hashing */
}

/* The entry of `units`, or the empty slot where it would go. */
static ta_census_entry *census_slot(const ta_free_census *c, uint64_t units) {
  size_t i = census_home(c, units);
  while (c->slots[i].units && c->slots[i].units != units) i = (i + 1) & c->mask;
  return &c->slots[i];
}

static int census_grow(ta_free_census *c) {
  size_t old_cap = c->slots ? c->mask + 1 : 0;
  ta_census_entry *old = c->slots, *slots = calloc(old_cap ? old_cap * 2 : 64, sizeof *slots);
  if (!slots) return -1;
  c->slots = slots;
  c->mask = (old_cap ? old_cap * 2 : 64) - 1;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].units) *census_slot(c, old[i].units) = old[i];
  free(old);
  return 0;
}

/* Backward-shift deletion, as replay's address map: no tombstones. Moves
 * other entries: no entry pointer outlives it. */
static void census_erase(ta_free_census *c, ta_census_entry *e) {
  size_t i = (size_t)(e - c->slots);
  for (size_t j = (i + 1) & c->mask; c->slots[j].units; j = (j + 1) & c->mask) {
    size_t home = census_home(c, c->slots[j].units);
    if (((j - home) & c->mask) >= ((j - i) & c->mask)) { /* j may move to i: its home is not in (i, j] */
      c->slots[i] = c->slots[j];
      i = j;
    }
  }
  c->slots[i].units = 0;
  c->used--;
}

static void sift_down(uint64_t *heap, size_t n, size_t i) {
  for (size_t child; (child = 2 * i + 1) < n; i = child) {
    if (child + 1 < n && heap[child + 1] > heap[child]) child++;
    if (heap[i] >= heap[child]) return;
    uint64_t t = heap[i];
    heap[i] = heap[child];
    heap[child] = t;
  }
}

static int heap_push(ta_free_census *c, uint64_t units) {
  if (ta_grow(&c->heap, &c->cap_heap, c->nheap + 1, 64)) return -1;
  size_t i = c->nheap++;
  for (; i && c->heap[(i - 1) / 2] < units; i = (i - 1) / 2) c->heap[i] = c->heap[(i - 1) / 2];
  c->heap[i] = units;
  return 0;
}

/* Sizes whose count fell to 0 are half the heap: out with them (heap and
 * map), and heapify what is left. Linear, after at least half as many
 * changes: constant per change. */
static void census_compact(ta_free_census *c) {
  size_t kept = 0;
  for (size_t i = 0; i < c->nheap; i++) {
    ta_census_entry *e = census_slot(c, c->heap[i]);
    if (e->count) c->heap[kept++] = c->heap[i];
    else census_erase(c, e);
  }
  c->nheap = kept;
  c->dead = 0;
  for (size_t i = kept / 2; i-- > 0;) sift_down(c->heap, kept, i);
}

static void census_note_large(ta_free_census *c, uint64_t units, int delta) {
  if (delta < 0) {
    if (--census_slot(c, units)->count == 0 && ++c->dead > 32 && c->dead * 2 > c->nheap) census_compact(c);
    return;
  }
  if ((c->used + 1) * 2 > (c->slots ? c->mask + 1 : 0) && census_grow(c)) {
    c->failed = 1;
    return;
  }
  ta_census_entry *e = census_slot(c, units);
  if (e->units) {
    if (e->count++ == 0) c->dead--; /* still in the heap */
    return;
  }
  if (heap_push(c, units)) {
    c->failed = 1;
    return;
  }
  *e = (ta_census_entry){.units = units, .count = 1};
  c->used++;
}

void ta_census_note(ta_free_census *c, size_t size, int delta) {
  if (ta_unlikely(c->failed)) return;
  c->bytes += delta > 0 ? (int64_t)size : -(int64_t)size;
  uint64_t units = size >> TA_UNIT_SHIFT;
  if (units < TA_LINEAR_BINS) census_note_small(c, (uint32_t)units, delta);
  else census_note_large(c, units, delta);
}

size_t ta_census_largest(ta_free_census *c) {
  while (c->nheap) { /* the top, once sizes no longer free have left it */
    ta_census_entry *e = census_slot(c, c->heap[0]);
    if (e->count) return (size_t)e->units << TA_UNIT_SHIFT;
    census_erase(c, e);
    c->dead--;
    c->heap[0] = c->heap[--c->nheap];
    sift_down(c->heap, c->nheap, 0);
  }
  if (!c->small_top) return 0;
  uint32_t w = 63u - (uint32_t)__builtin_clzll(c->small_top);
  return (size_t)((w << 6) + 63u - (uint32_t)__builtin_clzll(c->small_map[w])) << TA_UNIT_SHIFT;
}
