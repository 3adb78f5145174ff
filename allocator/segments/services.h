/* The segment layer's services to the policies: what a policy and its
 * building blocks (policies/parts/) may ask of the segment layer, on an
 * opaque `ta_segments` (its struct is segments.h's, which no policy sees).
 * Device memory comes only from here. Callers hold the heap lock. The rest
 * of the layer (lookups, IPC, teardown), for the heap, is in segments.h. */
#ifndef TA_SEGMENT_SERVICES_H
#define TA_SEGMENT_SERVICES_H

#include "block/block.h"
#include "accounting/free_census.h"

typedef struct ta_segments ta_segments;
typedef struct ta_policy ta_policy; /* policy/policy.h: the policy a segment is made for */

/* The census of free blocks to tell of every block entering or leaving a
 * free index (set when the heap is made: replay's); NULL: none. */
ta_internal ta_free_census *ta_segments_census(const ta_segments *s);

/* A block descriptor from the slab (uninitialised), and back. NULL when host
 * memory runs out. */
ta_internal ta_block *ta_segments_block_new(ta_segments *s);
ta_internal void ta_segments_block_delete(ta_segments *s, ta_block *b);
/* A device allocation of `size` bytes as one segment holding one FREE block
 * (not yet in any free index), made for `policy` (its blocks are freed
 * there) and `owner` (the policy's own bookkeeping: an arena, say). NULL
 * when the device (or the memory fraction) says no. */
ta_internal ta_segment *ta_segments_alloc(ta_segments *s, size_t size, cudaStream_t stream, int pool, void *owner,
                                         ta_policy *policy);
/* Return a segment whose only block is FREE (and out of any index) to the device. */
ta_internal void ta_segments_release(ta_segments *s, ta_segment *seg);

/* Expandable segments (segments_expand.c): an address range reserved once;
 * its blocks span the first `seg->size` bytes, backed by device memory
 * granule by granule (seg->unmapped bytes of it are not, now). */
/* Return an expandable segment whose only block is FREE (out of any index). */
ta_internal void ta_segments_release_expandable(ta_segments *s, ta_segment *seg);
/* A new one of `size` bytes, mapped, one FREE block (out of any index), or
 * NULL (TA_ENOMEM in *status: the device or fraction said no; TA_ENOSPACE:
 * the device reserves no addresses, use an ordinary segment). */
ta_internal ta_segment *ta_segments_alloc_expandable(ta_segments *s, size_t size, cudaStream_t stream, int pool,
                                                    void *owner, ta_policy *policy, int *status);
/* Map `bytes` more at the end (seg->size grows by exactly that; the caller
 * extends or appends the last block). TA_OK, TA_ENOMEM, or TA_ENOSPACE when
 * the range is used up. */
ta_internal int ta_segments_grow(ta_segments *s, ta_segment *seg, size_t bytes);
/* Map every unmapped granule [addr, addr + len) touches (a block about to be
 * handed out). TA_OK or TA_ENOMEM (then nothing new stays mapped). */
ta_internal int ta_segments_map(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len);
/* Bytes of the granules [addr, addr + len) touches that are unmapped now. */
ta_internal size_t ta_segments_unmapped_in(const ta_segment *seg, uintptr_t addr, size_t len);
/* 1, with the lowest address in [lo, hi) from which `len` bytes lie on
 * granules mapped here (whole handles of this segment: not lent, not in
 * pieces) in *at; 0 when there is none. *at is lo or a granule's start. */
ta_internal int ta_segments_mapped_window(const ta_segment *seg, uintptr_t lo, uintptr_t hi, size_t len,
                                          uintptr_t *at);
/* 1 when nothing of the expandable segment `seg` is backed by device memory here. */
static inline int ta_segments_nothing_mapped(const ta_segment *seg) { return seg->unmapped == seg->size; }
/* Bytes of addresses the expandable segment `seg` may still grow by. */
ta_internal size_t ta_segments_addresses_left(const ta_segment *seg);
/* Unmap the mapped granules lying wholly inside [addr, addr + len), a free
 * block; returns the bytes given back. Call ta_segments_synchronize first. */
ta_internal size_t ta_segments_unmap(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len);
/* `offset` (a granule multiple into `seg`, at most its size) moved up past
 * the run of granules it would cut: a handle is given back only whole. */
ta_internal size_t ta_segments_handle_edge(const ta_segment *seg, size_t offset);
/* The segment ends at `new_size` now (a granule multiple > 0; the blocks past
 * it are gone): unmap what is mapped past it. Synchronize first. */
ta_internal void ta_segments_shrink(ta_segments *s, ta_segment *seg, size_t new_size);
/* The device's granule (0: no expandable segments). */
ta_internal size_t ta_segments_granule(const ta_segments *s);
/* The granule of an expandable segment of `pool` made now: one physical
 * handle, the unit it grows, gives back and moves memory in (the device's
 * granule in the small pool; the configuration's `handle` in the large one,
 * but the device's granule under a memory fraction unless `handle` was
 * set). A segment keeps its own: ta_segments_granule_of. */
ta_internal size_t ta_segments_handle_size(const ta_segments *s, int pool);
/* The granule of the expandable segment `seg`. */
ta_internal size_t ta_segments_granule_of(const ta_segment *seg);
/* 1 when mapping `bytes` more would take reserved memory past the most it
 * ever was and past a slack over the most ever allocated (segments_expand.c), and
 * unmapping free granules first is allowed (no capture may be underway: it
 * needs a synchronize). */
ta_internal int ta_segments_would_raise_peak(ta_segments *s, size_t bytes);
/* The out-of-memory path, after the cache went back (the caller
 * synchronized): large handles that hold free granules of the device's
 * size are replaced by handles of that size for their other granules (the
 * live bytes copied over), so the free ones go back, until `want` bytes
 * are back. Returns the bytes (0 when none could be, or the backend cannot
 * copy, or a capture may be underway). */
ta_internal size_t ta_segments_split_free(ta_segments *s, size_t want);
/* The granule expandable segments give back in on the out-of-memory path:
 * the device's where large handles can be replaced (the backend copies),
 * else the handle size of `pool` (ta_segments_handle_size). */
ta_internal size_t ta_segments_oom_granule(const ta_segments *s, int pool);
/* Give back mapped granules lying wholly inside free blocks of any
 * expandable segment (every policy's and stream's: device memory is one
 * budget), until `want` bytes are back, sparing `keep` (a block about to be
 * extended). Synchronizes first when there is any. Returns the bytes. */
ta_internal size_t ta_segments_unmap_free(ta_segments *s, size_t want, const ta_block *keep);

/* --- reclaim (TA_POLICY_RECLAIM; segments_marks.c, segments_expand.c) ---
 * The granules a freed block touches are stamped with its stream's marker
 * epoch (the free path's few lines: ta_segments_note_free); a marker (an
 * event) recorded on the stream later covers the stamp, and once that
 * completes, the device is past the last use of that memory. Granules, not
 * blocks: a free block merged with a neighbour freed just now keeps the
 * age of each part. Granules gathered to be mapped elsewhere are the
 * donors (their stamps travel with them): the next ta_segments_grow /
 * ta_segments_map / new segment maps them (no new memory) before making
 * any; ta_segments_donors_drop gives back any left. */

typedef struct ta_stream_marks {
  cudaStream_t stream;
  uint32_t epoch;        /* frees on the stream now are stamped with it */
  uint32_t done;         /* frees stamped <= done are past: the device finished what was queued before them */
  uint32_t event_epoch;  /* the epoch the marker in flight covers */
  void *event;           /* the marker in flight; NULL when none */
  uint64_t frees;        /* frees stamped so far */
  uint64_t frees_marked; /* `frees` when the last marker was recorded (or the device synchronized) */
  uint64_t order;        /* made after `order` others: markers are recorded in this order */
  size_t segments;       /* the reclaim segments it serves: it goes with the last */
  int active;            /* in the segment layer's active list */
} ta_stream_marks;

/* Frees on a stream between two markers. */
#define TA_MARK_EVERY 256

ta_internal void ta_segments_marks_progress(ta_segments *s, ta_stream_marks *m);
/* `m` joins the active list (its stream was freed on): the next reclaim pass records a marker there. */
ta_internal void ta_segments_marks_activate(ta_segments *s, ta_stream_marks *m);
/* The free path of a reclaim segment's block: the stamps, and every
 * TA_MARK_EVERY frees a marker on its stream. */
static inline void ta_segments_note_free(ta_segments *s, const ta_block *b) {
  ta_segment *seg = b->segment;
  ta_stream_marks *m = seg->marks;
  if (!m) return;
  uint32_t epoch = m->epoch;
  size_t g = (b->addr - seg->addr) >> seg->granule_shift, end = (b->addr + b->size - 1 - seg->addr) >> seg->granule_shift;
  do seg->stamps[g] = epoch;
  while (g++ < end);
  if (ta_unlikely(!m->active)) ta_segments_marks_activate(s, m);
  if (ta_unlikely((++m->frees & (TA_MARK_EVERY - 1)) == 0)) ta_segments_marks_progress(s, m);
}
/* 1 when the device is past the last use of the memory of every granule
 * lying wholly in [addr, addr + len) of `seg` (a reclaim segment). */
ta_internal int ta_segments_range_past(const ta_segment *seg, uintptr_t addr, size_t len);
/* Ask every marker in flight whether it completed (never waits; never while
 * a capture may be underway). */
ta_internal void ta_segments_marks_poll(ta_segments *s);
/* A marker on every stream freed on since its last, none in flight. */
ta_internal void ta_segments_marks_record(ta_segments *s);
/* Donors, device-wide: mapped granules wholly inside free blocks the device
 * is past (any reclaim segment whose granule is `granule`, sparing `keep`),
 * the longest freed first, unmapped without release, until `want` bytes
 * (rounded up to granules) are gathered: no more, since what is not mapped
 * next goes back to the device and would be made again later (a handle
 * made and mapped costs as much as one moved). Returns the bytes. */
ta_internal size_t ta_segments_take_past(ta_segments *s, size_t want, size_t granule, const ta_block *keep);
/* Donors from [addr, addr + len) of `seg` (whole granules, mapped, inside a
 * block the caller carved out as TA_BLOCK_RETIRING): mapped elsewhere next,
 * they stay mapped here until ta_segments_retire. */
ta_internal void ta_segments_lend(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len);
/* The device is past the retiring block at [addr, addr + len): unmap its
 * addresses (their memory lives on where it was mapped since). */
ta_internal void ta_segments_retire(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len);
/* Give back to the device any donors not mapped (after a failure). */
ta_internal void ta_segments_donors_drop(ta_segments *s);
/* A reclaim segment that taking its memory left with one free block and
 * nothing mapped (a stream done with it, say), for its owner to release
 * (ta_segments_release_expandable) when its own bookkeeping is not in use:
 * each one once, then NULL (segments_donors.c). Check it is still so. */
ta_internal ta_segment *ta_segments_next_drained(ta_segments *s);

/* --- when reclaim moves memory (segments_moves.c; TORCHALLOC_CONF grow_below and move_time) ---
 * Below grow_below reserved (and twice the most allocated; never by
 * default) it does not: the reserve grows instead. Elsewhere, under move_time:
 * A move costs the host an unmap, a map and a set-access call per handle
 * (~55 us on the H100). While the device has queued work that costs
 * nothing: the host waits for the GPU anyway. While the device waits for
 * the host (the marker just recorded on the requester's stream is already
 * done) it is step time, so under move_time moves then take at most that
 * share of the time, out of a small burst; past it, reclaim declines to
 * move and the reserve grows instead, past the most ever reserved, once:
 * the next step's same requests then fit where they are, and the layout
 * settles. Call after the markers were polled. 1: move (always when
 * `must`: the device refused new memory; the moves are still charged). */
ta_internal int ta_segments_move_allowed(ta_segments *s, cudaStream_t stream, int must);
/* The budget's clock now, where a request's moves may begin (0 without a
 * budget: nothing is charged then). */
ta_internal uint64_t ta_segments_move_since(ta_segments *s);
/* Host time from `since` (ta_segments_move_since) spent moving memory:
 * charged to the budget when moves are charged now (ta_segments_move_allowed). */
ta_internal void ta_segments_move_charge(ta_segments *s, uint64_t since);
/* The first stretch of whole handles of `seg` inside [lo, hi) that are
 * mapped (and not lent), cut after the handle that covers `want` bytes
 * (a run of granules is one handle: never cut): 1 with it in [*run_lo,
 * *run_hi), or 0. */
ta_internal int ta_segments_mapped_run(const ta_segment *seg, uintptr_t lo, uintptr_t hi, size_t want,
                                       uintptr_t *run_lo, uintptr_t *run_hi);
/* 1 when memory may be unmapped or mapped again elsewhere now: no capture
 * may be underway. */
ta_internal int ta_segments_may_remap(const ta_segments *s);

/* A free block that is part of a split segment counts as inactive_split:
 * call with +1 when it enters a free index, -1 when it leaves. */
ta_internal void ta_segments_note_inactive_split(ta_segments *s, const ta_block *b, int sign);

#endif
