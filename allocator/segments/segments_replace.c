/* Replacing one physical handle by smaller ones, its live bytes copied
 * over (segments.h, ta_segments_replace_handle): what the out-of-memory
 * path does to a large handle holding free 2 MiB pieces (segments_split.c)
 * and to a run of granules holding free granules, and CUDA IPC to a run
 * (segments_runs.c). The driver maps and unmaps a handle only whole, so
 * the free parts of one partly in use can go back only this way. */
#include <stdio.h>
#include <stdlib.h>

#include "segments/segments.h"
#include "accounting/stats.h"

ptrdiff_t ta_segments_replace_handle(ta_segments *s, ta_segment *seg, uintptr_t base, uint64_t *old, size_t k,
                                     size_t unit, const uint8_t *free_unit, uintptr_t scratch, uint64_t *fresh) {
  const ta_backend_ops *ops = s->backend->ops;
  /* New handles for the units in use, mapped at the scratch addresses and
   * filled there once all are made: until the old handle goes, nothing is
   * lost on a failure. */
  int failed = 0;
  for (size_t j = 0; j < k && !failed; j++)
    if (!free_unit[j] && ops->map(s->backend, s->device, scratch + j * unit, unit, unit, &fresh[j], 0) != TA_OK) {
      fresh[j] = 0; /* the backend made nothing */
      failed = 1;
    }
  for (size_t j = 0; j < k && !failed; j++)
    if (fresh[j]) failed = ops->copy(s->backend, s->device, scratch + j * unit, base + j * unit, unit) != TA_OK;
  for (size_t j = 0; j < k; j++)
    if (fresh[j]) ops->unmap(s->backend, s->device, scratch + j * unit, unit, unit, &fresh[j], failed);
  if (failed) return -1;
  ops->unmap(s->backend, s->device, base, k * unit, k * unit, old, 1);
  s->stats->num_handles_released++;
  size_t released = 0;
  for (size_t j = 0; j < k; j++) {
    if (free_unit[j]) {
      ta_segments_account(s, seg, base + j * unit, unit, -1);
      released += unit;
    } else if (ops->remap(s->backend, s->device, base + j * unit, unit, unit, &fresh[j], s->peers) != TA_OK) {
      /* The old handle is gone: live bytes would be lost. The driver maps
       * a handle it made at addresses reserved for it; it cannot refuse. */
      fprintf(stderr, "torchalloc: remapping %p after replacing its handle failed\n", (void *)(base + j * unit));
      abort();
    } else {
      s->stats->num_handles_created++; /* a new handle for each unit in use */
    }
  }
  seg->unmapped += released;
  return (ptrdiff_t)released;
}
