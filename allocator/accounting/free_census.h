/* A census of free blocks: how many of each size, their bytes and the
 * largest, kept as blocks enter and leave the policies' free indices, so
 * that reading them walks no blocks. Replay reads one at every new peak of
 * reserved memory, over all arenas of its heap: it gives the census to the
 * heap it makes, whose segment layer carries it (ta_segments_census,
 * segments/services.h) to every arena made on it, which tells it of each
 * free block (policies/parts/arena.c).
 *
 * Below 2 MiB a count per size under a two-level bitmap (constant time both
 * ways); from 2 MiB, where sizes are too many for an array, a hash map of
 * counts and a max-heap of the sizes present (a size whose count fell to 0
 * leaves the heap when it reaches the top, or when such sizes are half the
 * heap: amortized constant per change, logarithmic per read). */
#ifndef TA_FREE_CENSUS_H
#define TA_FREE_CENSUS_H

#include "base/common.h"

/* Sizes counted in units of 512 B (every block's size is a multiple); one
 * count per size below 2 MiB. */
#define TA_CENSUS_UNIT_SHIFT 9
#define TA_CENSUS_SMALL_UNITS 4096u

typedef struct ta_census_entry {
  uint64_t units; /* size >> TA_CENSUS_UNIT_SHIFT; 0: an empty slot. A size has an entry iff it is in the heap */
  uint64_t count; /* free blocks of that size now (0: it waits to leave the heap) */
} ta_census_entry;

typedef struct ta_free_census {
  int64_t bytes;  /* of all free blocks counted */
  int failed;     /* host memory ran out once: the figures are wrong from then on */
  uint64_t small_top;
  uint64_t small_map[TA_CENSUS_SMALL_UNITS / 64];
  uint64_t small_count[TA_CENSUS_SMALL_UNITS];
  ta_census_entry *slots; /* large sizes: open addressing, linear probing */
  size_t mask, used;
  uint64_t *heap; /* large sizes (units), a max-heap */
  size_t nheap, cap_heap;
  size_t dead;    /* sizes in the heap with a count of 0 */
} ta_free_census;

/* NULL when host memory runs out. */
ta_internal ta_free_census *ta_census_create(void);
ta_internal void ta_census_destroy(ta_free_census *c);
/* One more (delta +1) or one fewer (-1) free block of `size` bytes. */
ta_internal void ta_census_note(ta_free_census *c, size_t size, int delta);
/* The largest free block counted (0: none). */
ta_internal size_t ta_census_largest(ta_free_census *c);

#endif
