/* A lock-free set of the device addresses live now, for the concurrency
 * stresses: every block a thread gets is entered (a CAS from empty; finding
 * the address already there means it was handed out while live elsewhere)
 * and leaves before it is freed. Slots are never reused (tombstones), so
 * size it above every insert of the run. */
#ifndef TA_TEST_LIVE_SET_H
#define TA_TEST_LIVE_SET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SET_SLOTS (1u << 20)
#define TOMBSTONE ((uintptr_t)1)

static _Atomic uintptr_t live_set[SET_SLOTS];
static atomic_int duplicates; /* an address handed out while live elsewhere */
static atomic_int set_errors; /* a free of an address the set did not hold, or the set full */

static void set_clear(void) {
  memset(live_set, 0, sizeof live_set);
  atomic_store(&duplicates, 0);
  atomic_store(&set_errors, 0);
}

static size_t slot_of(uintptr_t addr) { return (size_t)((addr >> 9) * 0x9E3779B97F4A7C15ull >> 40) & (SET_SLOTS - 1); }

/* Tombstones are never reused, so a probe always walks past every entry that
 * could equal addr: a duplicate cannot hide behind a reused slot. */
static void set_insert(uintptr_t addr) {
  for (size_t i = slot_of(addr), n = 0; n < SET_SLOTS; i = (i + 1) & (SET_SLOTS - 1), n++) {
    uintptr_t cur = atomic_load(&live_set[i]);
    if (cur == addr) {
      atomic_fetch_add(&duplicates, 1);
      return;
    }
    if (cur == 0) {
      uintptr_t expected = 0;
      if (atomic_compare_exchange_strong(&live_set[i], &expected, addr)) return;
      if (expected == addr) {
        atomic_fetch_add(&duplicates, 1);
        return;
      }
    }
  }
  atomic_fetch_add(&set_errors, 1); /* full: the test is misconfigured */
}

static void set_remove(uintptr_t addr) {
  for (size_t i = slot_of(addr), n = 0; n < SET_SLOTS; i = (i + 1) & (SET_SLOTS - 1), n++) {
    uintptr_t cur = atomic_load(&live_set[i]);
    if (cur == 0) break;
    if (cur == addr) {
      uintptr_t expected = addr;
      if (atomic_compare_exchange_strong(&live_set[i], &expected, TOMBSTONE)) return;
    }
  }
  atomic_fetch_add(&set_errors, 1);
}

#endif
