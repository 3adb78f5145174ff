/* Address -> block map of the blocks handed out (and pending), so a free
 * finds its block in O(1) and a pointer we never handed out is recognised.
 * Open addressing, linear probing, backward-shift deletion, load <= 1/2. */
#ifndef TA_PTRMAP_H
#define TA_PTRMAP_H

#include "block/block.h"

typedef struct ta_ptrmap_slot {
  uintptr_t key; /* 0 = empty (no device allocation starts at address 0) */
  ta_block *value;
} ta_ptrmap_slot;

typedef struct ta_ptrmap {
  ta_ptrmap_slot *slots;
  size_t mask; /* capacity - 1; capacity is a power of two */
  size_t count;
} ta_ptrmap;

ta_internal int ta_ptrmap_init(ta_ptrmap *m);
ta_internal void ta_ptrmap_destroy(ta_ptrmap *m);
/* 0, or -1 when host memory runs out while growing. */
ta_internal int ta_ptrmap_put(ta_ptrmap *m, uintptr_t key, ta_block *value);
/* Removes and returns the block at `key`, or NULL. */
ta_internal ta_block *ta_ptrmap_take(ta_ptrmap *m, uintptr_t key);

/* Addresses are 512-aligned: drop those bits, then Fibonacci hashing. */
static inline size_t ta_ptrmap_slot_of(const ta_ptrmap *m, uintptr_t key) {
  return (size_t)(((uint64_t)(key >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
}

/* Inline: every free starts here. */
static inline ta_block *ta_ptrmap_get(const ta_ptrmap *m, uintptr_t key) {
  for (size_t i = ta_ptrmap_slot_of(m, key);; i = (i + 1) & m->mask) {
    if (m->slots[i].key == key) return m->slots[i].value;
    if (!m->slots[i].key) return NULL;
  }
}

#endif
