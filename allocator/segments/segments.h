/* The segment layer: device memory as segments, and the block descriptors
 * that tile them. Below the policies (they call the services declared in
 * services.h), above the backend and the log.
 *
 * It owns: the segment registry (sorted by address, for lookups of bad
 * pointers and for walks in address order), the slab of block descriptors
 * (the hot path never calls malloc(3) once warm), the memory-fraction
 * ceiling, the segment and reserved-bytes stats and the reserved growth of
 * each phase, and the SEGMENT_ALLOC / SEGMENT_FREE log records. */
#ifndef TA_SEGMENTS_H
#define TA_SEGMENTS_H

#include "device/backend.h"
#include "policy/policy.h"
#include "segments/services.h"

/* Block descriptors carved from chunks and recycled through a free list. */
typedef struct ta_block_slab {
  ta_block *free_list;
  void **chunks;
  size_t nchunks, cap_chunks;
} ta_block_slab;

typedef struct ta_segment_registry {
  ta_segment **items; /* sorted by address */
  size_t count, cap;
} ta_segment_registry;

/* What an expandable segment adds to a segment (segments_expand.c): its
 * address range and the handle of each granule, 0 while unmapped. A
 * granule lent (reclaim) is still mapped here, but its memory is counted
 * where it was mapped since: here it counts as unmapped. A segment's
 * granule is one physical handle: the device's granule in the small pool,
 * `large_handle` in the large one (ta_segments_handle_size). */
typedef struct ta_expansion {
  size_t reserved;   /* bytes of addresses reserved from `addr` */
  size_t device;     /* the device's bytes when it was made: no growth is larger (ta_segments_grow) */
  size_t granule;
  uint64_t *handles; /* one per granule of the segment's size; 0: not mapped; TA_HANDLE_SPLIT: see `split` */
  uint8_t *lent;     /* one per granule: 1 while lent (mapped here, retiring) */
  /* Near capacity a granule larger than the device's is mapped in pieces of
   * the device's granule (segments_split.c): split[g] holds the handle of
   * each piece (0: not mapped) while handles[g] is TA_HANDLE_SPLIT; NULL
   * for a granule mapped whole or not at all. Never lent or donated. */
  uint64_t **split;
  size_t split_pieces; /* pieces of a split granule: granule / the device's granule */
  /* Runs (segments_runs.c): memory made while the reserve grows past the
   * most it ever was (the warm-up) is mapped in handles of several granules,
   * as the driver's calls cost per handle, not per byte. run[g] is
   * TA_RUN_AT(place, length) for each granule of such a handle, 0 for a
   * granule that is a handle of its own (or unmapped, or split); every
   * granule of a run holds the run's handle. The driver maps and unmaps a
   * handle only whole, so a run is mapped, lent, moved and given back whole. */
  uint32_t *run;
  size_t cap_handles;
} ta_expansion;

#define TA_HANDLE_SPLIT UINT64_MAX
#define TA_RUN_AT(place, length) ((uint32_t)(place) << 16 | (uint32_t)(length))
#define TA_RUN_MAX_GRANULES 0xffffu

/* Granules in the handle granule `g` belongs to (1: its own), and the first of them. */
static inline size_t ta_run_length(const ta_expansion *x, size_t g) { return x->run[g] ? x->run[g] & 0xffffu : 1; }
static inline size_t ta_run_start(const ta_expansion *x, size_t g) { return g - (x->run[g] >> 16); }

typedef struct ta_past_granule ta_past_granule; /* segments_expand.c */

/* Physical handles gathered to be mapped elsewhere (reclaim), all of one
 * segment granule (`granule`, set by the first one); a run's handle spans
 * several granules (`lengths`) and goes only where as many are unmapped
 * side by side. */
typedef struct ta_donors {
  size_t granule;
  uint64_t *handles;
  uint32_t *stamps;   /* each one's stamp, for where it goes (0: past) */
  uint16_t *lengths;  /* each one's granules */
  size_t n, cap;
} ta_donors;

typedef struct ta_ipc_opening ta_ipc_opening; /* segments_ipc.c */

struct ta_segments {
  ta_backend *backend;
  int device;
  /* Devices besides this one that may read and write its mapped memory
   * (bit d: device d): given to every mapping made, and to those made
   * before when a device is added (ta_segments_grant). Peers of ordinary
   * segments are the context's business (cudaDeviceEnablePeerAccess). */
  uint64_t peers;
  int logged;          /* tell the process log and observer (not replay's private heaps) */
  ta_free_census *census; /* handed to the policies' arenas (ta_segments_census); NULL: none */
  int phase;           /* phase of the request in flight: growth and release are charged to it */
  size_t limit;        /* reserved-bytes ceiling from set_memory_fraction; 0: none */
  size_t granule;      /* the backend's virtual-memory granule; 0: no expandable segments */
  size_t large_handle; /* bytes per physical handle of large-pool expandable segments (a granule multiple) */
  size_t run_bytes;    /* the most bytes one handle of a warm-up run may take (segments_runs.c); 0: no runs */
  int handle_fixed;    /* large_handle was set (`handle`): it holds under a memory fraction too */
  int64_t allocated_high; /* the most allocated bytes seen (unlike the stats' peak, never reset) */
  int64_t high_water;  /* the most reserved bytes so far (never reset, unlike the stats' peak) */
  /* Allocated bytes fell below half their most (the stats' peak): the
   * first ramp, a program's first step, is over and runs end
   * (segments_runs.c). Set by the heap's free (ta_segments_note_allocated),
   * and from the start when there are no runs. */
  int ramp_over;
  /* The device's free memory when last asked, with reserved bytes then and
   * the questions skipped since (ta_segments_near_capacity). */
  size_t free_seen, total_seen;
  int64_t reserved_at_seen;
  unsigned free_skipped;
  int no_sync;         /* a capture may be underway: nothing may synchronize (the heap's routing) */
  int no_new_segments; /* ta_segments_alloc refuses: only cached blocks may serve (a use_on_oom pool's turn) */
  torchalloc_stats *stats; /* the heap's: segment, reserved_bytes, inactive_split*, num_device_*, num_synchronizes */
  /* Reclaim's markers (segments_marks.c): a hash index of each stream's,
   * for the streams its segments serve (marks_mask + 1 slots, a power of
   * two; NULL: empty); the active ones, freed on since their last marker or
   * with one in flight, in a list of their own. */
  ta_stream_marks **marks;
  size_t marks_mask, nmarks;
  uint64_t marks_made; /* markers made so far: the next one's `order` */
  ta_stream_marks **active;
  size_t nactive, cap_active;
  int active_unsorted; /* `active` is not in `order` */
  /* Expandable segments with memory mapped: the only ones reclaim and
   * compact take memory from (segments_donors.c); and those they left with
   * nothing mapped and nothing in use, for their owner to release. */
  ta_segment **donating;
  size_t ndonating, cap_donating;
  ta_segment **drained;
  size_t ndrained, cap_drained;
  ta_donors donors;
  /* The move budget (segments_moves.c): host nanoseconds reclaim may still
   * spend moving memory while the device waits for the host, the clock
   * when it was last topped up, and whether moves now are charged to it. */
  unsigned move_permille; /* the share of the time it may take (TORCHALLOC_CONF move_time); 0: no limit */
  size_t grow_below; /* below this reserve (and twice the most allocated) growth replaces moves; 0: never */
  int64_t move_budget_ns;
  uint64_t move_clock_ns;
  int moves_charged;
  ta_past_granule *past; /* take_past's scratch: the donor candidates */
  size_t cap_past;
  ta_segment_registry registry;
  ta_block_slab slab;
  ta_ipc_opening *ipc_opened; /* memory of other processes mapped here (segments_ipc.c) */
  size_t nipc_opened, cap_ipc_opened;
  int64_t phase_growth[TORCHALLOC_MAX_PHASES];   /* device bytes allocated for each phase's requests */
  int64_t phase_released[TORCHALLOC_MAX_PHASES]; /* device bytes released while each phase was current */
};

/* A private pool's own allocator (torchalloc_pool_source), shared by the
 * pool and every segment it made: the last of them to go releases it. */
typedef struct ta_segment_source {
  torchalloc_pool_source pub;
  int refs;
} ta_segment_source;

/* A source holding one reference (the caller's), or NULL (host memory). */
ta_internal ta_segment_source *ta_segment_source_new(const torchalloc_pool_source *pub);
/* Drop a reference; the last calls pub.release and frees it. NULL: nothing. */
ta_internal void ta_segment_source_drop(ta_segment_source *src);

/* `large_handle`: bytes per physical handle of large-pool expandable
 * segments (config.h, `handle`), rounded up to the device's granule. */
ta_internal void ta_segments_init(ta_segments *s, ta_backend *backend, int device, torchalloc_stats *stats,
                                  size_t large_handle, int handle_fixed, size_t run_bytes);
/* The reserved-bytes ceiling a memory fraction sets (0: none); an open log
 * is told at once (its DEVICE record). */
ta_internal void ta_segments_set_limit(ta_segments *s, size_t limit);
/* The move budget (segments_moves.c): `permille` of the time (0: no limit), its clock started; below
 * `grow_below` bytes reserved (0: never) the reserve grows instead of moving memory. */
ta_internal void ta_segments_moves_init(ta_segments *s, unsigned permille, size_t grow_below);
/* Return every segment to the device, live blocks included, and free the
 * descriptors (teardown: the caller holds none of these pointers). */
ta_internal void ta_segments_destroy(ta_segments *s);
/* (Expandable segments must be gone: ta_segments_expandable_teardown.) */
/* The segment containing `addr`, or NULL. */
ta_internal ta_segment *ta_segments_find(const ta_segments *s, uintptr_t addr);

/* Wait for the device (cached memory is about to go back, or every queued
 * use must be over): counted in num_synchronizes; every marker is done. */
ta_internal void ta_segments_synchronize(ta_segments *s);
/* The markers of `stream`, made on first use; NULL when host memory runs out. */
ta_internal ta_stream_marks *ta_segments_marks_for(ta_segments *s, cudaStream_t stream);
/* The markers of `stream` if it has any yet, else NULL (nothing is made). */
ta_internal ta_stream_marks *ta_segments_marks_find(const ta_segments *s, cudaStream_t stream);

/* Give the devices of `peers` read and write access to every mapping of
 * this device, those made from now on and those made before (granules
 * lent or retiring, and memory opened from other processes, included).
 * TA_OK, or TA_EDEVICE when the driver refused (what was granted stays). */
ta_internal int ta_segments_grant(ta_segments *s, uint64_t peers);

/* --- CUDA IPC (segments_ipc.c), in PyTorch's own wire format so that
 * either end may be PyTorch's allocator --- */

/* The bytes that let another process open the memory of the live block
 * holding `ptr` (`block`, in `seg`): into buf (at most cap bytes; *len is
 * the length needed, even when it did not fit), and the offset of `ptr`
 * from the start of what the receiver will map. TA_OK, or TA_EDEVICE with
 * the reason in `why`. */
ta_internal int ta_segments_ipc_share(ta_segments *s, ta_segment *seg, const ta_block *block, uintptr_t ptr,
                                      unsigned char *buf, size_t cap, size_t *len, size_t *offset, char *why,
                                      size_t whylen);
/* Map memory another process shared (`handle`, `len` bytes: from
 * ta_segments_ipc_share or PyTorch's allocator) on this device: *out is
 * where it starts. Opening the same bytes again returns the same address
 * and counts one more user. TA_OK, or TA_EDEVICE with the reason. */
ta_internal int ta_segments_ipc_open(ta_segments *s, const unsigned char *handle, size_t len, uintptr_t *out,
                                     char *why, size_t whylen);
/* One user of the opened memory at `addr` is done: 1 when it was opened
 * here (unmapped once its last user is done and the device is past it), 0
 * when this device opened nothing there. */
ta_internal int ta_segments_ipc_close(ta_segments *s, uintptr_t addr);
/* Opened memory still mapped here (users or not); for tests and stats. */
ta_internal size_t ta_segments_ipc_open_count(const ta_segments *s);
/* Teardown: unmap everything opened, users or not. */
ta_internal void ta_segments_ipc_teardown(ta_segments *s);
/* Give `peers` access to the opened memory too (ta_segments_grant). */
ta_internal int ta_segments_ipc_grant(ta_segments *s, uint64_t peers);

/* --- between the segment layer's files --- */

ta_internal int ta_segments_register(ta_segments *s, ta_segment *seg);
/* Unmap granules [first, first + n) of the expandable segment `seg`, whole
 * handles (runs of granules whole): `account` in the stats and log,
 * `release` 1 gives their memory back, 0 keeps the handles (lent ones, or
 * donors) (segments_expand.c). */
ta_internal void ta_segments_unmap_granules(ta_segments *s, ta_segment *seg, size_t first, size_t n, int account,
                                            int release);
ta_internal void ta_segments_unregister(ta_segments *s, ta_segment *seg);
/* Stats, phase accounting, log record and observer of `bytes` at `addr`
 * of `seg` becoming (sign +1) or ceasing to be (-1) device memory. */
ta_internal void ta_segments_account(ta_segments *s, const ta_segment *seg, uintptr_t addr, size_t bytes, int sign);
/* Teardown, before ta_segments_destroy: every expandable segment unmapped,
 * its addresses given back, its descriptor freed (segments_expand.c). */
ta_internal void ta_segments_expandable_teardown(ta_segments *s);
/* Granules mapped in pieces (segments_split.c): granule `g` of `seg` is
 * TA_HANDLE_SPLIT; [lo, hi) an address range. Bytes of its pieces that
 * [lo, hi) touches and that are not mapped: */
ta_internal size_t ta_split_unmapped(const ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi);
/* Map the pieces of granule `g` (split, or unmapped: it becomes split) that
 * [lo, hi) touches; stats and log included. TA_OK or TA_ENOMEM (what was
 * mapped stays, counted). */
ta_internal int ta_split_map(ta_segments *s, ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi);
/* Unmap and give back the mapped pieces lying wholly in [lo, hi); a
 * granule left with none is unmapped (handles[g] 0). Returns the bytes. */
ta_internal size_t ta_split_unmap(ta_segments *s, ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi);
/* 1 when a mapped piece lies wholly in [lo, hi). */
ta_internal int ta_split_holds_mapped(const ta_segment *seg, size_t g, uintptr_t lo, uintptr_t hi);
/* Every piece unmapped and given back (`account`: in the stats and log). */
ta_internal void ta_split_release(ta_segments *s, ta_segment *seg, size_t g, int account);
/* The first stretch of mapped memory of `seg` inside [lo, hi): whole
 * granules mapped and not lent, and mapped pieces of split ones. 1 with it
 * in [*run_lo, *run_hi), or 0 (the snapshot's segments). */
ta_internal int ta_segments_mapped_stretch(const ta_segment *seg, uintptr_t lo, uintptr_t hi, uintptr_t *run_lo,
                                           uintptr_t *run_hi);
/* Replace the handle `*old`, mapped over [base, base + k * unit) of `seg`,
 * by a handle per unit in use (free_unit[j] 0), their bytes copied over
 * through `scratch` (k units of addresses); the free units go back (out of
 * the stats, counted unmapped). fresh[] (k entries, zeroed) receives the
 * new handles, 0 for a free unit. The bytes given back, or -1 when nothing
 * changed (the device said no). The caller synchronized; it records the
 * new handles (segments_replace.c). */
ta_internal ptrdiff_t ta_segments_replace_handle(ta_segments *s, ta_segment *seg, uintptr_t base, uint64_t *old,
                                                 size_t k, size_t unit, const uint8_t *free_unit, uintptr_t scratch,
                                                 uint64_t *fresh);
/* Runs (segments_runs.c). Granules of `seg`'s pool to map as one handle
 * when `n` granules of new memory are mapped now: 1 (no run) unless the
 * reserve grows past the most it ever was during the first ramp (ramp_over
 * unset), outside a memory fraction and
 * while no capture may be underway (the caller asks whether the device is
 * near its capacity). */
ta_internal size_t ta_runs_length(const ta_segments *s, const ta_segment *seg, size_t n);
/* The heap's free, with the bytes still allocated: the first ramp ends
 * (no more runs) when they fall below half the most allocated. */
static inline void ta_segments_note_allocated(ta_segments *s, int64_t allocated) {
  if (ta_unlikely(!s->ramp_over) && allocated < s->stats->allocated_bytes[TORCHALLOC_POOL_ALL].peak / 2)
    s->ramp_over = 1;
}
/* Replace every run that has a granule in [first, end) by a handle per
 * granule: granules in use copied over, those lying wholly in free blocks
 * given back. The device is synchronized first. TA_OK (the bytes given
 * back added to *released), or TA_EDEVICE with the reason in `why` (a
 * capture may be underway, the backend cannot copy, or the device said no). */
ta_internal int ta_runs_break(ta_segments *s, ta_segment *seg, size_t first, size_t end, size_t *released,
                              char *why, size_t whylen);
/* The out-of-memory path (the caller synchronized): runs holding free
 * granules broken (ta_runs_break) until `want` bytes are back. The bytes. */
ta_internal size_t ta_runs_break_free(ta_segments *s, size_t want);

/* Give `peers` access to its mapped pieces. TA_OK or TA_EDEVICE. */
ta_internal int ta_split_grant(ta_segments *s, ta_segment *seg, size_t g, uint64_t peers);
/* 1 when what may still be mapped (the device's free memory, and the
 * memory fraction's room), less `bytes` about to be mapped, is under 1/32
 * of the device (or the fraction): granules are then mapped in pieces of
 * the device's granule. */
ta_internal int ta_segments_near_capacity(ta_segments *s, size_t bytes);

/* Teardown: release the markers in flight and free them (segments_marks.c). */
ta_internal void ta_segments_marks_destroy(ta_segments *s);
/* A reclaim segment that uses `m` goes: the last one frees it (NULL: nothing). */
ta_internal void ta_segments_marks_release(ta_segments *s, ta_stream_marks *m);
/* `seg` (a reclaim segment) is no donor any more, nor drained: it goes (segments_donors.c). */
ta_internal void ta_segments_donors_forget(ta_segments *s, ta_segment *seg);
/* Teardown: the lists of segments_donors.c freed. */
ta_internal void ta_segments_donors_destroy(ta_segments *s);
/* take_past or unmap_free took memory from `seg`: listed as drained when that left it one free block and
 * nothing mapped. */
ta_internal void ta_segments_note_if_drained(ta_segments *s, ta_segment *seg);
/* Memory was mapped into the expandable segment `seg`: it is looked at for memory to move or give back. */
ta_internal void ta_segments_may_donate(ta_segments *s, ta_segment *seg);
/* Nothing is mapped in `seg` any more: it is not looked at until something is. */
ta_internal void ta_segments_donates_nothing(ta_segments *s, ta_segment *seg);
/* The candidates in address order (their slots renumbered), those with
 * nothing mapped gone: walks that stop once they have enough take the same
 * memory every run. */
ta_internal void ta_segments_donors_sort(ta_segments *s);

#endif
