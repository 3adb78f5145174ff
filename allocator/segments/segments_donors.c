/* Where reclaim and compact look for memory to move or give back
 * (segments.h): the expandable segments with memory mapped, and those they
 * emptied.
 *
 * Why a list: both walk the candidates' free blocks for mapped granules.
 * Walking every segment instead made each pass cost as much as the number
 * of streams ever used (each has its segments): 40,000 streams used once
 * took 21 s on the simulated device under reclaim. A segment joins when
 * memory is mapped into it and leaves when a walk finds nothing mapped in
 * it (a segment with live blocks has), or when it goes.
 *
 * A segment left with nothing mapped and nothing in use holds only
 * addresses (as many as the device has bytes) and, under reclaim, its
 * stream's markers: it is listed as drained, for its owner to release once
 * the request in flight is done (the owner's bookkeeping is in use until
 * then). */
#include <stdlib.h>

#include "segments/segments.h"

static int push(ta_segment ***items, size_t *n, size_t *cap, ta_segment *seg) {
  if (ta_grow(items, cap, *n + 1, 16)) return -1;
  (*items)[(*n)++] = seg;
  return 0;
}

void ta_segments_may_donate(ta_segments *s, ta_segment *seg) {
  if (seg->donor_slot || !seg->expansion) return;
  /* Without host memory it is not looked at: its memory stays where it is, and the reserve grows instead. */
  if (push(&s->donating, &s->ndonating, &s->cap_donating, seg) == 0) seg->donor_slot = (uint32_t)s->ndonating;
}

void ta_segments_donates_nothing(ta_segments *s, ta_segment *seg) {
  if (!seg->donor_slot) return;
  size_t i = seg->donor_slot - 1;
  ta_segment *moved = s->donating[--s->ndonating];
  s->donating[i] = moved;
  moved->donor_slot = (uint32_t)i + 1;
  seg->donor_slot = 0;
}

static int by_address(const void *pa, const void *pb) {
  const ta_segment *a = *(ta_segment *const *)pa, *b = *(ta_segment *const *)pb;
  return a->addr < b->addr ? -1 : a->addr > b->addr;
}

void ta_segments_donors_sort(ta_segments *s) {
  size_t kept = 0;
  for (size_t i = 0; i < s->ndonating; i++) { /* those with nothing mapped leave first */
    ta_segment *seg = s->donating[i];
    if (ta_segments_nothing_mapped(seg)) seg->donor_slot = 0;
    else s->donating[kept++] = seg;
  }
  s->ndonating = kept;
  if (s->ndonating > 1) qsort(s->donating, s->ndonating, sizeof *s->donating, by_address);
  for (size_t i = 0; i < s->ndonating; i++) s->donating[i]->donor_slot = (uint32_t)i + 1;
}

void ta_segments_note_if_drained(ta_segments *s, ta_segment *seg) {
  if (!ta_segments_nothing_mapped(seg) || seg->first != seg->last) return;
  for (size_t i = 0; i < s->ndrained; i++)
    if (s->drained[i] == seg) return;
  push(&s->drained, &s->ndrained, &s->cap_drained, seg); /* without host memory it stays, as before */
}

ta_segment *ta_segments_next_drained(ta_segments *s) { return s->ndrained ? s->drained[--s->ndrained] : NULL; }

void ta_segments_donors_forget(ta_segments *s, ta_segment *seg) {
  ta_segments_donates_nothing(s, seg);
  for (size_t i = 0; i < s->ndrained; i++)
    if (s->drained[i] == seg) s->drained[i--] = s->drained[--s->ndrained];
}

void ta_segments_donors_destroy(ta_segments *s) {
  free(s->donating);
  free(s->drained);
  s->donating = s->drained = NULL;
  s->ndonating = s->cap_donating = s->ndrained = s->cap_drained = 0;
}
