#include "accounting/observer.h"

_Atomic(torchalloc_segment_observer) ta_observer_fn;
_Atomic(void *) ta_observer_ctx;

TORCHALLOC_API void torchalloc_set_segment_observer(torchalloc_segment_observer fn, void *ctx) {
  atomic_store_explicit(&ta_observer_ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&ta_observer_fn, fn, memory_order_release); /* a reader that sees fn sees its ctx */
}
