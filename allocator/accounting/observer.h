/* Segment observers: a function outside the core (the C++ bridge, which
 * keeps PyTorch's memory history) told of every device allocation and
 * release. The segment layer calls it under the heap lock, so it must be
 * quick, must not call torchalloc, and must not take the GIL. One at a
 * time; the log is the other way to watch, and costs nothing when off. */
#ifndef TA_OBSERVER_H
#define TA_OBSERVER_H

#include <stdatomic.h>

#include "base/common.h"
#include "torchalloc.h"

ta_internal extern _Atomic(torchalloc_segment_observer) ta_observer_fn;
ta_internal extern _Atomic(void *) ta_observer_ctx;

/* torchalloc_set_segment_observer: `fn` (NULL: none) from now on. */
ta_internal void ta_observer_set(torchalloc_segment_observer fn, void *ctx);

static inline void ta_observe_segment(int device, int event, uintptr_t addr, size_t size, cudaStream_t stream) {
  torchalloc_segment_observer fn = atomic_load_explicit(&ta_observer_fn, memory_order_acquire);
  if (ta_unlikely(fn != NULL))
    fn(atomic_load_explicit(&ta_observer_ctx, memory_order_relaxed), device, event, addr, size, (uintptr_t)stream);
}

#endif
