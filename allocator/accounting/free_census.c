/* The census of free blocks (free_census.h). */
#include "accounting/free_census.h"

#include <stdlib.h>

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
  uint64_t units = size >> TA_CENSUS_UNIT_SHIFT;
  if (units < TA_CENSUS_SMALL_UNITS) census_note_small(c, (uint32_t)units, delta);
  else census_note_large(c, units, delta);
}

size_t ta_census_largest(ta_free_census *c) {
  while (c->nheap) { /* the top, once sizes no longer free have left it */
    ta_census_entry *e = census_slot(c, c->heap[0]);
    if (e->count) return (size_t)e->units << TA_CENSUS_UNIT_SHIFT;
    census_erase(c, e);
    c->dead--;
    c->heap[0] = c->heap[--c->nheap];
    sift_down(c->heap, c->nheap, 0);
  }
  if (!c->small_top) return 0;
  uint32_t w = 63u - (uint32_t)__builtin_clzll(c->small_top);
  return (size_t)((w << 6) + 63u - (uint32_t)__builtin_clzll(c->small_map[w])) << TA_CENSUS_UNIT_SHIFT;
}
