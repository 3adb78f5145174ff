/* host_faults.h: the linker sends calloc, malloc and realloc here
 * (-Wl,--wrap=NAME makes a call to NAME call __wrap_NAME, and __real_NAME
 * the library's). */
#include "host_faults.h"

#include <stddef.h>

void *__real_calloc(size_t n, size_t size);
void *__real_malloc(size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_realloc(void *p, size_t size);

static long countdown, refused;

void host_fail_in(long n) { countdown = n; }

long host_failures(void) { return refused; }

/* 1 when this allocation is the one armed to fail. */
static int refuse(void) {
  if (countdown <= 0 || --countdown > 0) return 0;
  refused++;
  return 1;
}

void *__wrap_calloc(size_t n, size_t size) { return refuse() ? NULL : __real_calloc(n, size); }

void *__wrap_malloc(size_t size) { return refuse() ? NULL : __real_malloc(size); }

void *__wrap_realloc(void *p, size_t size) { return refuse() ? NULL : __real_realloc(p, size); }
