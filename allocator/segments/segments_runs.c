/* Runs: warm-up growth mapped as handles of several granules (segments.h,
 * ta_expansion.run).
 *
 * Why: the driver's calls cost per physical handle, not per byte
 * (bench/vmm_costs.c: making and mapping a GiB took 5.4 ms in 8 MiB handles
 * on an H200, 2.5 ms in 64 MiB ones), and a warm-up maps all of a run's
 * memory for the first time: GPT-2's 15 GiB were about 1,900 handles of
 * 8 MiB, its first ten steps 105 ms above PyTorch's allocator's. So while
 * the reserve grows past the most it ever was during the first ramp (until
 * allocated bytes first fall below half their most: a first step's
 * activations freed), new memory of the large pool is made in handles of
 * up to `run` bytes (config.h, TA_DEFAULT_RUN). Later growth past the most
 * (a longer sequence drawn) is transient: made in runs, it would leave them
 * partly in use. Replay of the bundled trace with runs after the first ramp
 * too (growth of any size, or only of 64 granules or more; runs of 2 to 16
 * granules): 1.015x reserved where the default reserves 1.011x, for 330 to
 * 469 handles made instead of 738. So a Llama-style decoder on a GPU
 * still makes about 65 handles a step for its longer sequences
 * (BENCHMARKS.md), and its mean step pays for them.
 *
 * The driver maps and unmaps a handle only whole, so a run is the unit it
 * is mapped, lent, moved and given back in: a run partly in use keeps its
 * free granules mapped. Past the warm-up (the reserve below its most) new
 * memory is made one granule a handle again, so what moves in the steady
 * state keeps moving granule by granule. Where a run's granules must be
 * handles of their own, it is broken: its granules in use get new handles
 * and their bytes are copied over, its free ones go back. That needs the
 * device idle, so it happens only where the caller may wait: the
 * out-of-memory path (free granules of runs partly in use go back before
 * the request fails) and CUDA IPC (PyTorch's wire format has one handle
 * size a segment). */
#include <stdio.h>
#include <stdlib.h>

#include "segments/segments.h"
#include "accounting/stats.h"

/* Why at most 1/256 of the device: a run partly in use keeps its free
 * granules, and breaking it needs room for the granules in use beside it;
 * on an 80 GiB device that is 320 MiB, on a small one no run at all. */
#define RUN_DEVICE_SHIFT 8
/* Why at most 1/64 of the reserve it joins (counting itself): what a run
 * left partly in use strands is then at most that share, and a program's
 * first GiB, where a run would be a large share, is made a granule a
 * handle. Replay of the bundled traces (drawn batch and length, 5.6 GiB;
 * the demo, 1.2 GiB) reserves what it does without runs (1.011x, 1.066x);
 * with 64 MiB runs from the first growth on, 1.018x and 1.072x. */
#define RUN_RESERVE_SHIFT 6

size_t ta_runs_length(const ta_segments *s, const ta_segment *seg, size_t n) {
  size_t granule = seg->expansion->granule, length = s->run_bytes, most = seg->expansion->device >> RUN_DEVICE_SHIFT;
  int64_t after = ta_stat_total(s->stats->reserved_bytes) + (int64_t)(n * granule); /* the reserve this growth makes */
  if ((size_t)after >> RUN_RESERVE_SHIFT < most) most = (size_t)after >> RUN_RESERVE_SHIFT;
  length = (length < most ? length : most) / granule;
  /* Under a capture (no_sync) a run that failed half made could not be unmapped: each is its own call. */
  if (length < 2 || n < 2 || seg->pool != TA_POOL_LARGE || s->limit || s->no_sync || s->ramp_over) return 1;
  /* Past the warm-up the reserve stays under its most, and after the first ramp growth is transient: single
   * granules. */
  if (after <= s->high_water) return 1;
  return length < TA_RUN_MAX_GRANULES ? length : TA_RUN_MAX_GRANULES;
}

/* Which granules of the run at `g` (`length` of them) lie wholly in free
 * blocks, into free_granule[]. */
static void free_granules(const ta_segment *seg, size_t g, size_t length, uint8_t *free_granule) {
  size_t granule = seg->expansion->granule;
  const ta_block *b = seg->first;
  for (size_t j = 0; j < length; j++) {
    uintptr_t lo = seg->addr + (g + j) * granule;
    while (b && b->addr + b->size <= lo) b = b->next;
    free_granule[j] = b && b->state == TA_BLOCK_FREE && b->addr <= lo && b->addr + b->size >= lo + granule;
  }
}

/* Replace the run at granule `g` by a handle per granule (scratch:
 * addresses of the run's size to copy through). The bytes given back, or
 * -1 when nothing changed (the device said no). */
static ptrdiff_t break_run(ta_segments *s, ta_segment *seg, size_t g, uintptr_t scratch, uint8_t *free_granule) {
  ta_expansion *x = seg->expansion;
  size_t length = ta_run_length(x, g);
  uint64_t *fresh = calloc(length, sizeof *fresh);
  if (!fresh) return -1;
  free_granules(seg, g, length, free_granule);
  ptrdiff_t released = ta_segments_replace_handle(s, seg, seg->addr + g * x->granule, &x->handles[g], length,
                                                  x->granule, free_granule, scratch, fresh);
  for (size_t j = 0; released >= 0 && j < length; j++) {
    x->run[g + j] = 0;
    x->handles[g + j] = fresh[j];
  }
  free(fresh);
  return released;
}

/* Addresses and scratch space for runs of up to `length` granules of
 * `granule` bytes: TA_OK, or TA_ENOMEM. */
static int scratch_for(ta_segments *s, size_t granule, size_t length, uintptr_t *scratch, size_t *scratch_size,
                       uint8_t **free_granule) {
  if (*scratch_size >= granule * length) return TA_OK;
  if (*scratch) s->backend->ops->unreserve(s->backend, s->device, *scratch, *scratch_size);
  *scratch = 0, *scratch_size = 0;
  uint8_t *grown = realloc(*free_granule, length);
  if (!grown) return TA_ENOMEM;
  *free_granule = grown;
  if (s->backend->ops->reserve(s->backend, s->device, granule * length, scratch) != TA_OK) return TA_ENOMEM;
  *scratch_size = granule * length;
  return TA_OK;
}

/* Break the runs of `seg` with a granule in [first, end) that `wanted`
 * says to (NULL: every one), until `want` bytes are back: the bytes back
 * added to *released. TA_OK, or TA_ENOMEM when one could not be. */
static int break_runs(ta_segments *s, ta_segment *seg, size_t first, size_t end,
                      int (*wanted)(const ta_segment *, size_t), size_t want, size_t *released) {
  ta_expansion *x = seg->expansion;
  uintptr_t scratch = 0;
  size_t scratch_size = 0;
  uint8_t *free_granule = NULL;
  int rc = TA_OK;
  for (size_t g = first < end ? ta_run_start(x, first) : end; g < end && *released < want;) {
    if (!x->run[g] || x->lent[g] || (wanted && !wanted(seg, g))) {
      g += x->run[g] ? ta_run_length(x, g) : 1;
      continue;
    }
    size_t length = ta_run_length(x, g);
    ptrdiff_t got = -1;
    if (scratch_for(s, x->granule, length, &scratch, &scratch_size, &free_granule) == TA_OK)
      got = break_run(s, seg, g, scratch, free_granule);
    if (got < 0) {
      rc = TA_ENOMEM;
      break;
    }
    *released += (size_t)got;
    g += length;
  }
  if (scratch) s->backend->ops->unreserve(s->backend, s->device, scratch, scratch_size);
  free(free_granule);
  return rc;
}

int ta_runs_break(ta_segments *s, ta_segment *seg, size_t first, size_t end, size_t *released, char *why,
                  size_t whylen) {
  if (!s->backend->ops->copy || s->no_sync) {
    snprintf(why, whylen, "the block lies on memory mapped as one handle of several granules, which PyTorch's IPC "
             "format cannot describe, and %s", s->no_sync ? "a CUDA graph capture may be underway (it would need a "
             "device synchronize to remap)" : "this backend cannot copy device memory to remap it");
    return TA_EDEVICE;
  }
  ta_segments_synchronize(s); /* the bytes copied may still be written by queued kernels */
  if (break_runs(s, seg, first, end, NULL, SIZE_MAX, released) != TA_OK) {
    snprintf(why, whylen, "the block lies on memory mapped as one handle of several granules, which PyTorch's IPC "
             "format cannot describe, and the device refused memory to remap it granule by granule");
    return TA_EDEVICE;
  }
  return TA_OK;
}

/* 1 when the run at `g` has a granule lying wholly in a free block. */
static int holds_free_granule(const ta_segment *seg, size_t g) {
  size_t length = ta_run_length(seg->expansion, g), granule = seg->expansion->granule;
  uintptr_t lo = seg->addr + g * granule, hi = lo + length * granule;
  for (const ta_block *b = seg->first; b && b->addr < hi; b = b->next) {
    if (b->state != TA_BLOCK_FREE || b->addr + b->size <= lo) continue;
    uintptr_t from = b->addr > lo ? ta_align_up(b->addr - seg->addr, granule) + seg->addr : lo;
    uintptr_t to = b->addr + b->size < hi ? b->addr + b->size : hi;
    if (from + granule <= to) return 1;
  }
  return 0;
}

size_t ta_runs_break_free(ta_segments *s, size_t want) {
  size_t released = 0;
  if (!s->backend->ops->copy || s->no_sync) return 0;
  for (size_t i = 0; i < s->registry.count && released < want; i++) {
    ta_segment *seg = s->registry.items[i];
    if (seg->expansion && break_runs(s, seg, 0, seg->size / seg->expansion->granule, holds_free_granule, want,
                                     &released) != TA_OK)
      break;
  }
  return released;
}
