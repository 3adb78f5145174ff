/* The arena's stream entries (arena_streams.c): found by a hash of the
 * stream, made on a stream's first request, dropped with its last segment.
 * For arena.c alone. */
#ifndef TA_ARENA_STREAMS_H
#define TA_ARENA_STREAMS_H

#include "arena.h"

/* A new (empty) entry for `stream`, made the last one used; NULL without host memory. */
ta_internal ta_stream_bins *ta_arena_add_stream(ta_arena *a, cudaStream_t stream);
/* The index of `stream`'s entry; a->nstreams when it has none. */
ta_internal size_t ta_arena_find_stream(const ta_arena *a, cudaStream_t stream);
/* A stream that got bins but no segment (the device said no) leaves none behind. */
ta_internal void ta_arena_drop_if_unused(ta_arena *a, cudaStream_t stream);
/* `s` joins the arena's list of its segments and counts on its stream's entry. */
ta_internal void ta_arena_own(ta_arena *a, ta_segment *s);
/* `s` leaves the list; its stream's entry goes with its last segment. */
ta_internal void ta_arena_disown(ta_arena *a, ta_segment *s);

#endif
