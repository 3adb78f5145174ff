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

/* Growing arrays (base/grow.c). An array is a pointer `T *items` and its
 * capacity `size_t cap`; `items` below is the address of that pointer (any
 * T **), so the element size comes from its type. Each returns 0, or -1
 * when host memory runs out or the bytes would overflow size_t, and then
 * leaves the array and its capacity as they were. */

/* Room for `need` elements: the capacity doubled, from `first` when the
 * array has none, until it holds them (nothing when it does already). */
#define ta_grow(items, cap, need, first) ta_grow_array((items), (cap), (need), (first), sizeof **(items))
/* The array reallocated to exactly `n` elements (several arrays kept at
 * one capacity, ta_grown_capacity's). */
#define ta_resize(items, n) ta_resize_array((items), (n), sizeof **(items))
/* The capacity ta_grow gives an array of capacity `cap` for `need`
 * elements (`cap` itself when it holds them); 0 when it would overflow. */
ta_internal size_t ta_grown_capacity(size_t cap, size_t need, size_t first);
ta_internal int ta_grow_array(void *items, size_t *cap, size_t need, size_t first, size_t size);
ta_internal int ta_resize_array(void *items, size_t n, size_t size);

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
