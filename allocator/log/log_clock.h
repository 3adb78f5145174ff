/* Record timestamps: CLOCK_MONOTONIC nanoseconds, read cheaply.
 *
 * Why not clock_gettime per record: the vDSO reads the TSC behind an lfence,
 * which waits for every load in flight; inside the allocator that costs
 * about 20 ns a record on top of its own 18 ns, as much as the whole malloc.
 * A bare rdtsc is ~7 ns. Where the kernel itself trusts the TSC (clocksource
 * "tsc": invariant and synchronised across cores), ticks are scaled to
 * CLOCK_MONOTONIC with a factor fitted against clock_gettime, refitted at
 * growing intervals (1 ms, 2 ms, ... up to 100 ms) so the error stays far
 * below a microsecond; elsewhere every record calls clock_gettime.
 *
 * The scale is published with a sequence lock: a reader that sees an update
 * in flight falls back to clock_gettime for that one record. */
#ifndef TA_LOG_CLOCK_H
#define TA_LOG_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "base/common.h"

#if defined(__x86_64__)
#define TA_LOG_TSC 1
#else
#define TA_LOG_TSC 0
#endif

typedef struct ta_log_clock {
  atomic_uint seq;           /* odd while an update is being written */
  _Atomic uint64_t tsc0, ns0; /* a point of the fit */
  _Atomic uint64_t mult;     /* nanoseconds per tick, << 32 */
  _Atomic uint64_t refit_at; /* tick count of the next refit */
  int use_tsc;
  uint64_t first_tsc, first_ns; /* the fit's baseline: the longer it grows, the better the slope */
  uint64_t interval;            /* ticks until the next refit */
  atomic_flag refitting;
} ta_log_clock;

ta_internal extern ta_log_clock ta_clock;

/* Fit the scale from scratch (opening a log). */
ta_internal void ta_log_clock_start(void);
/* Refit, once the next refit point has passed (called by one reader). */
ta_internal void ta_log_clock_refit(void);

/* For tests. The clocks the fit samples (NULL, NULL: the TSC and
 * CLOCK_MONOTONIC); with fakes, ta_log_clock_start fits them whatever the
 * kernel's clocksource, and ta_log_clock_at says what a record stamped at
 * tick `tsc` would get (refitting first when due, as a writer would): the
 * fit is then checked without depending on the machine's scheduling. */
ta_internal void ta_log_clock_test_source(uint64_t (*tsc)(void), uint64_t (*ns)(void));
/* 0 when the fit is not in use (every record then reads clock_gettime). */
ta_internal uint64_t ta_log_clock_at(uint64_t tsc);
/* For tests: 1 makes ta_log_clock_start leave the TSC unused, so every
 * timestamp is a clock_gettime read inside the call that writes it. */
ta_internal void ta_log_clock_test_gettime_only(int on);

static inline uint64_t ta_log_clock_extrapolate(uint64_t tsc0, uint64_t ns0, uint64_t mult, uint64_t tsc) {
  return ns0 + (uint64_t)(((unsigned __int128)(tsc - tsc0) * mult) >> 32);
}

static inline uint64_t ta_log_now_ns(void) {
#if TA_LOG_TSC
  if (ta_likely(ta_clock.use_tsc)) {
    /* Acquire loads (plain moves on x86) keep the re-read of seq last. */
    unsigned s = atomic_load_explicit(&ta_clock.seq, memory_order_acquire);
    uint64_t tsc0 = atomic_load_explicit(&ta_clock.tsc0, memory_order_acquire);
    uint64_t ns0 = atomic_load_explicit(&ta_clock.ns0, memory_order_acquire);
    uint64_t mult = atomic_load_explicit(&ta_clock.mult, memory_order_acquire);
    uint64_t tsc = __builtin_ia32_rdtsc();
    if (ta_likely(!(s & 1) && atomic_load_explicit(&ta_clock.seq, memory_order_relaxed) == s && tsc >= tsc0)) {
      if (ta_unlikely(tsc >= atomic_load_explicit(&ta_clock.refit_at, memory_order_relaxed))) ta_log_clock_refit();
      return ta_log_clock_extrapolate(tsc0, ns0, mult, tsc);
    }
  }
#endif
  return ta_clock_gettime_ns();
}

#endif
