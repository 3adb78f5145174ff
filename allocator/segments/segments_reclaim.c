/* Reclaim's side of expandable segments (services.h, segments_expand.c):
 * the donors, the granules of free blocks the device is past gathered to
 * be mapped elsewhere, lending the requester's own stream's granules while
 * the device may still use them, and retiring their old addresses once it
 * is past them. Whole handles only: a run of granules (segments_runs.c)
 * moves, is lent and retires whole. */
#include <stdlib.h>
#include <string.h>

#include "segments/granules.h"
#include "accounting/stats.h"

static int reserve_donors(ta_donors *d, size_t n) {
  if (n <= d->cap) return 0;
  size_t cap = ta_grown_capacity(d->cap, n, 64);
  if (!cap || ta_resize(&d->handles, cap) || ta_resize(&d->stamps, cap) || ta_resize(&d->lengths, cap)) return -1;
  d->cap = cap;
  return 0;
}

static void donate(ta_donors *d, size_t granule, uint64_t handle, uint32_t stamp, size_t length) {
  ta_assert(d->n == 0 || d->granule == granule); /* one size at a time: callers take from one kind */
  d->granule = granule;
  d->handles[d->n] = handle;
  d->stamps[d->n] = stamp;
  d->lengths[d->n++] = (uint16_t)length;
}

/* A handle (a granule, or a run of them) of a free block the device is
 * past: a donor candidate. */
struct ta_past_granule {
  uint32_t stamp; /* its stream's marker epoch when its memory was last freed: its age (a run's newest) */
  uint16_t length; /* granules */
  ta_segment *segment;
  size_t g;
};

static int by_place(const void *pa, const void *pb) { /* address order */
  const ta_past_granule *a = pa, *b = pb;
  if (a->segment != b->segment) return a->segment->addr < b->segment->addr ? -1 : 1;
  return a->g < b->g ? -1 : a->g > b->g;
}

static int by_age(const void *pa, const void *pb) { /* ties in place order: the choice is the same every run */
  const ta_past_granule *a = pa, *b = pb;
  return a->stamp != b->stamp ? (a->stamp < b->stamp ? -1 : 1) : by_place(pa, pb);
}

/* The newest stamp of granules [g, g + n). */
static uint32_t newest_stamp(const ta_segment *seg, size_t g, size_t n) {
  uint32_t stamp = 0;
  for (size_t j = g; j < g + n; j++)
    if (seg->stamps[j] > stamp) stamp = seg->stamps[j];
  return stamp;
}

/* Every whole handle mapped in segments of `granule` size that a free
 * block (not `keep`) holds wholly and the device is past, into s->past;
 * their count, or -1 when host memory runs out. */
static ptrdiff_t gather_past(ta_segments *s, size_t granule, const ta_block *keep) {
  size_t n = 0;
  for (size_t i = 0; i < s->ndonating;) {
    ta_segment *seg = s->donating[i];
    if (ta_segments_nothing_mapped(seg)) { /* the last one takes its place */
      ta_segments_donates_nothing(s, seg);
      continue;
    }
    i++;
    if (!seg->marks || seg->expansion->granule != granule) continue;
    for (ta_block *b = seg->first; b; b = b->next) {
      if (b->state != TA_BLOCK_FREE || b == keep) continue;
      size_t first, end, run, stop;
      ta_granules_of(seg, b->addr, b->size, 1, &first, &end);
      for (size_t from = first; ta_granules_next_whole(seg->expansion, from, end, &run, &stop); from = stop) {
        for (size_t g = run, len; g < stop; g += len) {
          len = ta_run_length(seg->expansion, g);
          uint32_t stamp = newest_stamp(seg, g, len);
          if (stamp > seg->marks->done) continue;
          if (ta_grow(&s->past, &s->cap_past, n + 1, 256)) return -1;
          s->past[n++] = (ta_past_granule){.stamp = stamp, .length = (uint16_t)len, .segment = seg, .g = g};
        }
      }
    }
  }
  return (ptrdiff_t)n;
}

/* Why the oldest first: memory freed long ago is the least likely to be
 * asked for again soon, so a hole left there is the last to need filling
 * (replay of the H100 traces, device trailing by 50 events: the Llama
 * decoder moved 2357 handles instead of 3898, GPT-2 3002 instead of 6266,
 * ResNet-50 1050 instead of 1171, at the same reserve; taking them in
 * address order left holes where the next step allocates). A run larger
 * than what the request still lacks is taken too: it fits nowhere in the
 * request and goes back (ta_segments_donors_drop), so single granules are
 * made in its place without the reserve growing. */
size_t ta_segments_take_past(ta_segments *s, size_t want, size_t granule, const ta_block *keep) {
  ptrdiff_t found = gather_past(s, granule, keep);
  if (found <= 0) return 0; /* none, or no host memory to choose with: nothing moves */
  size_t n = (size_t)found, need = ta_align_up(want, granule) / granule, total = 0;
  for (size_t k = 0; k < n; k++) total += s->past[k].length;
  if (total > need) { /* no more than the request maps */
    qsort(s->past, n, sizeof *s->past, by_age);
    size_t kept = 0;
    for (size_t took = 0; kept < n && took < need; kept++) took += s->past[kept].length;
    n = kept;
  }
  qsort(s->past, n, sizeof *s->past, by_place); /* runs of neighbours: one unmap each */
  if (reserve_donors(&s->donors, s->donors.n + n)) return 0;
  size_t got = 0;
  for (size_t k = 0, next; k < n; k = next) {
    ta_segment *seg = s->past[k].segment;
    size_t first = s->past[k].g, len = 0;
    for (next = k; next < n && s->past[next].segment == seg && s->past[next].g == first + len; next++) {
      donate(&s->donors, granule, seg->expansion->handles[s->past[next].g], 0, s->past[next].length);
      len += s->past[next].length; /* stamp 0: past, old everywhere */
    }
    ta_segments_unmap_granules(s, seg, first, len, 1, 0);
    seg->unmapped += len * granule;
    got += len * granule;
    ta_segments_note_if_drained(s, seg);
  }
  return got;
}

void ta_segments_lend(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  ta_expansion *x = seg->expansion;
  size_t first, end;
  ta_granules_of(seg, addr, len, 1, &first, &end);
  ta_assert((addr - seg->addr) % x->granule == 0 && len % x->granule == 0 && end > first);
  if (reserve_donors(&s->donors, s->donors.n + (end - first))) return; /* then lent to none: it retires as it is */
  for (size_t g = first, n; g < end; g += n) {
    n = ta_run_length(x, g);
    ta_assert(ta_granule_state(x, g) & (TA_GRANULE_OWNED | TA_GRANULE_RUN) && ta_run_start(x, g) == g && g + n <= end);
    /* the same stream's epoch where it goes */
    donate(&s->donors, x->granule, x->handles[g], newest_stamp(seg, g, n), n);
    memset(x->lent + g, 1, n);
  }
  seg->unmapped += len;
  ta_segments_account(s, seg, addr, len, -1);
}

void ta_segments_retire(ta_segments *s, ta_segment *seg, uintptr_t addr, size_t len) {
  ta_expansion *x = seg->expansion;
  size_t first, end, run, stop;
  ta_granules_of(seg, addr, len, 1, &first, &end);
  for (size_t g = first; ta_granules_next(x, g, end, TA_GRANULE_LENT, &run, &stop); g = stop) {
    ta_segments_unmap_granules(s, seg, run, stop - run, 0, 0);
    s->stats->num_device_free++; /* a device call; its bytes left the stats when lent */
  }
  /* A retiring range whose lending failed (host memory) is still owned:
   * its memory is given back now, as any free granule's would be. */
  for (size_t g = first; ta_granules_next_whole(x, g, end, &run, &stop); g = stop) {
    ta_segments_unmap_granules(s, seg, run, stop - run, 1, 1);
    seg->unmapped += (stop - run) * x->granule;
  }
}

int ta_segments_mapped_run(const ta_segment *seg, uintptr_t lo, uintptr_t hi, size_t want, uintptr_t *run_lo,
                           uintptr_t *run_hi) {
  const ta_expansion *x = seg->expansion;
  size_t first, end, run, stop, granule = x->granule;
  ta_granules_of(seg, lo, hi - lo, 1, &first, &end);
  if (!ta_granules_next_whole(x, first, end, &run, &stop)) return 0;
  size_t g = run, need = ta_align_up(want, granule) / granule;
  while (g < stop && g - run < need) g += ta_run_length(x, g); /* whole handles only */
  *run_lo = seg->addr + run * granule;
  *run_hi = seg->addr + g * granule;
  return 1;
}

int ta_segments_may_remap(const ta_segments *s) { return !s->no_sync; }

int ta_segments_range_past(const ta_segment *seg, uintptr_t addr, size_t len) {
  size_t first, end;
  ta_granules_of(seg, addr, len, 1, &first, &end);
  for (size_t g = first; g < end; g++)
    if (!seg->marks || seg->stamps[g] > seg->marks->done) return 0;
  return 1;
}

void ta_segments_donors_drop(ta_segments *s) {
  if (!s->donors.n) return;
  s->backend->ops->release(s->backend, s->device, s->donors.handles, s->donors.n);
  s->stats->num_handles_released += (int64_t)s->donors.n;
  s->donors.n = 0;
}
