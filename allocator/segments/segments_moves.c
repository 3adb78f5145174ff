/* The move budget (services.h): how much of the program's time reclaim may
 * spend moving memory (TORCHALLOC_CONF move_time, per mille, 10 by
 * default; 0: no limit), while the reserve is below move_budget_below
 * (1 GiB by default; 0: at every size).
 *
 * Why: reclaim keeps the reserve at the most ever allocated by moving free
 * granules to where a request needs them, and a training step whose
 * addresses span more than the reserve moves the same memory back and
 * forth every step. On a model whose steps keep the GPU busy that is free
 * (the host is ahead and waits anyway), but on one whose steps wait for
 * the host it is step time: the small conv net of bench/models.py moved
 * 5.6 8 MiB handles a 2.7 ms step on the H200 (2026-11-27), 0.6 ms of host
 * time, 1.43x native's median step. With a budget, moves made while the
 * device waits for the host are charged to it; it grows with the time
 * passing (the share), from and up to TA_MOVE_BURST_NS; once it is spent,
 * reclaim maps new memory instead (the reserve grows past the most ever
 * reserved, and the next step's same requests fit without a move), so the
 * layout settles. It refills, so a later change of shape may move again.
 *
 * Why a budget by default only while the reserve is below 1 GiB
 * (move_budget_below): where the reserve is small, so are the steps, and
 * moves are a large share of them, while the growth a spent budget makes is
 * a few handles. On the H200 (BENCHMARKS.md) the small conv net (255 MiB)
 * moved 1.9-2.5 handles a 2.8 ms step under no limit, 1.19-1.40x native's
 * median step on hosts of four H200s; move_time:10 took it to 0.90x at
 * 1.178x reserved instead of 1.115x (move_time:5: 1.08x, 1.147x). Above it
 * the memory is what the default is for: a detection model (13 GiB), whose
 * moves cost 0.3 % of its step, settled under move_time:10 at 1.074x
 * reserved instead of 1.009x with no step faster (its warm-up's moves spend
 * the burst, and what grows then stays). */
#include "segments/segments.h"
#include "accounting/stats.h"

/* Why the budget holds only while the reserve is below twice the most
 * allocated: declining a move grows the reserve, which settles a step that
 * repeats itself (the conv net at 1.178x; a step whose addresses span 1.75x
 * what lives, test_reclaim_layout.c) but not requests that land on new
 * addresses each time (a stream per request: each new stream's segment
 * would be new memory, up to move_budget_below for 3 MiB live). */
#define TA_MOVE_GROWTH_SHIFT 0

/* The budget starts full and holds at most 5 ms (about 90 handles' moves). */
#define TA_MOVE_BURST_NS 5000000

/* The clock the budget runs on (backend.h clock_ns). */
static uint64_t clock_ns(ta_segments *s) {
  return s->backend->ops->clock_ns ? s->backend->ops->clock_ns(s->backend, s->device) : ta_clock_gettime_ns();
}

void ta_segments_moves_init(ta_segments *s, unsigned permille, size_t below) {
  s->move_permille = permille;
  s->move_budget_below = below;
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
  if (!s->move_permille) return 1; /* no limit */
  int64_t reserved = ta_stat_total(s->stats->reserved_bytes);
  if (s->move_budget_below && (size_t)reserved >= s->move_budget_below)
    return 1; /* a reserve this large moves without a limit: nothing charged */
  if (reserved >= s->allocated_high + (s->allocated_high >> TA_MOVE_GROWTH_SHIFT))
    return 1; /* what declining may grow the reserve to is spent: moves go on, uncharged */
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
