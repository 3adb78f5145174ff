/* The sparse word store of the simulated device (canary.h): open
 * addressing with linear probing; deletion shifts later entries back so
 * lookups never need tombstones (the store is emptied and refilled
 * millions of times). Key 0 is free: no device address is 0. */
#include "canary.h"

#include <string.h>

#define SLOTS 4096 /* > 3 words x 512 live blocks (api_driver's MAX_LIVE), at most ~40% full */

typedef struct word {
  uintptr_t addr;
  uint64_t value;
} word;

static word store[SLOTS];
static size_t used;

static size_t slot_of(uintptr_t addr) { return (size_t)((addr >> 3) * 0x9E3779B97F4A7C15ull >> 52) & (SLOTS - 1); }

/* The value allocation `serial` writes at `addr`: differs per word and per
 * allocation, so neither a reused address nor a shifted block passes. */
static uint64_t pattern(uintptr_t addr, uint64_t serial) {
  uint64_t z = serial * 0xBF58476D1CE4E5B9ull ^ (uint64_t)addr;
  z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
  return z ^ (z >> 29);
}

static uint64_t (*translate)(uintptr_t addr);

void canary_set_translate(uint64_t (*fn)(uintptr_t addr)) { translate = fn; }

/* The (up to) three distinct words of a block: first, middle, last; their
 * keys (the translation of their addresses, when one is set) in out[] and
 * their addresses, which the values are made from, in at[]: a word the
 * device copied to other memory keeps its value under its new key. */
static int words_of(uintptr_t addr, size_t size, uintptr_t out[3], uintptr_t at[3]) {
  uintptr_t w[3] = {addr, addr + ((size / 2) & ~(size_t)7), addr + ((size - 1) & ~(size_t)7)};
  int n = 0;
  for (int i = 0; i < 3; i++) {
    uintptr_t key = translate ? (uintptr_t)translate(w[i]) : w[i];
    if (n == 0 || key != out[n - 1]) at[n] = w[i], out[n++] = key;
  }
  return n;
}

static word *find(uintptr_t addr) {
  for (size_t i = slot_of(addr);; i = (i + 1) & (SLOTS - 1)) {
    if (store[i].addr == addr) return &store[i];
    if (store[i].addr == 0) return NULL;
  }
}

void canary_reset(void) {
  if (used) memset(store, 0, sizeof store);
  used = 0;
}

static int insert(uintptr_t key, uint64_t value) {
  size_t i = slot_of(key);
  while (store[i].addr != 0 && store[i].addr != key) i = (i + 1) & (SLOTS - 1);
  if (store[i].addr == 0) {
    if (used + 1 >= SLOTS / 2) return -1;
    used++;
  }
  store[i] = (word){key, value};
  return 0;
}

/* Backward shift: move each later entry of the run into the hole when its
 * home slot does not lie strictly between the hole and it. */
static void erase_at(word *at) {
  size_t hole = (size_t)(at - store);
  store[hole].addr = 0;
  used--;
  for (size_t j = (hole + 1) & (SLOTS - 1); store[j].addr != 0; j = (j + 1) & (SLOTS - 1)) {
    size_t home = slot_of(store[j].addr);
    int between = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (between) continue;
    store[hole] = store[j];
    store[j].addr = 0;
    hole = j;
  }
}

int canary_write(uintptr_t addr, size_t size, uint64_t serial) {
  uintptr_t w[3], at[3];
  int n = words_of(addr, size, w, at);
  for (int k = 0; k < n; k++)
    if (insert(w[k], pattern(at[k], serial))) return -1;
  return 0;
}

int canary_intact(uintptr_t addr, size_t size, uint64_t serial, uintptr_t *bad_addr) {
  uintptr_t w[3], at[3];
  int n = words_of(addr, size, w, at);
  for (int k = 0; k < n; k++) {
    const word *found = find(w[k]);
    if (!found || found->value != pattern(at[k], serial)) {
      *bad_addr = w[k];
      return 0;
    }
  }
  return 1;
}

void canary_erase(uintptr_t addr, size_t size) {
  uintptr_t w[3], at[3];
  int n = words_of(addr, size, w, at);
  for (int k = 0; k < n; k++) {
    word *found = find(w[k]);
    if (found) erase_at(found);
  }
}

void canary_move(uintptr_t from, uintptr_t to, size_t size) {
  static word moved[SLOTS];
  size_t n = 0;
  for (size_t i = 0; i < SLOTS; i++)
    if (store[i].addr >= from && store[i].addr - from < size) moved[n++] = store[i];
  for (size_t k = 0; k < n; k++) erase_at(find(moved[k].addr));
  for (size_t k = 0; k < n; k++) insert(to + (moved[k].addr - from), moved[k].value);
}

size_t canary_words(void) { return used; }
