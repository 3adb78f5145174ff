/* The invariant checker (heap.h): recount everything from the segment and
 * block lists and compare with the stats the hot path keeps. Called by
 * tests, fuzzers and torchalloc_check_invariants; never on the hot path. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "heap/heap.h"

typedef struct recount {
  int64_t allocation[3], allocated_bytes[3], requested_bytes[3], active[3], active_bytes[3];
  int64_t segment[3], reserved_bytes[3], inactive_split[3], inactive_split_bytes[3];
  size_t live_blocks;
} recount;

static void add3(int64_t v[3], int pool, int64_t n) {
  v[0] += n;
  v[pool] += n;
}

#define FAIL(...)                            \
  do {                                       \
    snprintf(err, errlen, __VA_ARGS__);      \
    return -1;                               \
  } while (0)

/* An expandable segment: its size within its addresses, its unmapped count
 * equal to the granules without a handle, and every granule a live (or
 * pending) block touches mapped. *mapped receives the bytes mapped. */
static int check_expansion(const ta_segment *s, size_t *mapped, char *err, size_t errlen) {
  const ta_expansion *x = s->expansion;
  if (s->size == 0 || s->size % x->granule || s->size > x->reserved || s->unmapped > s->size)
    FAIL("expandable segment %p: %zu bytes of %zu reserved, %zu unmapped, granule %zu", (void *)s->addr, s->size,
         x->reserved, s->unmapped, x->granule);
  size_t holes = 0; /* a lent granule is still mapped here, but its memory counts where it serves now */
  for (size_t g = 0; g < s->size / x->granule; g++) {
    uintptr_t lo = s->addr + g * x->granule;
    holes += x->handles[g] == TA_HANDLE_SPLIT ? ta_split_unmapped(s, g, lo, lo + x->granule)
             : x->handles[g] == 0 || x->lent[g] ? x->granule
                                                 : 0;
  }
  if (holes != s->unmapped)
    FAIL("expandable segment %p: %zu bytes of granules unmapped, its count says %zu bytes", (void *)s->addr, holes,
         s->unmapped);
  for (const ta_block *b = s->first; b; b = b->next) {
    if (b->state == TA_BLOCK_FREE) continue;
    for (size_t g = (b->addr - s->addr) / x->granule; g * x->granule < b->addr + b->size - s->addr; g++) {
      int missing = x->handles[g] == TA_HANDLE_SPLIT ? ta_split_unmapped(s, g, b->addr, b->addr + b->size) != 0
                                                     : !x->handles[g] || x->lent[g];
      if (b->state != TA_BLOCK_RETIRING && missing)
        FAIL("live block %p lies on a granule unmapped or lent", (void *)b->addr);
    }
  }
  *mapped = s->size - s->unmapped;
  return 0;
}

static int check_segment(ta_heap *h, const ta_segment *s, recount *rc, char *err, size_t errlen)
    TA_REQUIRES(h->lock) {
  uintptr_t expect = s->addr;
  const ta_block *prev = NULL;
  for (const ta_block *b = s->first; b; prev = b, b = b->next) {
    if (b->addr != expect) FAIL("segment %p: block at %p, expected %p (gap or overlap)", (void *)s->addr,
                                (void *)b->addr, (void *)expect);
    if (b->prev != prev) FAIL("block %p: prev link broken", (void *)b->addr);
    if (b->segment != s) FAIL("block %p: points to the wrong segment", (void *)b->addr);
    if (b->size == 0 || b->size % 512) FAIL("block %p: size %zu is not a positive multiple of 512", (void *)b->addr, b->size);
    if (b->stream != s->stream) FAIL("block %p: stream differs from its segment's", (void *)b->addr);
    expect = b->addr + b->size;
    if (b->state == TA_BLOCK_FREE) {
      if (prev && prev->state == TA_BLOCK_FREE) FAIL("blocks %p and %p are both free but not merged",
                                                     (void *)prev->addr, (void *)b->addr);
      if (ta_block_is_split(b)) {
        add3(rc->inactive_split, s->pool, 1);
        add3(rc->inactive_split_bytes, s->pool, (int64_t)b->size);
      }
    } else if (b->state == TA_BLOCK_RETIRING) {
      /* granules count from the segment's start: its address is aligned to the device's granule only */
      if (!s->expansion || (b->addr - s->addr) % s->expansion->granule || b->size % s->expansion->granule)
        FAIL("retiring block %p is not whole granules of an expandable segment", (void *)b->addr);
    } else {
      if (ta_ptrmap_get(&h->live, b->addr) != b) FAIL("live block %p is missing from the pointer map", (void *)b->addr);
      if (b->requested == 0 || b->requested > b->size) FAIL("live block %p: requested %zu outside (0, %zu]",
                                                           (void *)b->addr, b->requested, b->size);
      rc->live_blocks++;
      add3(rc->active, s->pool, 1);
      add3(rc->active_bytes, s->pool, (int64_t)b->size);
      if (b->state == TA_BLOCK_LIVE) {
        add3(rc->allocation, s->pool, 1);
        add3(rc->allocated_bytes, s->pool, (int64_t)b->size);
        add3(rc->requested_bytes, s->pool, (int64_t)b->requested);
      }
    }
  }
  if (expect != s->addr + s->size) FAIL("segment %p: blocks cover %zu of %zu bytes", (void *)s->addr,
                                        (size_t)(expect - s->addr), s->size);
  if (s->last != prev) FAIL("segment %p: its last-block link is wrong", (void *)s->addr);
  size_t mapped = s->size;
  if (s->expansion && check_expansion(s, &mapped, err, errlen)) return -1;
  add3(rc->segment, s->pool, 1);
  add3(rc->reserved_bytes, s->pool, (int64_t)mapped);
  return 0;
}

static int compare(const char *name, const torchalloc_stat st[3], const int64_t v[3], char *err, size_t errlen) {
  for (int p = 0; p < 3; p++)
    if (st[p].current != v[p]) FAIL("stat %s[%d].current is %" PRId64 ", recount gives %" PRId64, name, p,
                                    st[p].current, v[p]);
  return 0;
}

int ta_heap_check(ta_heap *h, char *err, size_t errlen) {
  ta_lock_acquire(&h->lock);
  recount rc;
  memset(&rc, 0, sizeof rc);
  int bad = 0;
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; i < r->count && !bad; i++) {
    const ta_segment *s = r->items[i];
    if (i > 0 && r->items[i - 1]->addr + r->items[i - 1]->size > s->addr) {
      snprintf(err, errlen, "segments %p and %p overlap", (void *)r->items[i - 1]->addr, (void *)s->addr);
      bad = 1;
    } else {
      bad = check_segment(h, s, &rc, err, errlen) != 0;
    }
  }
  if (!bad && rc.live_blocks != h->live.count) {
    snprintf(err, errlen, "pointer map holds %zu blocks, segments hold %zu live ones", h->live.count, rc.live_blocks);
    bad = 1;
  }
  torchalloc_stats exported;
  const torchalloc_stats *s = &exported;
  ta_stats_export(&h->stats, &h->pending_stats, &exported);
  bad = bad || compare("allocation", s->allocation, rc.allocation, err, errlen) ||
        compare("allocated_bytes", s->allocated_bytes, rc.allocated_bytes, err, errlen) ||
        compare("requested_bytes", s->requested_bytes, rc.requested_bytes, err, errlen) ||
        compare("active", s->active, rc.active, err, errlen) ||
        compare("active_bytes", s->active_bytes, rc.active_bytes, err, errlen) ||
        compare("segment", s->segment, rc.segment, err, errlen) ||
        compare("reserved_bytes", s->reserved_bytes, rc.reserved_bytes, err, errlen) ||
        compare("inactive_split", s->inactive_split, rc.inactive_split, err, errlen) ||
        compare("inactive_split_bytes", s->inactive_split_bytes, rc.inactive_split_bytes, err, errlen);
  ta_lock_release(&h->lock);
  return bad ? -1 : 0;
}
