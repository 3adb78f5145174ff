/* When reclaim moves memory (services.h): below grow_below reserved (0,
 * never, by default) it does not; elsewhere within the move budget
 * (TORCHALLOC_CONF move_time, per mille; 0, the default: no limit).
 *
 * Why moves at all: reclaim keeps the reserve at the most ever allocated
 * by moving free granules to where a request needs them, and a training
 * step whose addresses span more than the reserve moves the same memory
 * back and forth every step. On a model whose steps keep the GPU busy that
 * is free (the host is ahead and waits anyway).
 *
 * grow_below (0, never, by default): below that reserve, and below twice
 * the most allocated, reclaim maps new memory where it would move memory,
 * whatever the device is doing; the 2x cap keeps requests that land on new
 * addresses each time (a stream per request) from growing the reserve with
 * every request: past it they move again. What it buys is host time: the
 * small conv net of bench/models.py (255 MiB) moved 1.2 8 MiB handles a
 * step on an H200 and spent 0.163 ms a step in the allocator; with
 * grow_below:1GiB none after its warm-up and 0.051 ms, at 1.178x reserved
 * instead of 1.115x. Why not by default: its step was no faster for it
 * (BENCHMARKS.md, 2026-11-28: alone on one H200, median step 1.029x
 * native's (0.895-1.224) with it, 0.885x (0.859-1.123) moving; 1.24-1.25x
 * either way on hosts whose other three cards were busy), and every small
 * program would reserve more for it.
 *
 * The budget (move_time): moves made while the device waits for the host
 * are charged to it; it grows with the time passing (the share), from and
 * up to TA_MOVE_BURST_NS; once it is spent, reclaim maps new memory
 * instead (the reserve grows past the most ever reserved, and the next
 * step's same requests fit without a move), so the layout settles. It
 * refills, so a later change of shape may move again. Why no limit by
 * default: a detection model (13 GiB), whose moves cost 0.3 % of its
 * step, settled under move_time:10 at 1.074x reserved instead of 1.009x
 * with no step faster (H200, BENCHMARKS.md); it counts the moves' host
 * time (about 55 us a handle), and at 10 per mille the conv net's 1.2
 * moves a step never spent it. */
#include "segments/segments.h"
#include "accounting/stats.h"

/* The budget starts full and holds at most 5 ms (about 90 handles' moves). */
#define TA_MOVE_BURST_NS 5000000

/* The clock the budget runs on (backend.h clock_ns). */
static uint64_t clock_ns(ta_segments *s) {
  return s->backend->ops->clock_ns ? s->backend->ops->clock_ns(s->backend, s->device) : ta_clock_gettime_ns();
}

void ta_segments_moves_init(ta_segments *s, unsigned permille, size_t grow_below) {
  s->move_permille = permille;
  s->grow_below = grow_below;
  s->move_clock_ns = permille ? clock_ns(s) : 0;
  s->move_budget_ns = TA_MOVE_BURST_NS;
}

uint64_t ta_segments_move_since(ta_segments *s) { return s->move_permille ? clock_ns(s) : 0; }

/* The budget grows by the share of the time passed since it was last
 * topped up, to at most TA_MOVE_BURST_NS. */
static void top_up(ta_segments *s) {
  uint64_t now = clock_ns(s);
  if (now > s->move_clock_ns) {
    s->move_budget_ns += (int64_t)((now - s->move_clock_ns) * s->move_permille / 1000);
    if (s->move_budget_ns > TA_MOVE_BURST_NS) s->move_budget_ns = TA_MOVE_BURST_NS;
  }
  s->move_clock_ns = now;
}

int ta_segments_move_allowed(ta_segments *s, cudaStream_t stream, int must) {
  s->moves_charged = 0;
  int64_t reserved = ta_stat_total(s->stats->reserved_bytes);
  /* past twice the most allocated a request's memory is found by moving again (see above) */
  if (!must && s->grow_below && (size_t)reserved < s->grow_below && reserved < 2 * s->allocated_high) {
    s->stats->num_moves_declined++; /* a small reserve grows instead */
    return 0;
  }
  if (!s->move_permille) return 1; /* no limit */
  top_up(s);
  const ta_stream_marks *m = ta_segments_marks_find(s, stream);
  /* No marker in flight after the poll: the last one recorded is done, so
   * the device has run out of queued work and the host's time is the step's. */
  s->moves_charged = m && !m->event;
  if (must || !s->moves_charged || s->move_budget_ns > 0) return 1;
  s->stats->num_moves_declined++;
  return 0;
}

void ta_segments_move_charge(ta_segments *s, uint64_t since) {
  if (!s->moves_charged) return;
  uint64_t now = clock_ns(s);
  if (now > since) s->move_budget_ns -= (int64_t)(now - since);
}
