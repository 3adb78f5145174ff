#include "accounting/observer.h"

_Atomic(torchalloc_segment_observer) ta_observer_fn;
_Atomic(void *) ta_observer_ctx;

void ta_observer_set(torchalloc_segment_observer fn, void *ctx) {
  atomic_store_explicit(&ta_observer_ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&ta_observer_fn, fn, memory_order_release); /* a reader that sees fn sees its ctx */
}
