/* Granules mapped in pieces: a large-pool granule (`handle`, 8 MiB by
 * default) backed by physical handles of the device's granule (2 MiB), each
 * mapped or not on its own (segments.h, ta_expansion.split).
 *
 * Why: a large handle is mapped and given back whole, so a free range that
 * holds no whole large granule gives nothing back, though it may hold
 * whole 2 MiB ones that PyTorch's expandable segments (2 MiB pages) would
 * unmap: near a full device or memory fraction, the request fails where
 * PyTorch's is served. So, near capacity (ta_segments_near_capacity), a
 * block is mapped only in the pieces it touches; and on the out-of-memory
 * path a large handle that holds free pieces is replaced: its other pieces
 * get handles of their own, the live bytes are copied over (the device is
 * idle then: the path synchronized), the large handle goes back, and the
 * free pieces with it. Away from capacity nothing here runs: large handles
 * cost the driver less per byte (bench/vmm_costs.c). */
#include <stdio.h>
#include <stdlib.h>

#include "segments/segments.h"
#include "accounting/stats.h"

/* The device's granule: the size of a piece. */
static size_t piece_of(const ta_segment *seg) { return seg->expansion->granule / seg->expansion->split_pieces; }

/* Pieces of granule `g` that [lo, hi) touches (`whole` 0) or holds wholly
 * (`whole` 1): [*first, *end). */
static void pieces_of(const ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi, int whole, size_t *first,
                      size_t *end) {
  size_t piece = piece_of(seg), granule = seg->expansion->granule;
  uintptr_t base = seg->addr + g * granule;
  lo = lo > base ? lo : base;
  hi = hi < base + granule ? hi : base + granule;
  if (hi <= lo) {
    *first = *end = 0;
    return;
  }
  *first = (whole ? ta_align_up(lo - base, piece) : lo - base) / piece;
  *end = (whole ? hi - base : ta_align_up(hi - base, piece)) / piece;
  if (*first > *end) *first = *end;
}

size_t ta_split_unmapped(const ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi) {
  size_t first, end, n = 0;
  pieces_of(seg, g, lo, hi, 0, &first, &end);
  for (size_t j = first; j < end; j++) n += !seg->expansion->split[g][j];
  return n * piece_of(seg);
}

int ta_split_holds_mapped(const ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi) {
  size_t first, end;
  pieces_of(seg, g, lo, hi, 1, &first, &end);
  for (size_t j = first; j < end; j++)
    if (seg->expansion->split[g][j]) return 1;
  return 0;
}

/* Granule `g`, unmapped, becomes split with no piece mapped. -1: host memory. */
static int split_empty(ta_segment *seg, size_t g) {
  ta_expansion *x = seg->expansion;
  uint64_t *pieces = calloc(x->split_pieces, sizeof *pieces);
  if (!pieces) return -1;
  x->split[g] = pieces;
  x->handles[g] = TA_HANDLE_SPLIT;
  return 0;
}

/* Back to unmapped once no piece is mapped. */
static void settle(ta_segment *seg, size_t g) {
  ta_expansion *x = seg->expansion;
  for (size_t j = 0; j < x->split_pieces; j++)
    if (x->split[g][j]) return;
  free(x->split[g]);
  x->split[g] = NULL;
  x->handles[g] = 0;
}

int ta_split_map(ta_segments *s, ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi) {
  ta_expansion *x = seg->expansion;
  if (x->handles[g] == 0 && split_empty(seg, g)) return TA_ENOMEM;
  size_t first, end, piece = piece_of(seg);
  pieces_of(seg, g, lo, hi, 0, &first, &end);
  uintptr_t base = seg->addr + g * x->granule;
  int rc = TA_OK;
  for (size_t j = first; j < end && rc == TA_OK; j++) {
    if (x->split[g][j]) continue;
    if (s->limit && (size_t)ta_stat_total(s->stats->reserved_bytes) + piece > s->limit) rc = TA_ENOMEM;
    else if (s->backend->ops->map(s->backend, s->device, base + j * piece, piece, piece, &x->split[g][j], s->peers))
      rc = TA_ENOMEM;
    if (rc != TA_OK) break;
    seg->unmapped -= piece;
    s->stats->num_handles_created++;
    ta_segments_account(s, seg, base + j * piece, piece, +1);
    ta_segments_may_donate(s, seg);
  }
  settle(seg, g); /* a granule that got no piece is unmapped again */
  return rc;
}

/* Unmap and give back the mapped pieces [first, end) of granule `g`
 * (`account`: in the stats and the log); a granule left with none is
 * unmapped. Returns the bytes. */
static size_t unmap_pieces(ta_segments *s, ta_segment *seg, size_t g, size_t first, size_t end, int account) {
  ta_expansion *x = seg->expansion;
  size_t piece = piece_of(seg), released = 0;
  uintptr_t base = seg->addr + g * x->granule;
  for (size_t j = first; j < end; j++) {
    if (!x->split[g][j]) continue;
    if (account) ta_segments_account(s, seg, base + j * piece, piece, -1);
    s->backend->ops->unmap(s->backend, s->device, base + j * piece, piece, piece, &x->split[g][j], 1);
    s->stats->num_handles_released++;
    x->split[g][j] = 0;
    released += piece;
  }
  settle(seg, g);
  return released;
}

size_t ta_split_unmap(ta_segments *s, ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi) {
  size_t first, end;
  pieces_of(seg, g, lo, hi, 1, &first, &end);
  size_t released = unmap_pieces(s, seg, g, first, end, 1);
  seg->unmapped += released;
  return released;
}

void ta_split_release(ta_segments *s, ta_segment *seg, size_t g, int account) {
  unmap_pieces(s, seg, g, 0, seg->expansion->split_pieces, account);
}

int ta_split_grant(ta_segments *s, ta_segment *seg, size_t g, uint64_t peers) {
  ta_expansion *x = seg->expansion;
  size_t piece = piece_of(seg);
  int rc = TA_OK;
  for (size_t j = 0; j < x->split_pieces; j++)
    if (x->split[g][j] &&
        s->backend->ops->grant(s->backend, s->device, seg->addr + g * x->granule + j * piece, piece, peers))
      rc = TA_EDEVICE;
  return rc;
}

int ta_segments_mapped_stretch(const ta_segment *seg, uintptr_t lo, uintptr_t hi, uintptr_t *run_lo,
                               uintptr_t *run_hi) {
  const ta_expansion *x = seg->expansion;
  size_t granule = x->granule, piece = piece_of(seg);
  uintptr_t at = seg->addr + ta_align_up(lo - seg->addr, piece), start = 0;
  while (at + piece <= hi) {
    size_t off = at - seg->addr, g = off / granule, step;
    int mapped;
    if (x->handles[g] == TA_HANDLE_SPLIT) {
      mapped = x->split[g][off % granule / piece] != 0;
      step = piece;
    } else if (off % granule) { /* part of a whole granule: not inside [lo, hi) */
      mapped = 0;
      step = granule - off % granule;
    } else {
      mapped = x->handles[g] && !x->lent[g] && at + granule <= hi;
      step = granule;
    }
    if (!mapped && start) break;
    if (mapped && !start) start = at;
    at += step;
  }
  if (!start) return 0;
  *run_lo = start;
  *run_hi = at < hi ? at : hi;
  return 1;
}

#define NEAR_CAPACITY_SHIFT 5 /* 1/32 */

/* Why 1/32: far from capacity a large handle costs the driver a quarter of
 * the calls per byte of 2 MiB ones, and the memory it strands (replay of
 * the bundled traces: reserved 1.007x allocated in 4 MiB handles, 1.009x
 * in 8 MiB) does not decide whether a run fits; within the last 3 % it
 * does (PyTorch's expandable segments, in 2 MiB pages, completed the
 * transformer runs at 1.03x their peak and not at 1.01x). */
/* The device's free memory: asked of the driver (a call that costs more
 * than the check it serves) only when the estimate from what torchalloc
 * reserved since the last answer comes within twice the margin of `bytes`,
 * or every 64th time (other processes may have taken memory meanwhile). */
static size_t device_free(ta_segments *s, size_t bytes, size_t *total) {
  int64_t reserved = ta_stat_total(s->stats->reserved_bytes), grown = reserved - s->reserved_at_seen;
  size_t estimate = grown <= 0 ? s->free_seen : (size_t)grown < s->free_seen ? s->free_seen - (size_t)grown : 0;
  if (s->total_seen && s->free_skipped < 64 && estimate > bytes + 2 * (s->total_seen >> NEAR_CAPACITY_SHIFT)) {
    s->free_skipped++;
    *total = s->total_seen;
    return estimate;
  }
  size_t free_b = 0;
  if (s->backend->ops->mem_info(s->backend, s->device, &free_b, total) != TA_OK) *total = 0;
  s->free_seen = free_b, s->total_seen = *total, s->reserved_at_seen = reserved, s->free_skipped = 0;
  return free_b;
}

int ta_segments_near_capacity(ta_segments *s, size_t bytes) {
  size_t total = 0, free_b = device_free(s, bytes, &total);
  if (total == 0) return 0;
  if (free_b < bytes + (total >> NEAR_CAPACITY_SHIFT)) return 1;
  if (!s->limit) return 0;
  size_t reserved = (size_t)ta_stat_total(s->stats->reserved_bytes);
  return reserved + bytes + (s->limit >> NEAR_CAPACITY_SHIFT) > s->limit;
}

/* ------------------------------------------------------------------------
 * The out-of-memory path: large handles holding free pieces replaced
 * ---------------------------------------------------------------------- */

/* Which pieces of the mapped granule `g` lie wholly in free blocks
 * (*walk: the first block that may overlap it, advanced as granules go up):
 * into free_piece[], their count returned. */
static size_t free_pieces(const ta_segment *seg, size_t g, const ta_block **walk, uint8_t *free_piece) {
  size_t piece = piece_of(seg), k = seg->expansion->split_pieces, n = 0;
  uintptr_t base = seg->addr + g * seg->expansion->granule;
  const ta_block *b = *walk;
  while (b && b->addr + b->size <= base) b = b->next;
  *walk = b;
  for (size_t j = 0; j < k; j++) {
    uintptr_t lo = base + j * piece;
    while (b && b->addr + b->size <= lo) b = b->next;
    free_piece[j] = b && b->state == TA_BLOCK_FREE && b->addr <= lo && b->addr + b->size >= lo + piece;
    n += free_piece[j];
  }
  return n;
}

/* Replace the large handle of granule `g` (scratch: addresses of one
 * granule to copy through). The bytes given back, 0 when nothing changed. */
static size_t replace(ta_segments *s, ta_segment *seg, size_t g, const uint8_t *free_piece, uintptr_t scratch) {
  ta_expansion *x = seg->expansion;
  uint64_t *pieces = calloc(x->split_pieces, sizeof *pieces);
  if (!pieces) return 0;
  ptrdiff_t released = ta_segments_replace_handle(s, seg, seg->addr + g * x->granule, &x->handles[g],
                                                  x->split_pieces, piece_of(seg), free_piece, scratch, pieces);
  if (released < 0) {
    free(pieces);
    return 0;
  }
  x->handles[g] = TA_HANDLE_SPLIT;
  x->split[g] = pieces;
  return (size_t)released;
}

size_t ta_segments_split_free(ta_segments *s, size_t want) {
  const ta_backend_ops *ops = s->backend->ops;
  if (!s->granule || !ops->copy || s->no_sync) return 0;
  /* Runs of granules holding free ones first (segments_runs.c): their granules become handles of their own. */
  size_t released = ta_runs_break_free(s, want);
  uint8_t *free_piece = NULL;
  uintptr_t scratch = 0;
  size_t scratch_size = 0;
  for (size_t i = 0; i < s->registry.count && released < want; i++) {
    ta_segment *seg = s->registry.items[i];
    ta_expansion *x = seg->expansion;
    if (!x || x->split_pieces < 2) continue; /* a granule of the device's size has no pieces to give back */
    if (scratch_size < x->granule) { /* one granule of addresses to copy through */
      if (scratch) ops->unreserve(s->backend, s->device, scratch, scratch_size);
      scratch = 0, scratch_size = 0;
      uint8_t *grown = realloc(free_piece, x->split_pieces);
      if (!grown || ops->reserve(s->backend, s->device, x->granule, &scratch) != TA_OK) {
        free(grown ? grown : free_piece);
        return released;
      }
      free_piece = grown;
      scratch_size = x->granule;
    }
    const ta_block *walk = seg->first;
    for (size_t g = 0; g < seg->size / x->granule && released < want; g++) {
      if (x->handles[g] == 0 || x->handles[g] == TA_HANDLE_SPLIT || x->lent[g] || x->run[g]) continue;
      if (!free_pieces(seg, g, &walk, free_piece)) continue;
      released += replace(s, seg, g, free_piece, scratch);
    }
  }
  if (scratch) ops->unreserve(s->backend, s->device, scratch, scratch_size);
  free(free_piece);
  return released;
}
