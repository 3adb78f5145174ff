/* Growing arrays (common.h): the doubling, the overflow checks and the
 * realloc every growing array of the library shares. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

size_t ta_grown_capacity(size_t cap, size_t need, size_t first) {
  size_t n = cap ? cap : first;
  if (!n) return 0;
  while (n < need) {
    if (n > SIZE_MAX / 2) return 0;
    n *= 2;
  }
  return n;
}

/* `items` holds a T * of any T: read and written as bytes, the one
 * representation every object pointer has here, so that no T ** is ever
 * accessed as a void **. */
int ta_resize_array(void *items, size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return -1;
  void *old;
  memcpy(&old, items, sizeof old);
  void *grown = realloc(old, n * size);
  if (!grown) return -1;
  memcpy(items, &grown, sizeof grown);
  return 0;
}

int ta_grow_array(void *items, size_t *cap, size_t need, size_t first, size_t size) {
  if (need <= *cap) return 0;
  size_t n = ta_grown_capacity(*cap, need, first);
  if (!n || ta_resize_array(items, n, size)) return -1;
  *cap = n;
  return 0;
}
