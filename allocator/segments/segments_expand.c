/* Expandable segments (services.h, segments.h): one address range reserved
 * once, backed by device memory granule by granule.
 *
 * Why: an ordinary segment is one device allocation of a fixed size, so a
 * request that no free block fits needs a new segment even when the free
 * bytes are there, split across segments; and a segment with one live block
 * left cannot be given back. An expandable segment turns the free block at
 * its end into as much room as the device has, and any free granule, at its
 * end or between live blocks, can be unmapped (its memory given back) and
 * mapped again when a block needs it: what is reserved follows what lives.
 *
 * Each granule is its own physical allocation, so any one can be unmapped.
 * The log sees every run of granules mapped as a SEGMENT_ALLOC and every run
 * unmapped as a SEGMENT_FREE, flagged TA_LOG_SEGMENT_EXPANDABLE (PyTorch's
 * memory viewer calls them segment_map / segment_unmap).
 *
 * Reclaim (services.h): granules of free blocks move to where memory is
 * needed. Those the device is past are unmapped without release and
 * mapped at the new place (the donors); those it may still be using, of the
 * requester's stream, are mapped at the new place while their old
 * addresses stay mapped (lent: the stream's own order keeps the new use
 * after the old), and the old addresses are unmapped when their marker
 * completes (retire). Either way the memory counts where it is mapped now:
 * the log sees the old run unmapped and the new one mapped. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "segments/granules.h"
#include "accounting/stats.h"

#define TA_EXPANDABLE_MAX_RESERVE ((size_t)1 << 40)

size_t ta_segments_granule(const ta_segments *s) { return s->granule; }

size_t ta_segments_granule_of(const ta_segment *seg) { return seg->expansion->granule; }

size_t ta_segments_addresses_left(const ta_segment *seg) { return seg->expansion->reserved - seg->size; }

size_t ta_segments_handle_size(const ta_segments *s, int pool) {
  /* Both 0 without virtual memory. Under a memory fraction, the device's
   * granule unless `handle` was set (config.h, TA_DEFAULT_LARGE_HANDLE). */
  return pool == TA_POOL_LARGE && (!s->limit || s->handle_fixed) ? s->large_handle : s->granule;
}

size_t ta_segments_oom_granule(const ta_segments *s, int pool) {
  /* segments_split.c replaces large handles on that path where the backend copies */
  return s->granule && s->backend->ops->copy ? s->granule : ta_segments_handle_size(s, pool);
}

/* Why the slack: reclaiming exactly to the high-water mark moves memory
 * on every step whose layout differs a little from the last; a margin of
 * 1/128 of the most allocated (0.8 %) lets most of those steps map new
 * memory once instead (measured on the H100: GPT-2's moves fell from 4325
 * to 139 handles in replay, reserved 1.004x -> 1.007x allocated). */
#define TA_RESERVE_SLACK_SHIFT 7

int ta_segments_would_raise_peak(ta_segments *s, size_t bytes) {
  int64_t after = ta_stat_total(s->stats->reserved_bytes) + (int64_t)bytes;
  int64_t allocated = s->stats->allocated_bytes[TORCHALLOC_POOL_ALL].peak; /* reset by the user at times: */
  if (allocated > s->allocated_high) s->allocated_high = allocated;    /* the most seen is kept here */
  return !s->no_sync && after > s->high_water &&
         after > s->allocated_high + (s->allocated_high >> TA_RESERVE_SLACK_SHIFT);
}


/* Per-granule arrays for `granules` granules (each grown in turn: a
 * failure leaves the larger ones larger, which is harmless). */
static int reserve_handles(ta_segment *seg, size_t granules) {
  ta_expansion *x = seg->expansion;
  if (granules <= x->cap_handles) return 0;
  size_t old = x->cap_handles, cap = ta_grown_capacity(old, granules, 16);
  if (!cap || ta_resize(&x->handles, cap) || ta_resize(&x->lent, cap) || ta_resize(&x->split, cap) ||
      ta_resize(&x->run, cap) || ta_resize(&seg->stamps, cap))
    return -1;
  memset(x->handles + old, 0, (cap - old) * sizeof *x->handles);
  memset(x->lent + old, 0, (cap - old) * sizeof *x->lent);
  memset(x->split + old, 0, (cap - old) * sizeof *x->split);
  memset(x->run + old, 0, (cap - old) * sizeof *x->run);
  memset(seg->stamps + old, 0, (cap - old) * sizeof *seg->stamps);
  x->cap_handles = cap;
  return 0;
}

/* Granules [g, g + length) hold `handle` now (a run when length > 1), with `stamp`. */
static void place_handle(ta_segment *seg, size_t g, uint64_t handle, size_t length, uint32_t stamp) {
  ta_expansion *x = seg->expansion;
  for (size_t j = 0; j < length; j++) {
    x->handles[g + j] = handle;
    x->run[g + j] = length > 1 ? TA_RUN_AT(j, length) : 0;
    seg->stamps[g + j] = stamp;
  }
}

/* Unmap the handles of granules [first, first + n), whole handles side by
 * side: one backend call for each stretch of single granules and one for
 * each run (cuMemUnmap takes whole mappings). `release` 1 gives the memory
 * back; 0 keeps the handles (lent ones, or donors). Returns the handles. */
static size_t unmap_handles(ta_segments *s, ta_segment *seg, size_t first, size_t n, int release) {
  ta_expansion *x = seg->expansion;
  const ta_backend_ops *ops = s->backend->ops;
  size_t g = first, end = first + n, handles = 0;
  while (g < end) {
    size_t len = ta_run_length(x, g), stop = g + 1;
    ta_assert(ta_run_start(x, g) == g && g + len <= end); /* callers pass whole handles */
    if (len == 1)
      while (stop < end && ta_run_length(x, stop) == 1) stop++;
    else
      stop = g + len;
    size_t handle = len * x->granule;
    ops->unmap(s->backend, s->device, seg->addr + g * x->granule, (stop - g) * x->granule, handle, x->handles + g,
               release);
    handles += len == 1 ? stop - g : 1;
    g = stop;
  }
  return handles;
}

/* Donors that fit in `n` granules side by side, the newest first, moved to
 * the end of the list: their count, and their granules in *granules. */
static size_t choose_donors(ta_donors *d, size_t n, size_t *granules) {
  size_t chosen = 0, got = 0;
  for (size_t i = d->n; i-- > 0 && got < n;) {
    if (d->lengths[i] > n - got) continue; /* a run that does not fit stays for a later mapping, or goes back */
    size_t t = d->n - 1 - chosen++;
    uint64_t h = d->handles[i];
    uint32_t st = d->stamps[i];
    uint16_t len = d->lengths[i];
    d->handles[i] = d->handles[t], d->stamps[i] = d->stamps[t], d->lengths[i] = d->lengths[t];
    d->handles[t] = h, d->stamps[t] = st, d->lengths[t] = len;
    got += len;
  }
  *granules = got;
  return chosen;
}

/* Map the chosen donors (the last `count` of the list) from granule
 * `first` on: TA_OK, or TA_ENOMEM with nothing left mapped. */
static int map_donors(ta_segments *s, ta_segment *seg, size_t first, size_t count) {
  ta_expansion *x = seg->expansion;
  const ta_backend_ops *ops = s->backend->ops;
  const ta_donors *d = &s->donors;
  size_t g = first;
  for (size_t i = d->n - count, next; i < d->n; i = next) {
    /* single granules side by side in one call (as the backend's map makes them); a run in one of its own */
    size_t len = d->lengths[i], handle = len * x->granule;
    next = i + 1;
    if (len == 1)
      while (next < d->n && d->lengths[next] == 1) next++;
    size_t granules = len == 1 ? next - i : len;
    if (ops->remap(s->backend, s->device, seg->addr + g * x->granule, granules * x->granule, handle, &d->handles[i],
                   s->peers) != TA_OK) {
      if (g > first) unmap_handles(s, seg, first, g - first, 0);
      memset(x->handles + first, 0, (g - first) * sizeof *x->handles);
      memset(x->run + first, 0, (g - first) * sizeof *x->run);
      return TA_ENOMEM;
    }
    /* The memory's age comes with it: lent memory the device may still use
     * must not look past here. */
    for (size_t j = i; j < next; j++, g += len) place_handle(seg, g, d->handles[j], len, d->stamps[j]);
  }
  return TA_OK;
}

/* New memory for granules [first, first + n): handles of one granule, or
 * runs (ta_runs_length) of several. TA_OK, or TA_ENOMEM with nothing made.
 * Returns the handles made in *made. */
static int map_new(ta_segments *s, ta_segment *seg, size_t first, size_t n, size_t *made) {
  ta_expansion *x = seg->expansion;
  const ta_backend_ops *ops = s->backend->ops;
  size_t run = ta_runs_length(s, seg, n);
  if (run > 1 && ta_segments_near_capacity(s, n * x->granule)) run = 1; /* there every granule counts */
  uintptr_t addr = seg->addr + first * x->granule;
  if (run <= 1) { /* one call: the backend grants access once over the range */
    if (ops->map(s->backend, s->device, addr, n * x->granule, x->granule, x->handles + first, s->peers) != TA_OK)
      return TA_ENOMEM;
    memset(x->run + first, 0, n * sizeof *x->run);
    memset(seg->stamps + first, 0, n * sizeof *seg->stamps); /* new memory was never used */
    *made = n;
    return TA_OK;
  }
  /* Whole runs, then what is left as single granules in one call. */
  size_t done = 0, whole = n / run * run;
  *made = 0;
  while (done < n) {
    size_t len = done < whole ? run : 1, granules = done < whole ? run : n - whole;
    uint64_t *handles = x->handles + first + done;
    if (ops->map(s->backend, s->device, addr + done * x->granule, granules * x->granule, len * x->granule, handles,
                 s->peers) != TA_OK) {
      if (done) unmap_handles(s, seg, first, done, 1);
      memset(x->handles + first, 0, done * sizeof *x->handles);
      memset(x->run + first, 0, done * sizeof *x->run);
      return TA_ENOMEM;
    }
    if (len > 1)
      place_handle(seg, first + done, handles[0], len, 0);
    else
      for (size_t j = 0; j < granules; j++) place_handle(seg, first + done + j, handles[j], 1, 0);
    done += granules;
    *made += len > 1 ? 1 : granules;
  }
  return TA_OK;
}

/* Map granules [first, first + n), all unmapped: donors first (no new
 * memory), then new memory; stats and log included. All or nothing. */
static int map_run(ta_segments *s, ta_segment *seg, size_t first, size_t n) {
  ta_expansion *x = seg->expansion;
  size_t bytes = n * x->granule, k = 0, count = 0, made = 0;
  if (s->limit && (size_t)ta_stat_total(s->stats->reserved_bytes) + bytes > s->limit) return TA_ENOMEM;
  if (s->donors.granule == x->granule && s->donors.n) count = choose_donors(&s->donors, n, &k);
  if (count && map_donors(s, seg, first, count) != TA_OK) return TA_ENOMEM;
  if (n > k && map_new(s, seg, first + k, n - k, &made) != TA_OK) {
    if (k) unmap_handles(s, seg, first, k, 0); /* the donors stay donors */
    memset(x->handles + first, 0, k * sizeof *x->handles);
    memset(x->run + first, 0, k * sizeof *x->run);
    return TA_ENOMEM;
  }
  s->donors.n -= count;
  s->stats->num_handles_moved += (int64_t)count;
  s->stats->num_handles_created += (int64_t)made;
  ta_segments_account(s, seg, seg->addr + first * x->granule, bytes, +1);
  ta_segments_may_donate(s, seg);
  return TA_OK;
}

void ta_segments_unmap_granules(ta_segments *s, ta_segment *seg, size_t first, size_t n, int account, int release) {
  ta_expansion *x = seg->expansion;
  size_t bytes = n * x->granule;
  uintptr_t addr = seg->addr + first * x->granule;
  if (account) ta_segments_account(s, seg, addr, bytes, -1);
  size_t handles = unmap_handles(s, seg, first, n, release);
  if (release) s->stats->num_handles_released += (int64_t)handles;
  memset(x->handles + first, 0, n * sizeof *x->handles);
  memset(x->lent + first, 0, n);
  memset(x->run + first, 0, n * sizeof *x->run);
}

ta_segment *ta_segments_alloc_expandable(ta_segments *s, size_t size, cudaStream_t stream, int pool, void *owner,
                                         ta_policy *policy, int *status) {
  *status = TA_ENOSPACE;
  size_t granule = ta_segments_handle_size(s, pool);
  if (!granule) return NULL;
  size_t free_b = 0, total = 0;
  if (s->backend->ops->mem_info(s->backend, s->device, &free_b, &total) != TA_OK || total == 0) return NULL;
  /* As many addresses as the device has bytes (the segment can then grow to
   * anything the device could give it), four times that in the large pool,
   * whose requests reclaim places on mapped memory before the holes while
   * half of them are unused (arena.c on_mapped_memory); but at most 1 TiB:
   * a simulated device of replay's unlimited capacity must still hold many. */
  size_t want = pool == TA_POOL_LARGE && total < TA_EXPANDABLE_MAX_RESERVE / 4 ? total * 4 : total;
  size_t reserved = ta_align_up(want < TA_EXPANDABLE_MAX_RESERVE ? want : TA_EXPANDABLE_MAX_RESERVE, granule);
  size = ta_align_up(size, granule);
  if (size > reserved || size > total) return NULL;
  *status = TA_ENOMEM;
  ta_segment *seg = calloc(1, sizeof *seg);
  ta_expansion *x = calloc(1, sizeof *x);
  ta_block *b = ta_segments_block_new(s);
  uintptr_t addr = 0;
  if (seg) seg->expansion = x;
  if (!seg || !x || !b || reserve_handles(seg, size / granule)) goto fail;
  if (s->backend->ops->reserve(s->backend, s->device, reserved, &addr) != TA_OK) {
    *status = TA_ENOSPACE;
    goto fail;
  }
  x->reserved = reserved;
  x->device = total;
  x->granule = granule;
  x->split_pieces = granule / s->granule;
  unsigned shift = 0;
  while (((size_t)1 << shift) < granule) shift++;
  *seg = (ta_segment){.addr = addr, .size = size, .stream = stream, .first = b, .last = b, .expansion = x,
                      .owner = owner, .policy_instance = policy, .pool = (uint8_t)pool, .policy = policy->id,
                      .stamps = seg->stamps, .granule_shift = shift};
  /* Without its markers (host memory) the segment's free blocks are never
   * past: they wait for a synchronize, as compact's do. */
  if (policy->flags & TA_POLICY_RECLAIM && (seg->marks = ta_segments_marks_for(s, stream)) != NULL)
    seg->marks->segments++;
  if (ta_segments_register(s, seg)) {
    s->backend->ops->unreserve(s->backend, s->device, addr, reserved);
    goto fail;
  }
  if (map_run(s, seg, 0, size / granule) != TA_OK) {
    ta_segments_unregister(s, seg);
    s->backend->ops->unreserve(s->backend, s->device, addr, reserved);
    goto fail;
  }
  *b = (ta_block){.addr = addr, .size = size, .segment = seg, .stream = stream, .owner = owner, .policy = policy->id,
                  .state = TA_BLOCK_FREE};
  ta_stats_add(s->stats->segment, pool, 1);
  return seg;
fail:
  if (x) free(x->handles), free(x->lent), free(x->split), free(x->run);
  if (seg) ta_segments_marks_release(s, seg->marks), free(seg->stamps);
  free(seg);
  free(x);
  if (b) ta_segments_block_delete(s, b);
  return NULL;
}

int ta_segments_grow(ta_segments *s, ta_segment *seg, size_t bytes) {
  ta_expansion *x = seg->expansion;
  ta_assert(x && bytes % x->granule == 0);
  /* More than the device holds goes where it did while a segment had as
   * many addresses as the device bytes: an ordinary segment, which fails. */
  if (bytes > x->reserved - seg->size || bytes > x->device) return TA_ENOSPACE;
  size_t first = seg->size / x->granule, n = bytes / x->granule;
  if (reserve_handles(seg, first + n)) return TA_ENOMEM;
  if (x->granule > s->granule && ta_segments_near_capacity(s, bytes)) {
    /* Addresses only: the block handed out from them maps just the pieces
     * it touches (ta_segments_map), the rest stays free and unmapped. */
    seg->size += bytes;
    seg->unmapped += bytes;
    return TA_OK;
  }
  int rc = map_run(s, seg, first, n);
  if (rc == TA_OK) seg->size += bytes;
  return rc;
}

size_t ta_segments_unmapped_in(const ta_segment *seg, uintptr_t addr, size_t len) {
  size_t first, end, run, stop, n = 0, pieces = 0;
  ta_granules_of(seg, addr, len, 0, &first, &end);
  for (size_t g = first; ta_granules_next(seg->expansion, g, end, TA_GRANULE_UNMAPPED, &run, &stop); g = stop)
    n += stop - run;
  for (size_t g = first; (g = ta_granules_next_split(seg->expansion, g, end)) < end; g++)
    pieces += ta_split_unmapped(seg, g, addr, addr + len);
  return n * seg->expansion->granule + pieces;
}

int ta_segments_mapped_window(const ta_segment *seg, uintptr_t lo, uintptr_t hi, size_t len, uintptr_t *at) {
  const ta_expansion *x = seg->expansion;
  size_t first, end, run, stop;
  ta_granules_of(seg, lo, hi - lo, 0, &first, &end);
  for (size_t g = first; ta_granules_next(x, g, end, TA_GRANULE_OWNED | TA_GRANULE_RUN, &run, &stop); g = stop) {
    uintptr_t from = seg->addr + run * x->granule, to = seg->addr + stop * x->granule;
    if (from < lo) from = lo;
    if (to > hi) to = hi;
    if (to - from >= len) {
      *at = from;
      return 1;
    }
  }
  return 0;
}

int ta_segments_map(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  ta_expansion *x = seg->expansion;
  size_t first, end, run, stop;
  ta_granules_of(seg, addr, len, 0, &first, &end);
  /* Near capacity a large granule is mapped only in the pieces the block touches. */
  int in_pieces = x->granule > s->granule && ta_granules_next(x, first, end, TA_GRANULE_UNMAPPED, &run, &stop) &&
                  ta_segments_near_capacity(s, ta_segments_unmapped_in(seg, addr, len));
  for (size_t g = first; ta_granules_next(x, g, end, TA_GRANULE_UNMAPPED, &run, &stop); g = stop) {
    /* On failure the runs mapped so far stay mapped, counted as reserved,
     * inside what is still a free block: a consistent state. */
    if (in_pieces) {
      for (size_t k = run; k < stop; k++)
        if (ta_split_map(s, seg, k, addr, addr + len) != TA_OK) return TA_ENOMEM;
      continue;
    }
    if (map_run(s, seg, run, stop - run) != TA_OK) return TA_ENOMEM;
    seg->unmapped -= (stop - run) * x->granule;
  }
  for (size_t g = first; (g = ta_granules_next_split(x, g, end)) < end; g++)
    if (ta_split_map(s, seg, g, addr, addr + len) != TA_OK) return TA_ENOMEM;
  return TA_OK;
}

size_t ta_segments_unmap(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  size_t first, end, run, stop, released = 0, pieces = 0;
  ta_granules_of(seg, addr, len, 1, &first, &end);
  for (size_t g = first; ta_granules_next_whole(seg->expansion, g, end, &run, &stop); g = stop) {
    ta_segments_unmap_granules(s, seg, run, stop - run, 1, 1);
    released += (stop - run) * seg->expansion->granule;
  }
  seg->unmapped += released;
  /* Pieces of split granules: the free range may hold some of a granule it does not hold whole. */
  ta_granules_of(seg, addr, len, 0, &first, &end);
  for (size_t g = first; (g = ta_granules_next_split(seg->expansion, g, end)) < end; g++)
    pieces += ta_split_unmap(s, seg, g, addr, addr + len);
  return released + pieces;
}

size_t ta_segments_handle_edge(const ta_segment *seg, size_t offset) {
  const ta_expansion *x = seg->expansion;
  size_t g = offset / x->granule;
  if (offset >= seg->size || !x->run[g] || ta_granule_state(x, g) == TA_GRANULE_UNMAPPED || ta_run_start(x, g) == g)
    return offset;
  return (ta_run_start(x, g) + ta_run_length(x, g)) * x->granule;
}

void ta_segments_shrink(ta_segments *s, ta_segment *seg, size_t new_size) {
  ta_assert(seg->expansion && new_size > 0 && new_size < seg->size && new_size % seg->expansion->granule == 0);
  size_t tail = seg->size - new_size;
  ta_segments_unmap(s, seg, seg->addr + new_size, tail);
  seg->unmapped -= tail; /* past the end now: neither mapped nor part of the segment */
  seg->size = new_size;
}

/* Unmap everything and give the addresses back; `account`: in the stats
 * and the log (not at teardown). Granules still lent are unmapped without
 * release: their memory is counted, and given back, where it serves now. */
static void expansion_release(ta_segments *s, ta_segment *seg, int account) {
  ta_expansion *x = seg->expansion;
  size_t run, stop, end = seg->size / x->granule;
  for (size_t g = 0; ta_granules_next(x, g, end, TA_GRANULE_OWNED | TA_GRANULE_RUN, &run, &stop); g = stop)
    ta_segments_unmap_granules(s, seg, run, stop - run, account, 1);
  for (size_t g = 0; ta_granules_next(x, g, end, TA_GRANULE_LENT, &run, &stop); g = stop)
    ta_segments_unmap_granules(s, seg, run, stop - run, 0, 0);
  for (size_t g = 0; (g = ta_granules_next_split(x, g, end)) < end; g++) ta_split_release(s, seg, g, account);
  s->backend->ops->unreserve(s->backend, s->device, seg->addr, x->reserved);
  free(x->handles);
  free(x->lent);
  free(x->split);
  free(x->run);
  free(x);
  free(seg->stamps);
  seg->stamps = NULL;
  seg->expansion = NULL;
}

void ta_segments_release_expandable(ta_segments *s, ta_segment *seg) {
  ta_assert(seg->expansion && seg->first->state == TA_BLOCK_FREE && !seg->first->next);
  expansion_release(s, seg, 1);
  ta_segments_donors_forget(s, seg);
  ta_segments_marks_release(s, seg->marks);
  ta_segments_unregister(s, seg);
  ta_stats_sub(s->stats->segment, seg->pool, 1);
  ta_segments_block_delete(s, seg->first);
  free(seg);
}

void ta_segments_expandable_teardown(ta_segments *s) {
  for (size_t i = s->registry.count; i-- > 0;) {
    ta_segment *seg = s->registry.items[i];
    if (!seg->expansion) continue;
    expansion_release(s, seg, 0);
    ta_segments_unregister(s, seg);
    free(seg); /* its blocks' descriptors belong to the slab, freed with it */
  }
}

/* 1 when the free block `b` holds a mapped granule (or a mapped piece of a split one) wholly. */
static int holds_mapped_granule(const ta_segment *seg, const ta_block *b) {
  size_t first, end, run, stop;
  ta_granules_of(seg, b->addr, b->size, 1, &first, &end);
  if (ta_granules_next_whole(seg->expansion, first, end, &run, &stop)) return 1;
  ta_granules_of(seg, b->addr, b->size, 0, &first, &end);
  for (size_t g = first; (g = ta_granules_next_split(seg->expansion, g, end)) < end; g++)
    if (ta_split_holds_mapped(seg, g, b->addr, b->addr + b->size)) return 1;
  return 0;
}

size_t ta_segments_unmap_free(ta_segments *s, size_t want, const ta_block *keep) {
  size_t released = 0;
  int synced = 0;
  ta_segments_donors_sort(s); /* in address order, as far as `want` */
  for (size_t i = 0; i < s->ndonating && released < want; i++) {
    ta_segment *seg = s->donating[i];
    for (ta_block *b = seg->first; b && released < want; b = b->next) {
      if (b->state != TA_BLOCK_FREE || b == keep || !holds_mapped_granule(seg, b)) continue;
      if (!synced) { /* queued kernels may still use memory freed on their stream */
        ta_segments_synchronize(s);
        synced = 1;
      }
      released += ta_segments_unmap(s, seg, b->addr, b->size);
    }
    ta_segments_note_if_drained(s, seg);
  }
  return released;
}

/* ------------------------------------------------------------------------
 * Peer access
 * ---------------------------------------------------------------------- */

/* Every run of granules mapped at `seg` (owned or lent: a peer's queued
 * copy may still read through a lent granule's old address) gets `peers`. */
static int grant_segment(ta_segments *s, ta_segment *seg, uint64_t peers) {
  ta_expansion *x = seg->expansion;
  size_t end = seg->size / x->granule, g = 0;
  int rc = TA_OK;
  while (g < end) {
    if (x->handles[g] == TA_HANDLE_SPLIT && ta_split_grant(s, seg, g, peers)) rc = TA_EDEVICE;
    if (!x->handles[g] || x->handles[g] == TA_HANDLE_SPLIT) {
      g++;
      continue;
    }
    size_t run = g;
    while (g < end && x->handles[g] && x->handles[g] != TA_HANDLE_SPLIT) g++;
    if (s->backend->ops->grant(s->backend, s->device, seg->addr + run * x->granule, (g - run) * x->granule, peers))
      rc = TA_EDEVICE;
  }
  return rc;
}

int ta_segments_grant(ta_segments *s, uint64_t peers) {
  uint64_t added = peers & ~s->peers & ~((uint64_t)1 << s->device);
  if (!added) return TA_OK;
  s->peers |= added; /* from here every new mapping names them */
  int rc = TA_OK;
  for (size_t i = 0; i < s->registry.count; i++)
    if (s->registry.items[i]->expansion && grant_segment(s, s->registry.items[i], added)) rc = TA_EDEVICE;
  if (ta_segments_ipc_grant(s, added)) rc = TA_EDEVICE;
  return rc;
}
