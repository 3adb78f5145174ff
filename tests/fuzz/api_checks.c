/* The API driver's checks (api_driver.h lists them): a new block against
 * the shadow map, the sim's capture violations, the canary words, and the
 * full check (the core's own invariant recount, the snapshot, the stats
 * and misuse counters against the shadow). */
#include <stdio.h>
#include <stdlib.h>

#include "canary.h"
#include "driver_state.h"
#include "torchalloc_sim.h"

torchalloc_stats drv_stats_of(int device) {
  torchalloc_stats s;
  EXPECT(torchalloc_get_stats(device, &s) == 0, "get_stats(%d): %s", device, torchalloc_last_error());
  return s;
}

/* The canary's key for device address `addr`: the physical memory behind
 * it (aliases of one granule are one word), the device in the top bits. */
uint64_t drv_physical(uintptr_t addr) {
  int device = (int)(addr >> 52) - 1;
  uint64_t phys = 0;
  if (device < 0 || device >= D.ndevices || torchalloc_sim_physical(device, (void *)addr, &phys) != 0)
    return addr; /* unmapped: the driver's kernel touching the block is a violation already */
  return phys | (uint64_t)device << 58;
}

void drv_copied(int device, uint64_t dst, uint64_t src, size_t size) {
  canary_move(src | (uint64_t)device << 58, dst | (uint64_t)device << 58, size);
}

/* ------------------------------------------------------------------------
 * The checks
 * ---------------------------------------------------------------------- */

int drv_find_live(uintptr_t addr) {
  for (int i = 0; i < D.nlive; i++)
    if (D.live[i].addr == addr) return i;
  return -1;
}

/* A block just handed out: aligned, on its device, overlapping nothing live. */
void drv_check_new_block(uintptr_t p, size_t size, int device) {
  uintptr_t lo = (uintptr_t)(device + 1) << 52, hi = (uintptr_t)(device + 2) << 52;
  EXPECT(p % 512 == 0, "block %#lx of %zu bytes is not 512-aligned", (unsigned long)p, size);
  EXPECT(p >= lo && p < hi && size <= hi - p, "block %#lx of %zu bytes is outside device %d's range",
         (unsigned long)p, size, device);
  for (int i = 0; i < D.nlive; i++) {
    const shadow_block *b = &D.live[i];
    EXPECT(p + size <= b->addr || b->addr + b->size <= p,
           "block %#lx of %zu bytes overlaps live block %#lx of %zu bytes (device %d)", (unsigned long)p, size,
           (unsigned long)b->addr, b->size, b->device);
  }
}

/* The block's canary words still hold what its allocation wrote. */
void drv_check_canary(const shadow_block *b) {
  uintptr_t bad = 0;
  EXPECT(canary_intact(b->addr, b->size, b->serial, &bad),
         "device %d: block %#lx of %zu bytes (allocation %llu) lost its canary at %#lx: the range was handed out "
         "again or written over",
         b->device, (unsigned long)b->addr, b->size, (unsigned long long)b->serial, (unsigned long)bad);
}

void drv_check_capture_violations(void) {
  for (int d = 0; d < D.ndevices; d++) {
    if (D.cap[d].state == CAP_UNGUARDED) continue; /* the core was not told: violations are expected */
    char why[128];
    int64_t v = torchalloc_sim_capture_violations(d, why, sizeof why);
    EXPECT(v == D.violations[d], "device %d: %lld capture violations, expected %lld (last: %s)", d, (long long)v,
           (long long)D.violations[d], why);
  }
}

static int by_addr(const void *a, const void *b) {
  uintptr_t x = ((const shadow_block *)a)->addr, y = ((const shadow_block *)b)->addr;
  return x < y ? -1 : x > y;
}

static void grow_snapshot_buffers(size_t nsegs, size_t nblocks) {
  if (nsegs > D.segs_cap) {
    D.segs_cap = nsegs * 2;
    D.segs = realloc(D.segs, D.segs_cap * sizeof *D.segs);
  }
  if (nblocks > D.blocks_cap) {
    D.blocks_cap = nblocks * 2;
    D.blocks = realloc(D.blocks, D.blocks_cap * sizeof *D.blocks);
  }
  EXPECT(D.segs && D.blocks, "out of host memory for the snapshot");
}

/* Snapshot's LIVE blocks of `device` == the shadow's, field by field. */
static void check_snapshot(int device) {
  size_t nsegs = 0, nblocks = 0;
  int rc;
  while ((rc = torchalloc_snapshot(device, D.segs, D.segs_cap, D.blocks, D.blocks_cap, &nsegs, &nblocks)) == 1)
    grow_snapshot_buffers(nsegs, nblocks);
  EXPECT(rc == 0, "snapshot(%d) returned %d: %s", device, rc, torchalloc_last_error());
  static shadow_block mine[MAX_LIVE];
  int nmine = 0;
  for (int i = 0; i < D.nlive; i++)
    if (D.live[i].device == device) mine[nmine++] = D.live[i];
  qsort(mine, (size_t)nmine, sizeof mine[0], by_addr);
  int k = 0; /* segments and their blocks come in address order: so do the live ones */
  for (size_t s = 0; s < nsegs; s++) {
    const torchalloc_segment_info *seg = &D.segs[s];
    for (uint32_t j = 0; j < seg->nblocks; j++) {
      const torchalloc_block_info *b = &D.blocks[seg->first_block + j];
      if (b->state != TORCHALLOC_BLOCK_LIVE) continue;
      EXPECT(k < nmine, "device %d: live block %#llx (%llu bytes) is not one the caller holds", device,
             (unsigned long long)b->addr, (unsigned long long)b->requested);
      const shadow_block *m = &mine[k++];
      EXPECT(b->addr == m->addr && b->requested == m->size,
             "device %d: snapshot has live block %#llx of %llu bytes where the caller holds %#lx of %zu", device,
             (unsigned long long)b->addr, (unsigned long long)b->requested, (unsigned long)m->addr, m->size);
      uint64_t want0 = m->pool == NO_POOL ? 0 : drv_pool_ids[m->pool][0];
      uint64_t want1 = m->pool == NO_POOL ? 0 : drv_pool_ids[m->pool][1];
      EXPECT(seg->pool_id[0] == want0 && seg->pool_id[1] == want1,
             "device %d: block %#lx lies in a segment of pool (%llu, %llu), it was allocated from (%llu, %llu)",
             device, (unsigned long)m->addr, (unsigned long long)seg->pool_id[0],
             (unsigned long long)seg->pool_id[1], (unsigned long long)want0, (unsigned long long)want1);
      EXPECT((cudaStream_t)(uintptr_t)seg->stream == m->stream, "device %d: block %#lx is in a segment of another stream",
             device, (unsigned long)m->addr);
    }
  }
  EXPECT(k == nmine, "device %d: the caller holds %d blocks, the snapshot shows %d of them live", device, nmine, k);
}

static int64_t misuse_counted(void) {
  int64_t total = 0;
  for (int d = 0; d < D.ndevices; d++) {
    torchalloc_stats s = drv_stats_of(d);
    total += s.num_bad_free_unknown + s.num_bad_double_free + s.num_bad_free_size + s.num_bad_free_stream +
             s.num_bad_size;
    if (d == 0) total += s.num_bad_device; /* process-wide: every device reports the same */
  }
  return total;
}

void drv_full_check(void) {
  for (int d = 0; d < D.ndevices; d++) {
    EXPECT(torchalloc_check_invariants(d) == 0, "invariants of device %d: %s", d, torchalloc_last_error());
    check_snapshot(d);
    torchalloc_stats s = drv_stats_of(d);
    int64_t count = 0, bytes = 0;
    for (int i = 0; i < D.nlive; i++)
      if (D.live[i].device == d) count++, bytes += (int64_t)D.live[i].size;
    EXPECT(s.allocation[TORCHALLOC_POOL_ALL].current == count, "device %d: allocation.current %lld, the caller holds %lld",
           d, (long long)s.allocation[TORCHALLOC_POOL_ALL].current, (long long)count);
    EXPECT(s.requested_bytes[TORCHALLOC_POOL_ALL].current == bytes,
           "device %d: requested_bytes.current %lld, the caller holds %lld", d,
           (long long)s.requested_bytes[TORCHALLOC_POOL_ALL].current, (long long)bytes);
    EXPECT(s.num_ooms == D.ooms[d], "device %d: num_ooms %lld, expected %lld", d, (long long)s.num_ooms,
           (long long)D.ooms[d]);
  }
  for (int i = 0; i < D.nlive; i++) drv_check_canary(&D.live[i]);
  int64_t misuse = misuse_counted();
  EXPECT(misuse == D.misuse, "misuse counters sum to %lld, %lld bad calls were made", (long long)misuse,
         (long long)D.misuse);
  D.n.checks++;
}