/* The heap lock: a test-and-test-and-set spin lock that yields the CPU after
 * a short spin.
 *
 * Why not pthread_mutex: the critical sections here are ~50 ns, and glibc's
 * mutex costs about as much again uncontended, and parks a contending thread
 * in the kernel (a futex round trip of microseconds) where a brief spin would
 * do. The rare long holder (cudaMalloc, 30-50 us) makes waiters fall through
 * to sched_yield rather than burn a core. */
#ifndef TA_LOCK_H
#define TA_LOCK_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/common.h"

static inline void ta_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

typedef struct ta_lock {
  atomic_bool held;
} ta_lock;

#define TA_LOCK_INIT {false}

static inline void ta_lock_init(ta_lock *l) { atomic_init(&l->held, false); }

/* Exponential backoff keeps waiters off the lock's cache line while the
 * holder works; past the backoff cap a waiter yields the core. */
static ta_noinline void ta_lock_contended(ta_lock *l) {
  unsigned backoff = 1;
  for (unsigned rounds = 0;; rounds++) {
    if (!atomic_load_explicit(&l->held, memory_order_relaxed) &&
        !atomic_exchange_explicit(&l->held, true, memory_order_acquire))
      return;
    if (rounds >= 32) {
      sched_yield();
      continue;
    }
    for (unsigned i = 0; i < backoff; i++) ta_cpu_relax();
    if (backoff < 256) backoff *= 2;
  }
}

static inline void ta_lock_acquire(ta_lock *l) {
  if (ta_unlikely(atomic_exchange_explicit(&l->held, true, memory_order_acquire))) ta_lock_contended(l);
}

/* One attempt, no wait: for callers that must not block (the exit path). */
static inline bool ta_lock_try(ta_lock *l) {
  return !atomic_load_explicit(&l->held, memory_order_relaxed) &&
         !atomic_exchange_explicit(&l->held, true, memory_order_acquire);
}

static inline void ta_lock_release(ta_lock *l) { atomic_store_explicit(&l->held, false, memory_order_release); }

#endif
