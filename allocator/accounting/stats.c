#include "accounting/stats.h"

/* What each kind of TORCHALLOC_STATS_FIELDS is to this file: a per-pool
 * array (counted, reached by name), or a counter that a reset of the
 * accumulated stats zeroes (not the misuse ones: a reset must not hide
 * misuse). */
#define IF_ARRAY_version(...)
#define IF_ARRAY_pooled(...) __VA_ARGS__
#define IF_ARRAY_torch(...)
#define IF_ARRAY_misuse(...)
#define IF_ARRAY_torchalloc(...)
#define IF_ACCUMULATED_version(...)
#define IF_ACCUMULATED_pooled(...)
#define IF_ACCUMULATED_torch(...) __VA_ARGS__
#define IF_ACCUMULATED_misuse(...)
#define IF_ACCUMULATED_torchalloc(...) __VA_ARGS__
#define COUNT(kind, name) IF_ARRAY_##kind(+1)
#define ADDRESS(kind, name) IF_ARRAY_##kind(s->name, )
#define ZERO(kind, name) IF_ACCUMULATED_##kind(s->name = 0;)

enum { STAT_ARRAYS = 0 TORCHALLOC_STATS_FIELDS(COUNT) };

/* The i-th per-pool array of torchalloc_stats, by name: stepping a pointer
 * from one member array into the next is undefined behaviour. */
static torchalloc_stat *array(torchalloc_stats *s, int i) {
  torchalloc_stat *const arrays[STAT_ARRAYS] = {TORCHALLOC_STATS_FIELDS(ADDRESS)};
  return arrays[i];
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void note_peak(int64_t *peak, int64_t value) {
  if (value > *peak) *peak = value;
}

void ta_stats_note_active_peak(const torchalloc_stats *s, ta_pending_stats *p) {
  for (int pool = 1; pool < TORCHALLOC_NPOOLS; pool++) {
    note_peak(&p->active_peak[pool], s->allocation[pool].current + p->count[pool].current);
    note_peak(&p->active_bytes_peak[pool], s->allocated_bytes[pool].current + p->bytes[pool].current);
  }
  note_peak(&p->active_peak[0], ta_stat_total(s->allocation) + ta_stat_total(p->count));
  note_peak(&p->active_bytes_peak[0], ta_stat_total(s->allocated_bytes) + ta_stat_total(p->bytes));
}

/* active = allocation + pending. Every increase of active is an allocation;
 * it decreases at a plain free (allocation.freed) or when a pending block is
 * released (pending.freed), but not at a deferred free (pending.allocated). */
static void derive_active(const torchalloc_stat *alloc, const torchalloc_stat *pend, const int64_t *pend_peak,
                          torchalloc_stat *active) {
  for (int pool = 0; pool < TORCHALLOC_NPOOLS; pool++) {
    active[pool].current = alloc[pool].current + pend[pool].current;
    active[pool].allocated = alloc[pool].allocated;
    active[pool].freed = alloc[pool].freed - pend[pool].allocated + pend[pool].freed;
    active[pool].peak = max64(alloc[pool].peak, pend_peak[pool]);
  }
}

static void fill_all(torchalloc_stat *st) {
  st[0].current = st[1].current + st[2].current;
  st[0].allocated = st[1].allocated + st[2].allocated;
  st[0].freed = st[1].freed + st[2].freed;
}

void ta_stats_export(const torchalloc_stats *s, const ta_pending_stats *p, torchalloc_stats *out) {
  *out = *s;
  for (int i = 0; i < STAT_ARRAYS; i++) fill_all(array(out, i));
  torchalloc_stat pend_count[TORCHALLOC_NPOOLS], pend_bytes[TORCHALLOC_NPOOLS];
  for (int i = 0; i < TORCHALLOC_NPOOLS; i++) pend_count[i] = p->count[i], pend_bytes[i] = p->bytes[i];
  fill_all(pend_count);
  fill_all(pend_bytes);
  derive_active(out->allocation, pend_count, p->active_peak, out->active);
  derive_active(out->allocated_bytes, pend_bytes, p->active_bytes_peak, out->active_bytes);
}

void ta_stats_reset_peak(torchalloc_stats *s, ta_pending_stats *p) {
  for (int i = 0; i < STAT_ARRAYS; i++) {
    torchalloc_stat *st = array(s, i);
    st[1].peak = st[1].current;
    st[2].peak = st[2].current;
    st[0].peak = st[1].current + st[2].current;
  }
  for (int pool = 0; pool < TORCHALLOC_NPOOLS; pool++) p->active_peak[pool] = p->active_bytes_peak[pool] = 0;
  ta_stats_note_active_peak(s, p);
}

void ta_stats_reset_accumulated(torchalloc_stats *s, ta_pending_stats *p) {
  for (int i = 0; i < STAT_ARRAYS; i++)
    for (int pool = 0; pool < TORCHALLOC_NPOOLS; pool++) array(s, i)[pool].allocated = array(s, i)[pool].freed = 0;
  for (int pool = 0; pool < TORCHALLOC_NPOOLS; pool++) {
    p->count[pool].allocated = p->count[pool].freed = 0;
    p->bytes[pool].allocated = p->bytes[pool].freed = 0;
  }
  TORCHALLOC_STATS_FIELDS(ZERO)
}
