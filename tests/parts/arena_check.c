/* arena_check.h: the recount. */
#include "arena_check.h"

#include <stdio.h>

#include "policies/parts/arena_streams.h"

int arena_rig_up(arena_rig *r, unsigned flags, size_t granule) {
  *r = (arena_rig){.s = fake_segments_new(), .census = ta_census_create()};
  if (!r->s || !r->census) return arena_rig_down(r), -1;
  r->s->granule = granule;
  r->s->census = r->census; /* carried by the layer, as a heap's is: the arena takes it when it is made */
  r->policy = (ta_policy){.segments = r->s, .id = 3, .flags = flags};
  if (!(r->a = ta_arena_create(r->s, &r->policy))) return arena_rig_down(r), -1;
  return 0;
}

void arena_rig_down(arena_rig *r) {
  ta_arena_destroy(r->a);
  fake_segments_destroy(r->s);
  ta_census_destroy(r->census);
  *r = (arena_rig){0};
}

#define PROBLEM(...) (fprintf(stderr, "  arena check: " __VA_ARGS__), fputc('\n', stderr), problems++)
#define AT(x) ((unsigned long)(x)->addr) /* for %#lx */

/* The bin bins.h's layout puts a free block of `size` bytes in (not its
 * overflow bin, where a block goes when host memory ran out). */
static uint32_t expected_bin(size_t size) {
  uint64_t units = size >> TA_UNIT_SHIFT;
  if (units < TA_LINEAR_BINS) return (uint32_t)units;
  unsigned fl = 0;
  while ((units >> (fl + 1)) != 0) fl++;
  return TA_LINEAR_BINS + (fl - 12u) * (1u << TA_SL_BITS) + (uint32_t)((units >> (fl - TA_SL_BITS)) & 63u);
}

static int in_list(const ta_bins *bins, uint32_t bin, const ta_block *b) {
  for (const ta_block *x = bins->group[bin >> 6][bin & 63]; x; x = x->bin_next)
    if (x == b) return 1;
  return 0;
}

size_t arena_free_blocks(const ta_segments *s, size_t *bytes) {
  size_t n = 0;
  *bytes = 0;
  for (size_t i = 0; i < s->nlive; i++)
    for (const ta_block *b = s->live[i]->first; b; b = b->next)
      if (b->state == TA_BLOCK_FREE) n++, *bytes += b->size;
  return n;
}

/* One segment's blocks; adds its free blocks to *nfree per pool. */
static int check_segment(const ta_arena *a, const ta_segment *seg, size_t *nfree_split, int64_t *split_bytes) {
  int problems = 0;
  size_t blocks = 0;
  uintptr_t at = seg->addr;
  const ta_block *prev = NULL;
  if (!seg->first || seg->first->prev) PROBLEM("segment %#lx: bad first block", AT(seg));
  for (const ta_block *b = seg->first; b; prev = b, b = b->next, blocks++) {
    if (b->addr != at) PROBLEM("block %#lx: a gap or overlap before it (expected %#lx)", AT(b), (unsigned long)at);
    if (b->size == 0 || b->size % 512 || b->addr % 512) PROBLEM("block %#lx: size %zu", AT(b), b->size);
    if (b->prev != prev) PROBLEM("block %#lx: prev link broken", AT(b));
    if (b->segment != seg || b->stream != seg->stream) PROBLEM("block %#lx: not its segment's", AT(b));
    if (b->owner != a || b->policy != a->policy->id) PROBLEM("block %#lx: owner or policy wrong", AT(b));
    if (b->state != TA_BLOCK_FREE && b->state != TA_BLOCK_LIVE) PROBLEM("block %#lx: state %d", AT(b), b->state);
    if (b->state == TA_BLOCK_FREE && prev && prev->state == TA_BLOCK_FREE)
      PROBLEM("blocks %#lx and %#lx: free neighbours not merged", AT(prev), AT(b));
    if (b->state == TA_BLOCK_LIVE && seg->expansion && ta_segments_unmapped_in(seg, b->addr, b->size))
      PROBLEM("live block %#lx: on unmapped granules", AT(b));
    if (b->state == TA_BLOCK_FREE && ta_block_is_split(b)) ++*nfree_split, *split_bytes += (int64_t)b->size;
    at += b->size;
    if (blocks > seg->size / 512) {
      PROBLEM("segment %#lx: its block list loops", AT(seg));
      return problems;
    }
  }
  if (prev != seg->last) PROBLEM("segment %#lx: last block wrong", AT(seg));
  if (at != seg->addr + seg->size)
    PROBLEM("segment %#lx: blocks span %zu of %zu bytes", AT(seg), (size_t)(at - seg->addr), seg->size);
  if (seg->expansion && ta_segments_unmapped_in(seg, seg->addr, seg->size) != seg->unmapped)
    PROBLEM("segment %#lx: unmapped says %zu, the granules %zu", AT(seg), seg->unmapped,
            ta_segments_unmapped_in(seg, seg->addr, seg->size));
  return problems;
}

/* The free blocks of `stream` and `pool` in this arena's segments, each in its bin of `bins`. */
static int check_index(const ta_arena *a, const ta_segments *s, cudaStream_t stream, int pool, const ta_bins *bins) {
  int problems = 0;
  size_t n = 0;
  for (size_t i = 0; i < s->nlive; i++) {
    const ta_segment *seg = s->live[i];
    if (seg->owner != a || seg->stream != stream || seg->pool != pool) continue;
    for (const ta_block *b = seg->first; b; b = b->next) {
      if (b->state != TA_BLOCK_FREE) continue;
      n++;
      if (!bins) PROBLEM("free block %#lx: its stream has no index of pool %d", AT(b), pool);
      else if (b->bin != expected_bin(b->size) && b->bin != TA_NBINS)
        PROBLEM("free block %#lx of %zu bytes: in bin %u, not %u", AT(b), b->size, b->bin, expected_bin(b->size));
      else if (!in_list(bins, b->bin, b)) PROBLEM("free block %#lx: not in its bin's list", AT(b));
    }
  }
  if (bins && bins->count != n) PROBLEM("index of pool %d: holds %zu blocks, %zu free", pool, bins->count, n);
  return problems;
}

static int check_streams(const ta_arena *a, const ta_segments *s) {
  int problems = 0;
  size_t owned = 0;
  for (const ta_segment *seg = a->owned; seg; seg = seg->owner_next, owned++)
    if (seg->owner != a) PROBLEM("segment %#lx: in the arena's list, owned by another", AT(seg));
  for (size_t i = 0; i < a->nstreams; i++) {
    const ta_stream_bins *e = &a->streams[i];
    size_t segs = 0;
    for (size_t k = 0; k < s->nlive; k++) segs += s->live[k]->owner == a && s->live[k]->stream == e->stream;
    if (ta_arena_find_stream(a, e->stream) != i) PROBLEM("stream entry %zu: not found by its stream", i);
    if (e->segments != segs) PROBLEM("stream entry %zu: counts %zu segments, has %zu", i, e->segments, segs);
    if (segs == 0) PROBLEM("stream entry %zu: kept without segments", i);
    for (int pool = TA_POOL_SMALL; pool <= TA_POOL_LARGE; pool++) {
      problems += check_index(a, s, e->stream, pool, e->pool[pool]);
      const ta_segment *x = e->expandable[pool];
      if (x && (x->owner != a || x->stream != e->stream || x->pool != pool || !x->expansion))
        PROBLEM("stream entry %zu: its expandable segment of pool %d is not its", i, pool);
    }
  }
  size_t mine = 0;
  for (size_t k = 0; k < s->nlive; k++) {
    const ta_segment *seg = s->live[k];
    if (seg->owner != a) continue;
    mine++;
    if (ta_arena_find_stream(a, seg->stream) == a->nstreams)
      PROBLEM("segment %#lx: its stream has no entry", AT(seg));
  }
  if (mine != owned) PROBLEM("the arena lists %zu segments, the layer has %zu of it", owned, mine);
  return problems;
}

int arena_check(const ta_arena *a, const ta_segments *s) {
  int problems = 0;
  size_t nfree_split = 0, blocks = 0, largest = 0;
  int64_t split_bytes = 0;
  for (size_t i = 0; i < s->nlive; i++) {
    const ta_segment *seg = s->live[i];
    for (const ta_block *b = seg->first; b; b = b->next) {
      blocks++;
      if (b->state == TA_BLOCK_FREE && b->size > largest) largest = b->size;
      if (blocks > 100000000) break;
    }
    if (seg->owner == a) problems += check_segment(a, seg, &nfree_split, &split_bytes);
  }
  problems += check_streams(a, s);
  if (s->misuse) PROBLEM("the fake layer saw %d misuses", s->misuse);
  if ((long)blocks != s->blocks) PROBLEM("%ld descriptors out, %zu blocks in segments", s->blocks, blocks);
  /* The layer-wide figures hold for the arena's share when it is alone. */
  int alone = 1;
  for (size_t i = 0; i < s->nlive; i++) alone &= s->live[i]->owner == a;
  if (alone && (s->inactive_split != (long)nfree_split || s->inactive_split_bytes != split_bytes))
    PROBLEM("split notes: %ld blocks, %lld bytes; free split blocks: %zu, %lld bytes", s->inactive_split,
            (long long)s->inactive_split_bytes, nfree_split, (long long)split_bytes);
  if (a->census) { /* told by every arena of the layer */
    size_t bytes;
    arena_free_blocks(s, &bytes);
    if (a->census->bytes != (int64_t)bytes)
      PROBLEM("census: %lld free bytes, a walk %zu", (long long)a->census->bytes, bytes);
    if (ta_census_largest(a->census) != largest)
      PROBLEM("census: largest %zu, a walk %zu", ta_census_largest(a->census), largest);
  }
  return problems;
}
