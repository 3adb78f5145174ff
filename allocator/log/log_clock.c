/* Fitting TSC ticks to CLOCK_MONOTONIC for record timestamps (log_clock.h). */
#include "log/log_clock.h"

#include <stdio.h>
#include <string.h>

ta_log_clock ta_clock = {.refitting = ATOMIC_FLAG_INIT};

#if TA_LOG_TSC

#define FIRST_FIT_NS 50000u       /* the slope before the first refit comes from 50 us of spinning */
#define FIRST_REFIT_NS 1000000u   /* refits at 1 ms, 2 ms, 4 ms, ... */
#define MAX_REFIT_NS 100000000u   /* ... then every 100 ms */

/* The kernel uses the TSC for CLOCK_MONOTONIC only when it is invariant and
 * synchronised across cores; that is exactly what we need too. */
static int kernel_trusts_tsc(void) {
  char name[32] = "";
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (!f) return 0;
  int ok = fgets(name, sizeof name, f) && strcmp(name, "tsc\n") == 0;
  fclose(f);
  return ok;
}

/* A (tick, ns) pair read as close together as possible. */
static void sample(uint64_t *tsc, uint64_t *ns) {
  uint64_t a = __builtin_ia32_rdtsc();
  *ns = ta_clock_gettime_ns();
  uint64_t b = __builtin_ia32_rdtsc();
  *tsc = a + (b - a) / 2;
}

static uint64_t ticks_for(uint64_t ns, uint64_t mult) { return (uint64_t)(((unsigned __int128)ns << 32) / mult); }

static void publish(uint64_t tsc0, uint64_t ns0, uint64_t mult, uint64_t refit_at) {
  ta_log_clock *c = &ta_clock;
  unsigned s = atomic_load_explicit(&c->seq, memory_order_relaxed);
  atomic_store_explicit(&c->seq, s + 1, memory_order_relaxed);
  /* Release stores: none becomes visible before the odd seq above. */
  atomic_store_explicit(&c->tsc0, tsc0, memory_order_release);
  atomic_store_explicit(&c->ns0, ns0, memory_order_release);
  atomic_store_explicit(&c->mult, mult, memory_order_release);
  atomic_store_explicit(&c->refit_at, refit_at, memory_order_release);
  atomic_store_explicit(&c->seq, s + 2, memory_order_release);
}

void ta_log_clock_start(void) {
  ta_log_clock *c = &ta_clock;
  c->use_tsc = kernel_trusts_tsc();
  if (!c->use_tsc) return;
  uint64_t tsc, ns;
  sample(&c->first_tsc, &c->first_ns);
  do sample(&tsc, &ns);
  while (ns - c->first_ns < FIRST_FIT_NS);
  if (tsc <= c->first_tsc) { /* the TSC did not move: do not trust it */
    c->use_tsc = 0;
    return;
  }
  uint64_t mult = (uint64_t)(((unsigned __int128)(ns - c->first_ns) << 32) / (tsc - c->first_tsc));
  c->interval = ticks_for(FIRST_REFIT_NS, mult);
  publish(tsc, ns, mult, tsc + c->interval);
}

void ta_log_clock_refit(void) {
  ta_log_clock *c = &ta_clock;
  if (atomic_flag_test_and_set_explicit(&c->refitting, memory_order_acquire)) return; /* another thread is at it */
  uint64_t tsc, ns;
  sample(&tsc, &ns);
  uint64_t tsc0 = atomic_load_explicit(&c->tsc0, memory_order_relaxed);
  uint64_t ns0 = atomic_load_explicit(&c->ns0, memory_order_relaxed);
  uint64_t mult = atomic_load_explicit(&c->mult, memory_order_relaxed);
  if (tsc > tsc0 && tsc > c->first_tsc && ns > c->first_ns) {
    uint64_t fitted = ns0 + (uint64_t)(((unsigned __int128)(tsc - tsc0) * mult) >> 32);
    /* The slope over the whole baseline; the new segment starts where the
     * old one is now, or at the true clock if that is later: never back. */
    mult = (uint64_t)(((unsigned __int128)(ns - c->first_ns) << 32) / (tsc - c->first_tsc));
    uint64_t max_interval = ticks_for(MAX_REFIT_NS, mult);
    c->interval = c->interval * 2 < max_interval ? c->interval * 2 : max_interval;
    publish(tsc, ns > fitted ? ns : fitted, mult, tsc + c->interval);
  }
  atomic_flag_clear_explicit(&c->refitting, memory_order_release);
}

#else

void ta_log_clock_start(void) { ta_clock.use_tsc = 0; }
void ta_log_clock_refit(void) {}

#endif
