/* Expandable segments (policy.h, segments.h): one address range reserved
 * once, backed by device memory granule by granule as it grows at its end
 * and given back from its end as it shrinks.
 *
 * Why: an ordinary segment is one device allocation of a fixed size, so a
 * request that no free block fits needs a new segment even when the free
 * bytes are there, split across segments; and a segment with one live block
 * left cannot be given back. An expandable segment turns the free block at
 * its end into as much room as the device has, so large requests need no
 * contiguous hole, and its free end can be unmapped while the rest lives.
 *
 * The log sees every growth as a SEGMENT_ALLOC of the range added and every
 * shrink as SEGMENT_FREEs of whole ranges it named before (then an ALLOC of
 * the part of the last one that stays), so a reader pairing records by
 * address keeps an exact account. */
#include <stdlib.h>
#include <string.h>

#include "segments.h"
#include "stats.h"

size_t ta_segments_granule(const ta_segments *s) { return s->granule; }

static int reserve_handles(ta_expansion *x, size_t granules) {
  if (granules <= x->cap_handles) return 0;
  size_t cap = x->cap_handles ? x->cap_handles : 16;
  while (cap < granules) cap *= 2;
  uint64_t *h = realloc(x->handles, cap * sizeof *h);
  if (!h) return -1;
  x->handles = h;
  x->cap_handles = cap;
  return 0;
}

static int push_grown(ta_expansion *x, size_t offset) {
  if (x->ngrown == x->cap_grown) {
    size_t cap = x->cap_grown ? x->cap_grown * 2 : 8;
    size_t *g = realloc(x->grown, cap * sizeof *g);
    if (!g) return -1;
    x->grown = g;
    x->cap_grown = cap;
  }
  x->grown[x->ngrown++] = offset;
  return 0;
}

/* Map `bytes` at the end of what is mapped; the caller accounts for it. */
static int map_more(ta_segments *s, ta_segment *seg, size_t bytes) {
  ta_expansion *x = seg->expansion;
  if (bytes > x->reserved - seg->size) return TA_ENOSPACE;
  if (s->limit && (size_t)ta_stat_total(s->stats->reserved_bytes) + bytes > s->limit) return TA_ENOMEM;
  if (reserve_handles(x, (seg->size + bytes) / x->granule) || push_grown(x, seg->size)) return TA_ENOMEM;
  uint64_t *handles = x->handles + seg->size / x->granule;
  if (s->backend->ops->map(s->backend, s->device, seg->addr + seg->size, bytes, handles) != TA_OK) {
    x->ngrown--;
    return TA_ENOMEM;
  }
  return TA_OK;
}

ta_segment *ta_segments_alloc_expandable(ta_segments *s, size_t size, cudaStream_t stream, int pool, void *owner,
                                         ta_policy *policy, int *status) {
  *status = TA_ENOSPACE;
  if (!s->granule) return NULL;
  size_t free_b = 0, total = 0;
  if (s->backend->ops->mem_info(s->backend, s->device, &free_b, &total) != TA_OK || total == 0) return NULL;
  /* As many addresses as the device has bytes: the segment can then grow
   * to anything the device could give it. */
  size_t reserved = ta_align_up(total, s->granule);
  size = ta_align_up(size, s->granule);
  if (size > reserved) return NULL;
  *status = TA_ENOMEM;
  ta_segment *seg = calloc(1, sizeof *seg);
  ta_expansion *x = calloc(1, sizeof *x);
  ta_block *b = ta_segments_block_new(s);
  uintptr_t addr = 0;
  if (!seg || !x || !b) goto fail;
  if (s->backend->ops->reserve(s->backend, s->device, reserved, &addr) != TA_OK) {
    *status = TA_ENOSPACE;
    goto fail;
  }
  *x = (ta_expansion){.reserved = reserved, .granule = s->granule};
  *seg = (ta_segment){.addr = addr, .size = 0, .stream = stream, .first = b, .last = b, .expansion = x,
                      .owner = owner, .policy_instance = policy, .pool = (uint8_t)pool, .policy = policy->id};
  int rc = map_more(s, seg, size);
  if (rc == TA_OK) seg->size = size;
  if (rc != TA_OK || ta_segments_register(s, seg)) {
    if (rc == TA_OK) s->backend->ops->unmap(s->backend, s->device, addr, size, x->handles);
    s->backend->ops->unreserve(s->backend, s->device, addr, reserved);
    free(x->handles);
    free(x->grown);
    goto fail;
  }
  *b = (ta_block){.addr = addr, .size = size, .segment = seg, .stream = stream, .owner = owner, .policy = policy->id,
                  .state = TA_BLOCK_FREE};
  ta_stats_add(s->stats->segment, pool, 1);
  ta_segments_account(s, seg, addr, size, +1, 1);
  return seg;
fail:
  free(seg);
  free(x);
  if (b) ta_segments_block_delete(s, b);
  return NULL;
}

int ta_segments_grow(ta_segments *s, ta_segment *seg, size_t bytes) {
  ta_assert(seg->expansion && bytes % seg->expansion->granule == 0);
  int rc = map_more(s, seg, bytes);
  if (rc != TA_OK) return rc;
  uintptr_t at = seg->addr + seg->size;
  seg->size += bytes;
  ta_segments_account(s, seg, at, bytes, +1, 1);
  return TA_OK;
}

void ta_segments_shrink(ta_segments *s, ta_segment *seg, size_t new_size) {
  ta_expansion *x = seg->expansion;
  ta_assert(x && new_size > 0 && new_size < seg->size && new_size % x->granule == 0);
  s->backend->ops->unmap(s->backend, s->device, seg->addr + new_size, seg->size - new_size,
                         x->handles + new_size / x->granule);
  /* The log: whole ranges out, then the kept head of the last one back in. */
  size_t end = seg->size;
  while (x->ngrown && x->grown[x->ngrown - 1] >= new_size) {
    size_t start = x->grown[--x->ngrown];
    ta_segments_account(s, seg, seg->addr + start, end - start, -1, 1);
    end = start;
  }
  if (end > new_size) { /* the last range left straddles new_size: one device free, two records */
    size_t start = x->grown[x->ngrown - 1];
    ta_segments_account(s, seg, seg->addr + start, end - start, -1, 1);
    ta_segments_account(s, seg, seg->addr + start, new_size - start, +1, 0);
  }
  seg->size = new_size;
}

void ta_segments_expansion_release(ta_segments *s, ta_segment *seg, int account) {
  ta_expansion *x = seg->expansion;
  if (account) {
    size_t end = seg->size;
    for (size_t i = x->ngrown; i-- > 0;) {
      ta_segments_account(s, seg, seg->addr + x->grown[i], end - x->grown[i], -1, 1);
      end = x->grown[i];
    }
  }
  if (seg->size) s->backend->ops->unmap(s->backend, s->device, seg->addr, seg->size, x->handles);
  s->backend->ops->unreserve(s->backend, s->device, seg->addr, x->reserved);
  free(x->handles);
  free(x->grown);
  free(x);
  seg->expansion = NULL;
}
