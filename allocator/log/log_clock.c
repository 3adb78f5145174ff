/* Fitting TSC ticks to CLOCK_MONOTONIC for record timestamps (log_clock.h). */
#include "log/log_clock.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

ta_log_clock ta_clock = {.refitting = ATOMIC_FLAG_INIT};

static uint64_t (*fake_tsc)(void), (*fake_ns)(void); /* tests only */
static int gettime_only;                              /* tests only */

void ta_log_clock_test_source(uint64_t (*tsc)(void), uint64_t (*ns)(void)) {
  fake_tsc = tsc && ns ? tsc : NULL;
  fake_ns = tsc && ns ? ns : NULL;
}

void ta_log_clock_test_gettime_only(int on) { gettime_only = on; }

#if TA_LOG_TSC

static uint64_t read_tsc(void) { return fake_tsc ? fake_tsc() : __builtin_ia32_rdtsc(); }
static uint64_t read_ns(void) { return fake_ns ? fake_ns() : ta_clock_gettime_ns(); }

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

/* A (tick, ns) pair read as close together as possible: the narrowest of
 * a few tries. A thread preempted (or a virtual CPU descheduled) between
 * the readings gets a pair off by up to the interruption, and a fit made
 * from it runs fast or slow by as much; such a pair's readings lie far
 * apart in ticks, so it is not used. 0 when every try was interrupted. */
#define SAMPLE_TRIES 8
#define SAMPLE_MAX_TICKS 8192 /* 2-8 us: a clean pair takes ~100 ticks, an interruption at least tens of us */
static int sample(uint64_t *tsc, uint64_t *ns) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < SAMPLE_TRIES; i++) {
    uint64_t a = read_tsc();
    uint64_t n = read_ns();
    uint64_t b = read_tsc();
    if (b >= a && b - a < best) {
      best = b - a;
      *tsc = a + (b - a) / 2;
      *ns = n;
    }
  }
  return best <= SAMPLE_MAX_TICKS;
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
  c->use_tsc = !gettime_only && (fake_tsc || kernel_trusts_tsc());
  if (!c->use_tsc) return;
  uint64_t tsc, ns;
  int clean = sample(&c->first_tsc, &c->first_ns);
  do clean = clean && sample(&tsc, &ns);
  while (clean && ns - c->first_ns < FIRST_FIT_NS);
  if (!clean || tsc <= c->first_tsc) { /* no pair to trust, or the TSC did not move: clock_gettime it is */
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
  int clean = sample(&tsc, &ns);
  uint64_t tsc0 = atomic_load_explicit(&c->tsc0, memory_order_relaxed);
  uint64_t ns0 = atomic_load_explicit(&c->ns0, memory_order_relaxed);
  uint64_t mult = atomic_load_explicit(&c->mult, memory_order_relaxed);
  if (!clean) { /* try again a little later (an eighth of the interval) with the fit as it is */
    if (tsc > tsc0) publish(tsc0, ns0, mult, tsc + c->interval / 8);
  } else if (tsc > tsc0 && tsc > c->first_tsc && ns > c->first_ns) {
    uint64_t fitted = ta_log_clock_extrapolate(tsc0, ns0, mult, tsc);
    /* The slope over the whole baseline. The new segment starts where the
     * old one is now, or at the true clock if that is later: never back. */
    mult = (uint64_t)(((unsigned __int128)(ns - c->first_ns) << 32) / (tsc - c->first_tsc));
    uint64_t max_interval = ticks_for(MAX_REFIT_NS, mult);
    c->interval = c->interval * 2 < max_interval ? c->interval * 2 : max_interval;
    uint64_t start = ns > fitted ? ns : fitted, slope = mult;
    if (start > ns) {
      /* Ahead of the clock (the last fit ran fast): slow down to meet it at
       * the next refit. Kept at the true slope, the lead would stay for
       * the rest of the run, since a timestamp never goes back. */
      uint64_t span = (uint64_t)(((unsigned __int128)c->interval * mult) >> 32); /* ns until the next refit */
      uint64_t ahead = start - ns;
      slope = ahead < span ? (uint64_t)(((unsigned __int128)(span - ahead) << 32) / c->interval) : 0;
    }
    publish(tsc, start, slope, tsc + c->interval);
  }
  atomic_flag_clear_explicit(&c->refitting, memory_order_release);
}

/* As ta_log_now_ns: the fit as it stood when the tick was read, and a refit after, when due. */
uint64_t ta_log_clock_at(uint64_t tsc) {
  ta_log_clock *c = &ta_clock;
  if (!c->use_tsc) return 0;
  uint64_t tsc0 = atomic_load(&c->tsc0), ns0 = atomic_load(&c->ns0), mult = atomic_load(&c->mult);
  if (tsc < tsc0) return ns0;
  if (tsc >= atomic_load(&c->refit_at)) ta_log_clock_refit();
  return ta_log_clock_extrapolate(tsc0, ns0, mult, tsc);
}

#else

void ta_log_clock_start(void) { ta_clock.use_tsc = 0; }
void ta_log_clock_refit(void) {}
uint64_t ta_log_clock_at(uint64_t tsc) {
  (void)tsc;
  return 0;
}

#endif
