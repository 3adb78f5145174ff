#include "block/ptrmap.h"

#include <stdlib.h>

#define slot_of ta_ptrmap_slot_of

int ta_ptrmap_init(ta_ptrmap *m) {
  m->mask = 1023;
  m->count = 0;
  m->slots = calloc(m->mask + 1, sizeof *m->slots);
  return m->slots ? 0 : -1;
}

void ta_ptrmap_destroy(ta_ptrmap *m) {
  free(m->slots);
  m->slots = NULL;
}

static void place(ta_ptrmap *m, uintptr_t key, ta_block *value) {
  size_t i = slot_of(m, key);
  while (m->slots[i].key) i = (i + 1) & m->mask;
  m->slots[i].key = key;
  m->slots[i].value = value;
}

static ta_noinline int grow(ta_ptrmap *m) {
  ta_ptrmap_slot *old = m->slots;
  size_t old_cap = m->mask + 1;
  ta_ptrmap_slot *slots = calloc(old_cap * 2, sizeof *slots);
  if (!slots) return -1;
  m->slots = slots;
  m->mask = old_cap * 2 - 1;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].key) place(m, old[i].key, old[i].value);
  free(old);
  return 0;
}

int ta_ptrmap_put(ta_ptrmap *m, uintptr_t key, ta_block *value) {
  if (ta_unlikely((m->count + 1) * 2 > m->mask + 1) && grow(m)) return -1;
  place(m, key, value);
  m->count++;
  return 0;
}

ta_block *ta_ptrmap_take(ta_ptrmap *m, uintptr_t key) {
  size_t i = slot_of(m, key);
  for (;; i = (i + 1) & m->mask) {
    if (m->slots[i].key == key) break;
    if (!m->slots[i].key) return NULL;
  }
  ta_block *value = m->slots[i].value;
  /* Backward shift: pull later entries of the probe run into the hole so
   * lookups never need tombstones. */
  size_t hole = i;
  for (size_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
    size_t home = slot_of(m, m->slots[j].key);
    /* Move j into the hole unless its home lies cyclically in (hole, j]. */
    int home_between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!home_between) {
      m->slots[hole] = m->slots[j];
      hole = j;
    }
  }
  m->slots[hole].key = 0;
  m->slots[hole].value = NULL;
  m->count--;
  return value;
}
