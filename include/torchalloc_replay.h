/* torchalloc replay: drive a recorded allocation trace through one policy
 * on a private simulated device (no GPU, no process-wide state touched), for
 * `torchalloc replay`. Python fills the events from a numpy structured array
 * in one go; the loop runs in C. Exported by libtorchalloc.so beside the
 * plug-in API (torchalloc.h). */
#ifndef TORCHALLOC_REPLAY_H
#define TORCHALLOC_REPLAY_H

#include "torchalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  TORCHALLOC_REPLAY_ALLOC = 1,       /* addr gets `size` bytes on `stream` in `phase` */
  TORCHALLOC_REPLAY_FREE = 2,        /* addr is freed (an unknown addr is counted, not an error) */
  TORCHALLOC_REPLAY_PHASE_BEGIN = 3, /* a new occurrence of `phase` starts */
  TORCHALLOC_REPLAY_PHASE_END = 4,   /* that occurrence ends */
};

/* 32 bytes, naturally aligned, no implicit padding (numpy mirrors it). */
typedef struct torchalloc_replay_event {
  uint64_t addr;    /* the address in the trace: only its identity matters */
  uint64_t size;    /* requested bytes (alloc) */
  uint64_t stream;  /* stream id from the trace */
  uint16_t phase;   /* < TORCHALLOC_MAX_PHASES */
  uint8_t kind;     /* TORCHALLOC_REPLAY_* */
  uint8_t reserved_[5];
} torchalloc_replay_event;

/* Every field of torchalloc_replay_result, once, in struct order: X(kind,
 * name), kind `version` (an int64_t, TORCHALLOC_REPLAY_VERSION), `int64` or
 * `double`. The struct and torchalloc_replay_result_fields() are made from
 * it. Bump TORCHALLOC_REPLAY_VERSION whenever it changes; bindings check it. */
#define TORCHALLOC_REPLAY_VERSION 3
#define TORCHALLOC_REPLAY_RESULT_FIELDS(X)                                                                            \
  X(version, version)                                                                                                 \
  X(int64, events)                 /* events replayed: all of them, or up to and including the OOM one */             \
  X(int64, peak_allocated)         /* allocated_bytes peak (block bytes, as torch counts them) */                     \
  X(int64, peak_requested)         /* requested_bytes peak */                                                         \
  X(int64, peak_reserved)          /* reserved_bytes peak */                                                          \
  X(int64, peak_reserved_event)    /* index of the event that first reached it; -1 when nothing was reserved */       \
  X(int64, free_at_peak)           /* reserved minus active bytes at that event */                                    \
  X(int64, largest_free_at_peak)   /* largest free block at that event */                                             \
  X(double, fragmentation_at_peak) /* (free_at_peak - largest_free_at_peak) / free_at_peak; 0 when nothing is free */ \
  X(int64, device_allocs)          /* num_device_alloc */                                                             \
  X(int64, device_frees)           /* num_device_free */                                                              \
  X(int64, alloc_retries)          /* device said no, cached segments released, tried again */                        \
  X(int64, unknown_frees)          /* frees of addresses not live in the trace (ring buffer started mid-run) */       \
  X(int64, replaced_allocs)        /* allocs of an address still live in the trace: the old block is freed first */   \
  X(int64, oom)                    /* 1 when an allocation failed at `capacity` (the replay stopped there) */         \
  X(int64, oom_event)              /* index of that event, -1 when none */                                            \
  X(int64, oom_size)               /* the size it asked for */                                                        \
  X(int64, final_allocated)        /* allocated_bytes after the last event replayed */                                \
  X(int64, final_reserved)         /* reserved_bytes after the last event replayed */                                 \
  X(int64, synchronizes)           /* device synchronizes the policy made (num_synchronizes; version 2) */            \
  X(int64, handles_created)        /* num_handles_created, num_handles_moved, num_handles_released (version 3) */     \
  X(int64, handles_moved)                                                                                             \
  X(int64, handles_released)

#define TORCHALLOC_REPLAY_MEMBER_version(name) int64_t name;
#define TORCHALLOC_REPLAY_MEMBER_int64(name) int64_t name;
#define TORCHALLOC_REPLAY_MEMBER_double(name) double name;
#define TORCHALLOC_REPLAY_MEMBER(kind, name) TORCHALLOC_REPLAY_MEMBER_##kind(name)
typedef struct torchalloc_replay_result {
  TORCHALLOC_REPLAY_RESULT_FIELDS(TORCHALLOC_REPLAY_MEMBER)
} torchalloc_replay_result;
#undef TORCHALLOC_REPLAY_MEMBER
#undef TORCHALLOC_REPLAY_MEMBER_version
#undef TORCHALLOC_REPLAY_MEMBER_int64
#undef TORCHALLOC_REPLAY_MEMBER_double

/* Every field of torchalloc_replay_result in struct order, one line each:
 * "name\tkind\n" (TORCHALLOC_REPLAY_RESULT_FIELDS' kinds), for bindings
 * that build their mirror of the struct from it rather than copy it. */
TORCHALLOC_API const char *torchalloc_replay_result_fields(void);

TORCHALLOC_API size_t torchalloc_replay_event_size(void);
TORCHALLOC_API size_t torchalloc_replay_result_size(void);

/* Replay `n` events through `policy` on a fresh simulated device of
 * `capacity` bytes (0: unlimited). `policy` is a policy's name, for
 * ordinary segments, or the name with +expandable, +compact or +reclaim for
 * expandable:1, 2 or 3; either may end in "@DIVISIONS", PyTorch's
 * roundup_power2_divisions value ("caching+reclaim@4",
 * "caching@[256:1,>:8]"), to round requests as that option does; then
 * optionally settings after a comma in TORCHALLOC_CONF's syntax
 * ("caching+reclaim,handle:16MiB"). The device trails the trace by 1000 events (its
 * markers complete that late). Stops at the first allocation that fails
 * even after releasing cached segments (out->oom). `reserved_series` (may be
 * NULL) receives `series_len` samples: sample i is the highest reserved_bytes
 * seen over events [i*n/series_len, (i+1)*n/series_len); samples after an OOM
 * stay -1. Returns 0, or -1 for bad arguments or a malformed event, with the
 * reason in torchalloc_last_error(). */
TORCHALLOC_API int torchalloc_replay(const torchalloc_replay_event *events, size_t n, const char *policy,
                                     uint64_t capacity, torchalloc_replay_result *out, int64_t *reserved_series,
                                     size_t series_len);

/* The same replay fed in pieces, for a trace larger than memory: begin
 * (NULL with the reason in torchalloc_last_error() for an unknown policy or
 * bad arguments), feed the events in order in any number of calls, end.
 * `n_total` is how many events will be fed in all; it sets the buckets of
 * `reserved_series` (may be NULL, and n_total then anything). Feeding the
 * pieces gives what torchalloc_replay gives for them all at once; event
 * indices in the result and in messages count over everything fed. */
typedef struct torchalloc_replay_run torchalloc_replay_run;
TORCHALLOC_API torchalloc_replay_run *torchalloc_replay_begin(const char *policy, uint64_t capacity, size_t n_total,
                                                              int64_t *reserved_series, size_t series_len);
/* 0: go on; 1: an allocation failed at `capacity` and the replay stopped
 * (later events are ignored); -1: a malformed event or bad arguments (the
 * run is over: end it, which frees it and returns -1). */
TORCHALLOC_API int torchalloc_replay_feed(torchalloc_replay_run *run, const torchalloc_replay_event *events, size_t n);
/* The result into `out`, and `run` freed (always, also on error). 0 or -1. */
TORCHALLOC_API int torchalloc_replay_end(torchalloc_replay_run *run, torchalloc_replay_result *out);

#ifdef __cplusplus
}
#endif
#endif /* TORCHALLOC_REPLAY_H */
