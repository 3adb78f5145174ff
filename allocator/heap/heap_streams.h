/* record_stream and the frees it defers (heap_streams.c): a block freed
 * while other streams may still use it waits for their events. */
#ifndef TA_HEAP_STREAMS_H
#define TA_HEAP_STREAMS_H

#include "heap/heap_state.h"

/* 1 when `ptr` is a live block of this heap (and the use was recorded). */
ta_internal int ta_heap_record_stream(ta_heap *h, void *ptr, cudaStream_t stream) TA_EXCLUDES(h->lock);
ta_internal void ta_heap_report_bad_record_stream(ta_heap *h, void *ptr) TA_EXCLUDES(h->lock);

/* --- between the heap's files (caller holds h->lock) --- */

/* Record events on the streams that used `b` (record_stream); it is reused
 * when they complete. */
ta_internal void ta_heap_defer_free(ta_heap *h, ta_block *b) TA_REQUIRES(h->lock);
/* Hand back every pending block whose events have all completed. Not while
 * routing: querying events during a capture would invalidate it. */
ta_internal void ta_heap_process_pending(ta_heap *h) TA_REQUIRES(h->lock);
/* graph_capture_record_stream_reuse, routing: before a request on
 * `stream`, hand back every pending block of `stream` whose uses the
 * capture's graph orders before that stream's next work (heap_streams.c). */
ta_internal void ta_heap_reuse_in_capture(ta_heap *h, cudaStream_t stream) TA_REQUIRES(h->lock);
/* Routing ended: record the events of the frees that had to wait for it. */
ta_internal void ta_heap_record_deferred_events(ta_heap *h) TA_REQUIRES(h->lock);

#endif
