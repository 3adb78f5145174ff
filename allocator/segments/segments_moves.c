/* When reclaim moves memory (services.h): below grow_below reserved it
 * does not; above it, within the move budget (TORCHALLOC_CONF move_time,
 * per mille; 0, the default: no limit).
 *
 * Why moves at all: reclaim keeps the reserve at the most ever allocated
 * by moving free granules to where a request needs them, and a training
 * step whose addresses span more than the reserve moves the same memory
 * back and forth every step. On a model whose steps keep the GPU busy that
 * is free (the host is ahead and waits anyway).
 *
 * Why not below grow_below (1 GiB by default): a small model's steps are
 * short and a move costs them far more than its host time. On four-H200
 * hosts (BENCHMARKS.md, 2026-11-28) the small conv net (255 MiB, a 2.2 ms
 * step) moved 1.2 8 MiB handles a step, about 55 us of host time each, and
 * its median step was 1.25x native's (1.40x at 2.5 moves); the move budget
 * at 10 per mille never ran out there (0 moves declined): it counts host
 * time, and the step lost 0.55 ms. Mapping new memory instead, the layout
 * settles within a few steps at a reserve a few handles larger (replay of
 * that run's log: 1.178x reserved instead of 1.115x, 0 moves after the
 * warm-up); the 2x cap keeps requests that land on new addresses each time
 * (a stream per request) from growing the reserve with every request: past
 * it they move again. Above 1 GiB the memory is what the default is for: a
 * detection model (13 GiB), whose moves cost 0.3 % of its step, settled
 * under move_time:10 at 1.074x reserved instead of 1.009x with no step
 * faster.
 *
 * The budget (move_time): moves made while the device waits for the host
 * are charged to it; it grows with the time passing (the share), from and
 * up to TA_MOVE_BURST_NS; once it is spent, reclaim maps new memory
 * instead (the reserve grows past the most ever reserved, and the next
 * step's same requests fit without a move), so the layout settles. It
 * refills, so a later change of shape may move again. */
#include "segments/segments.h"
#include "accounting/stats.h"

/* Why growth replaces moves only below twice the most allocated: past it a
 * request's memory is found by moving again (see above). */
#define TA_GROW_LIMIT_SHIFT 0

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
  if (!must && s->grow_below && (size_t)reserved < s->grow_below &&
      reserved < s->allocated_high + (s->allocated_high >> TA_GROW_LIMIT_SHIFT)) {
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
