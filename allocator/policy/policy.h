/* The policy boundary: the one header a policy includes.
 *
 * The core owns it because the core calls it. A policy turns requests into
 * blocks and freed blocks back into cache; the heap around it does locking,
 * the pointer map, stats, phases and logging, so a new policy gets all of
 * those for free. A policy sees three things and nothing else:
 *   - the block and segment descriptors (block.h);
 *   - the segment layer, as an opaque `ta_segments` and the functions of
 *     the last section below (allocator/segments/): block descriptors,
 *     ordinary segments and expandable ones; device memory comes only from
 *     there;
 *   - its own entry in the registry (policies/policy_list.h), by which the
 *     core finds it by name or id.
 * Adding a policy: a file in policies/ filling a ta_policy_ops, its name in
 * TA_POLICY_LIST (policies/policy_list.h) and in _records.py's POLICY_NAMES
 * (docs/ARCHITECTURE.md). */
#ifndef TA_POLICY_H
#define TA_POLICY_H

#include "block/block.h"

typedef struct ta_segments ta_segments; /* the segment layer: opaque here */
typedef struct ta_policy ta_policy;

/* Policies a process can have; a block stores its policy's id in a byte. */
#define TA_MAX_POLICIES 8

typedef struct ta_policy_ops {
  const char *name;
  /* `flags`: TA_POLICY_* */
  ta_policy *(*create)(ta_segments *segments, uint8_t id, unsigned flags);
  /* Release every fully free segment and the policy's own memory; blocks
   * still live stay with the segment layer, which frees them at teardown. */
  void (*destroy)(ta_policy *p);
  /* A block of at least `size` bytes on `stream` for `phase`, its state set
   * to TA_BLOCK_LIVE; NULL when the device is out of memory. */
  ta_block *(*malloc)(ta_policy *p, size_t size, cudaStream_t stream, int phase);
  /* Take back a block this policy made (state TA_BLOCK_LIVE or PENDING). */
  void (*free)(ta_policy *p, ta_block *b);
  /* Release every fully free cached segment; returns the bytes released. */
  size_t (*release_cached)(ta_policy *p);
  /* Optional (NULL when the policy keeps no per-phase arenas): bytes held by
   * the arena of `phase` (-1: all), and releasing its free segments. */
  size_t (*arena_reserved)(ta_policy *p, int phase);
  size_t (*arena_release)(ta_policy *p, int phase);
  /* Optional (NULL when the policy cannot): make exactly [addr, addr+size)
   * of `seg`, a segment of this policy, a live block; NULL when that range
   * is not free. Restoring a private pool's checkpoint needs it. */
  ta_block *(*claim)(ta_policy *p, ta_segment *seg, uintptr_t addr, size_t size);
  /* 1 when `free` may give memory back to the device (exact): the heap then
   * holds such frees while a capture may be underway, when a device free
   * would invalidate it. */
  int frees_to_device;
} ta_policy_ops;

/* Grow expandable segments instead of allocating new ones (the heap sets it
 * only where the backend has virtual memory, and never for private pools:
 * a captured graph's addresses must stay as they were). */
#define TA_POLICY_EXPANDABLE 1u
/* With it: before reserving past the most ever reserved, give back free
 * granules elsewhere (least memory; each time costs a device synchronize). */
#define TA_POLICY_COMPACT 2u
/* With TA_POLICY_EXPANDABLE, as compact but never synchronizing: free
 * granules move to where memory is needed once per-stream progress markers
 * say the device is past their last use, and before that, on their own
 * stream, are mapped at the new place too (the old addresses retire when
 * their marker completes). */
#define TA_POLICY_RECLAIM 4u

/* Never split a block: each is a whole segment of its own (a private
 * pool's MemPool(no_split=True); the heap may set it after create). */
#define TA_POLICY_NO_SPLIT 8u

struct ta_policy {
  const ta_policy_ops *ops;
  ta_segments *segments;
  uint8_t id;
  unsigned flags; /* TA_POLICY_* */
  /* A private pool's own allocator (torch.cuda.MemPool(allocator=...)):
   * ta_segments_alloc takes this policy's segments from it. NULL: the device. */
  struct ta_segment_source *source;
};

/* ---------------------------------------------------------------------------
 * The list (policies/policy_list.h): the only place that names policies.
 * Ids are indices into it, stored in every block and in the log.
 * ------------------------------------------------------------------------- */

ta_internal int ta_policy_count(void);
/* NULL when unknown. *id (may be NULL) receives the id. */
ta_internal const ta_policy_ops *ta_policy_by_name(const char *name, uint8_t *id);
ta_internal const ta_policy_ops *ta_policy_by_id(uint8_t id);
/* "caching, exact or phase_arena": for messages that list the choices. */
ta_internal const char *ta_policy_choices(void);
/* "caching exact phase_arena": the names in id order. */
ta_internal const char *ta_policy_names(void);
/* The policy that serves private pools (CUDA graphs, MemPool): one that
 * caches, since a captured graph's memory must never go back to the device
 * while the graph lives, and frees during a capture must stay on the host. */
ta_internal uint8_t ta_policy_for_private_pools(void);

/* ---------------------------------------------------------------------------
 * The segment layer's services (allocator/segments/). Callers hold the heap lock.
 * ------------------------------------------------------------------------- */

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
/* Unmap the mapped granules lying wholly inside [addr, addr + len), a free
 * block; returns the bytes given back. Call ta_segments_synchronize first. */
ta_internal size_t ta_segments_unmap(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len);
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
} ta_stream_marks;

/* Frees on a stream between two markers. */
#define TA_MARK_EVERY 256

ta_internal void ta_segments_marks_progress(ta_segments *s, ta_stream_marks *m);
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
/* The first run of whole granules of `seg` inside [lo, hi) that are mapped
 * (and not lent): 1 with it in [*run_lo, *run_hi), or 0. */
ta_internal int ta_segments_mapped_run(const ta_segment *seg, uintptr_t lo, uintptr_t hi, uintptr_t *run_lo,
                                       uintptr_t *run_hi);
/* 1 when memory may be unmapped or mapped again elsewhere now: no capture
 * may be underway. */
ta_internal int ta_segments_may_remap(const ta_segments *s);

/* A free block that is part of a split segment counts as inactive_split:
 * call with +1 when it enters a free index, -1 when it leaves. */
ta_internal void ta_segments_note_inactive_split(ta_segments *s, const ta_block *b, int sign);

#endif
