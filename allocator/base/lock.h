/* The locks, and their rules in a form the compiler checks.
 *
 * The heap lock (ta_lock): a test-and-test-and-set spin lock that yields
 * the CPU after a short spin. Why not pthread_mutex: the critical sections
 * here are ~50 ns, and glibc's mutex costs about as much again
 * uncontended, and parks a contending thread in the kernel (a futex round
 * trip of microseconds) where a brief spin would do. The rare long holder
 * (cudaMalloc, 30-50 us) makes waiters fall through to sched_yield rather
 * than burn a core.
 *
 * The runtime's lock (ta_mutex): a pthread mutex, for the rare work of
 * init, teardown, heap creation and the log's opening and closing.
 *
 * Both are capabilities of clang's thread-safety analysis (-Wthread-safety,
 * on in every clang build: CMakeLists.txt), which then checks at compile
 * time that each function releases what it takes, that a function marked
 * TA_REQUIRES(lock) is called with that lock held, and one marked
 * TA_EXCLUDES(lock), which takes it itself, without it (a spin lock taken
 * twice by one thread never returns). Data is held to its lock by
 * TA_GUARDED_BY where it is a variable of its own; a struct member cannot
 * name its struct's lock in C (clang 14 finds no such name), so the heap's
 * fields are held to h->lock by the functions that touch them, each marked
 * TA_REQUIRES(h->lock). Other compilers see none of it. */
#ifndef TA_LOCK_H
#define TA_LOCK_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/common.h"

#if defined(__clang__)
#define TA_THREAD_SAFETY(x) __attribute__((x))
#else
#define TA_THREAD_SAFETY(x)
#endif
#define TA_CAPABILITY(kind) TA_THREAD_SAFETY(capability(kind))
#define TA_ACQUIRE(...) TA_THREAD_SAFETY(acquire_capability(__VA_ARGS__))
#define TA_RELEASE(...) TA_THREAD_SAFETY(release_capability(__VA_ARGS__))
#define TA_TRY_ACQUIRE(...) TA_THREAD_SAFETY(try_acquire_capability(__VA_ARGS__))
#define TA_REQUIRES(...) TA_THREAD_SAFETY(requires_capability(__VA_ARGS__))
#define TA_EXCLUDES(...) TA_THREAD_SAFETY(locks_excluded(__VA_ARGS__))
#define TA_GUARDED_BY(lock) TA_THREAD_SAFETY(guarded_by(lock))
/* For the lock primitives themselves, and for the few functions that take
 * or leave a lock in a way the analysis cannot follow (each says why). */
#define TA_NO_THREAD_SAFETY_ANALYSIS TA_THREAD_SAFETY(no_thread_safety_analysis)

static inline void ta_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

typedef struct TA_CAPABILITY("mutex") ta_lock {
  atomic_bool held;
} ta_lock;

#define TA_LOCK_INIT {false}

/* The locks' functions are declared with their rules first, then defined:
 * the analysis does not look inside a lock's own functions. */
static inline void ta_lock_acquire(ta_lock *l) TA_ACQUIRE(*l);
/* One attempt, no wait: for callers that must not block (the exit path). */
static inline bool ta_lock_try(ta_lock *l) TA_TRY_ACQUIRE(true, *l);
static inline void ta_lock_release(ta_lock *l) TA_RELEASE(*l);

static inline void ta_lock_init(ta_lock *l) { atomic_init(&l->held, false); }

/* Exponential backoff keeps waiters off the lock's cache line while the
 * holder works; past the backoff cap a waiter yields the core. */
static ta_noinline TA_NO_THREAD_SAFETY_ANALYSIS void ta_lock_contended(ta_lock *l) {
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

static inline TA_NO_THREAD_SAFETY_ANALYSIS void ta_lock_acquire(ta_lock *l) {
  if (ta_unlikely(atomic_exchange_explicit(&l->held, true, memory_order_acquire))) ta_lock_contended(l);
}

static inline TA_NO_THREAD_SAFETY_ANALYSIS bool ta_lock_try(ta_lock *l) {
  return !atomic_load_explicit(&l->held, memory_order_relaxed) &&
         !atomic_exchange_explicit(&l->held, true, memory_order_acquire);
}

static inline TA_NO_THREAD_SAFETY_ANALYSIS void ta_lock_release(ta_lock *l) {
  atomic_store_explicit(&l->held, false, memory_order_release);
}

typedef struct TA_CAPABILITY("mutex") ta_mutex {
  pthread_mutex_t m;
} ta_mutex;

#define TA_MUTEX_INIT {PTHREAD_MUTEX_INITIALIZER}

static inline void ta_mutex_lock(ta_mutex *m) TA_ACQUIRE(*m);
/* One attempt, no wait: true when it is taken. */
static inline bool ta_mutex_try(ta_mutex *m) TA_TRY_ACQUIRE(true, *m);
static inline void ta_mutex_unlock(ta_mutex *m) TA_RELEASE(*m);

static inline TA_NO_THREAD_SAFETY_ANALYSIS void ta_mutex_lock(ta_mutex *m) { pthread_mutex_lock(&m->m); }

static inline TA_NO_THREAD_SAFETY_ANALYSIS bool ta_mutex_try(ta_mutex *m) { return pthread_mutex_trylock(&m->m) == 0; }

static inline TA_NO_THREAD_SAFETY_ANALYSIS void ta_mutex_unlock(ta_mutex *m) { pthread_mutex_unlock(&m->m); }

#endif
