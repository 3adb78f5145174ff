/* The move budget (services.h): how much of the program's time reclaim may
 * spend moving memory.
 *
 * Why: reclaim keeps the reserve at the most ever allocated by moving free
 * granules to where a request needs them, and a training step whose
 * addresses span more than the reserve moves the same memory back and
 * forth every step. On a model whose steps keep the GPU busy that is free
 * (the host is ahead and waits anyway), but on one whose steps wait for
 * the host it is step time: the small conv net of bench/models.py moved
 * 5.6 8 MiB handles a 2.7 ms step on the H200 (2026-11-27), 0.6 ms of host
 * time, 1.43x native's median step. So moves made while the device waits
 * for the host are charged to a budget that grows with the time passing
 * (a share of it, from a burst of TA_MOVE_BURST_NS); once it is
 * spent, reclaim maps new memory instead (the reserve grows past the most
 * ever reserved, and the next step's same requests fit without a move).
 * The budget refills, so a later change of shape may move again. */
#include <time.h>

#include "segments/segments.h"

/* The share (TORCHALLOC_CONF move_time, per mille: 5 by default) is taken
 * from a budget of at most 5 ms (about 90 handles' moves), full at first so
 * that the first steps settle their layout. Why 0.5 % and 5 ms: replay of
 * the H200 logs of bench/models.py with the device keeping up (BENCHMARKS.md):
 * larger budgets kept moving the conv net's handles every step; and the
 * issue's bound on step time is 1 %, of which moves get half. */
#define TA_MOVE_BURST_NS 5000000

uint64_t ta_segments_clock_ns(ta_segments *s) {
  if (s->backend->ops->clock_ns) return s->backend->ops->clock_ns(s->backend, s->device);
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The budget grows by the share of the time passed since it was last
 * topped up, to at most the burst (full at the first move). */
static void top_up(ta_segments *s) {
  uint64_t now = ta_segments_clock_ns(s);
  if (!s->move_budget_started) {
    s->move_budget_started = 1;
    s->move_budget_ns = TA_MOVE_BURST_NS;
  } else if (now > s->move_clock_ns) {
    s->move_budget_ns += (int64_t)((now - s->move_clock_ns) * s->move_permille / 1000);
    if (s->move_budget_ns > TA_MOVE_BURST_NS) s->move_budget_ns = TA_MOVE_BURST_NS;
  }
  s->move_clock_ns = now;
}

int ta_segments_move_allowed(ta_segments *s, cudaStream_t stream) {
  top_up(s);
  ta_stream_marks *m = NULL;
  for (size_t i = 0; i < s->nmarks && !m; i++)
    if (s->marks[i]->stream == stream) m = s->marks[i];
  /* No marker in flight after the poll: the last one recorded is done, so
   * the device has run out of queued work and the host's time is the step's. */
  s->moves_charged = m && !m->event && s->move_permille < 1000;
  return !s->moves_charged || s->move_budget_ns > 0;
}

void ta_segments_move_charge(ta_segments *s, uint64_t since) {
  if (!s->moves_charged) return;
  uint64_t now = ta_segments_clock_ns(s);
  if (now > since) s->move_budget_ns -= (int64_t)(now - since);
}
