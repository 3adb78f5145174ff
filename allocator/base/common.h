/* Small helpers every translation unit uses. */
#ifndef TA_COMMON_H
#define TA_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "torchalloc.h"

#define ta_likely(x) __builtin_expect(!!(x), 1)
#define ta_unlikely(x) __builtin_expect(!!(x), 0)
#define ta_noinline __attribute__((noinline))
#define ta_internal __attribute__((visibility("hidden")))

#define TA_KiB ((size_t)1 << 10)
#define TA_MiB ((size_t)1 << 20)
#define TA_GiB ((size_t)1 << 30)

/* Internal invariants: on in debug builds (TA_DEBUG=1), compiled out otherwise. */
#if defined(TA_DEBUG) && TA_DEBUG
#include <assert.h>
#define ta_assert(x) assert(x)
#else
#define ta_assert(x) ((void)0)
#endif

/* Larger requests are bad input (torchalloc.h): a policy may round a request
 * up by at most 2 MiB, so anything below this rounds without overflowing
 * (policies/parts/bins.h checks that its bins reach this far). */
#define TA_MAX_REQUEST ((size_t)TORCHALLOC_MAX_REQUEST)

static inline size_t ta_align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* A stream's bucket in an open-addressing index of `mask + 1` slots (a power
 * of two): Fibonacci hashing, the product's high half, since streams are
 * pointers whose low bits repeat. */
static inline size_t ta_stream_home(const void *stream, size_t mask) {
  return (size_t)(((uint64_t)(uintptr_t)stream * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & mask;
}

/* CLOCK_MONOTONIC in nanoseconds (the log's timestamps, time_calls, the move budget). */
static inline uint64_t ta_clock_gettime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Results of device calls (backend.h) and of the segment layer's services
 * (segments/services.h). TA_ENOSPACE: an expandable segment's address range is used up
 * (not the device: an ordinary segment may still fit). */
enum ta_status { TA_OK = 0, TA_ENOMEM = 1, TA_EDEVICE = 2, TA_ENOSPACE = 3 };

#endif
