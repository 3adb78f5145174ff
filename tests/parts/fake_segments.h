/* A fake segment layer for testing the policy parts (policies/parts/)
 * alone: it implements the services of allocator/segments/services.h that
 * the parts call, over bookkeeping only. Device memory is an address
 * counter (nothing is ever read or written there), so a test can make a
 * terabyte segment; a test sets the knobs below to make the device say no,
 * run out of addresses or of descriptors, and reads the counters to see
 * what a part asked for.
 *
 * Expandable segments are modelled granule by granule (mapped or not), so
 * the arena's growing, mapping, unmapping and shrinking can be checked;
 * reclaim's markers, donors, lending and move budget are not: no fake
 * segment has markers (seg->marks is NULL) and no test arena sets
 * TA_POLICY_RECLAIM, so those services answer as a device with nothing
 * past, and the ones only a segment with markers reaches record a misuse.
 * Reclaim is tested through the public API on the simulated device
 * (tests/test_reclaim.c).
 *
 * Every service checks its contract as the real layer asserts it (a
 * segment released with more than one block, a split note for a block that
 * is not split, a grow that is not a granule multiple...) and counts a
 * breach in `misuse`, with a line on stderr: a test checks it stays 0. */
#ifndef TA_TEST_FAKE_SEGMENTS_H
#define TA_TEST_FAKE_SEGMENTS_H

#include "segments/services.h"

/* An expandable segment's address range, granule by granule. */
typedef struct ta_expansion {
  size_t granule;
  size_t reserved; /* bytes of addresses */
  uint8_t *mapped; /* per granule of the range: 1 when backed by device memory */
} ta_expansion;

struct ta_segments {
  /* --- knobs (zero: the default) --- */
  size_t device_limit;      /* device bytes it lends at most (ordinary segments and mapped granules); 0: no limit */
  size_t granule;           /* expandable segments' granule; 0: the device has none */
  size_t reserve_granules;  /* addresses of a new expandable segment, in granules; 0: 64 */
  int no_addresses;         /* 1: a new expandable segment gets no addresses (TA_ENOSPACE) */
  long fail_block_new;      /* the nth descriptor asked for from now is refused (1: the next); 0: none */
  int raise_peak;           /* ta_segments_would_raise_peak's answer */
  ta_free_census *census;   /* ta_segments_census's answer: told by every arena made from then on; NULL: none */

  /* --- what the parts did --- */
  size_t device_bytes;      /* lent now */
  long blocks;              /* descriptors handed out and not deleted */
  long inactive_split;      /* net notes of free split blocks */
  int64_t inactive_split_bytes;
  long allocs, releases, grows, maps, unmaps, shrinks;
  int misuse;               /* services called against their contract */

  /* --- the segments --- */
  ta_segment **live;        /* made and not released, in no order */
  size_t nlive, cap_live;
  ta_segment *drained[64];  /* what ta_segments_next_drained hands out */
  size_t ndrained;
  uintptr_t next_addr;      /* where the next range begins */
};

ta_segments *fake_segments_new(void);
/* Frees the segments left (a policy leaves its live blocks'), with their descriptors. */
void fake_segments_destroy(ta_segments *s);
/* 1 when the granule of `seg` holding `addr` is mapped (ordinary segments: always). */
int fake_segments_mapped_at(const ta_segment *seg, uintptr_t addr);

#endif
