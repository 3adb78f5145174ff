/* torchalloc — a CUDA memory allocator for PyTorch that explains itself.
 *
 * The plug-in API: what PyTorch's pluggable allocator, the C++ bridge and a
 * user's program call. The same library exports the tools' entry points,
 * each declared in a header of its own: torchalloc_replay.h (a trace through
 * a policy on a private simulated device), torchalloc_oom.h (an
 * out-of-memory failure in numbers: facts, verdict, advice) and
 * torchalloc_sim.h (the simulated device's models, for tests and fuzzers).
 * Every exported symbol starts with `torchalloc_`. PyTorch loads the
 * library with
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "torchalloc_malloc", "torchalloc_free")
 * and casts those two symbols to exactly the signatures below.
 *
 * The header needs no CUDA install: `cudaStream_t` is declared exactly as
 * CUDA's driver_types.h declares it (C11 allows the identical typedef twice).
 */
#ifndef TORCHALLOC_H
#define TORCHALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cudaStream_t;

#define TORCHALLOC_API __attribute__((visibility("default")))

/* ---------------------------------------------------------------------------
 * The two entry points PyTorch calls.
 * ------------------------------------------------------------------------- */

/* Size 0 returns NULL. On device OOM (after releasing cached segments and
 * retrying once) counts `num_ooms`, then: with TORCHALLOC_CONF oom:null
 * (the default on the simulated device) returns NULL; with oom:abort (the
 * default on a real GPU, where this is PyTorch's plain pluggable route and
 * a NULL would become a tensor that kills the CUDA context) prints why and
 * stops the process. The same for a bad device or an absurd size, and, with
 * oom:abort, for a request made while `stream` captures a CUDA graph (that
 * route cannot keep the graph's memory private; the C++ bridge can). */
TORCHALLOC_API void *torchalloc_malloc(size_t size, int device, cudaStream_t stream);

/* `size` is the size originally requested, `stream` the allocation stream.
 * Misuse (unknown pointer, double free, size or stream mismatch) is reported
 * once per kind on stderr, counted in the stats, and never touches live
 * blocks.
 *
 * What cannot be detected: a stale free (a double free, or a free by a
 * holder who lost ownership) of an address that has since been handed out
 * again with the same size on the same stream frees the new block. PyTorch
 * gives a free only the pointer, size, device and stream, and the DataPtr
 * context must equal the pointer, so no generation tag can travel with it:
 * such a call is indistinguishable from the new owner's own free. A stale
 * free whose size or stream differs from the new block's is refused
 * (num_bad_free_size, num_bad_free_stream) and the block stays allocated;
 * one that arrives while the address is free is a counted double free. */
TORCHALLOC_API void torchalloc_free(void *ptr, size_t size, int device, cudaStream_t stream);

/* For callers that handle failure themselves (the C++ bridge raises
 * torch.OutOfMemoryError): NULL on any failure, whatever `oom` says. */
/* Larger requests are refused as bad input (num_bad_size), not as out of
 * memory: no device has a terabyte (1 TiB less the 2 MiB a policy may round
 * a request up by). */
#define TORCHALLOC_MAX_REQUEST ((((size_t)1) << 40) - ((size_t)2 << 20))
TORCHALLOC_API void *torchalloc_try_malloc(size_t size, int device, cudaStream_t stream);

/* Free by pointer alone, as PyTorch's raw_delete does: the block knows its
 * device, size and stream. 0, or -1 (reported and counted as misuse) when
 * `ptr` is not a live block. */
TORCHALLOC_API int torchalloc_free_ptr(void *ptr);

/* ---------------------------------------------------------------------------
 * Configuration. Syntax of TORCHALLOC_CONF: comma-separated key:value, e.g.
 *   policy:caching,backend:sim,sim_capacity:80GiB
 * Keys are listed in README.md and by torchalloc_config_keys() and
 * torchalloc_config_help() (`torchalloc info --keys`).
 * ------------------------------------------------------------------------- */

/* (Re)initialise from `conf` (NULL: from TORCHALLOC_CONF). Fails, leaving the
 * current state as it is, while any device holds live blocks. Returns 0, or
 * -1 with the reason in torchalloc_last_error(). */
TORCHALLOC_API int torchalloc_init(const char *conf);

/* Release every segment of every device and forget all state, live blocks
 * included (for tests and tools; PyTorch must not hold our pointers). */
TORCHALLOC_API void torchalloc_teardown(void);

/* Why the last failing control call failed, or why TORCHALLOC_CONF was
 * rejected; "" when nothing failed. Thread-local. */
TORCHALLOC_API const char *torchalloc_last_error(void);

/* A space-separated list of the keys TORCHALLOC_CONF accepts. */
TORCHALLOC_API const char *torchalloc_config_keys(void);

/* Every key described by the parser's own table, one line each, in the
 * order of torchalloc_config_keys: "key\tvalues\tdefault\thelp\n". `values`
 * is worded as a bad value's error message words what the key expects;
 * `default` is the value an unset key takes ("none": the key is off). */
TORCHALLOC_API const char *torchalloc_config_help(void);

/* Number of devices the backend exposes (initialises on first use). */
TORCHALLOC_API int torchalloc_device_count(void);

/* ---------------------------------------------------------------------------
 * Policies. New requests go to the current policy; a live block is always
 * freed to the policy (and arena) that made it.
 * ------------------------------------------------------------------------- */

TORCHALLOC_API int torchalloc_set_policy(const char *name);
TORCHALLOC_API const char *torchalloc_policy_name(void);
/* A PyTorch allocator settings string (PYTORCH_CUDA_ALLOC_CONF's syntax, what
 * torch.cuda.memory._set_allocator_settings takes), already accepted by
 * PyTorch: roundup_power2_divisions takes effect for every request from now
 * on, and, as in PyTorch, goes back to none when the string does not name
 * it; keys that configure only PyTorch's allocator are skipped. 0, or -1 with
 * torchalloc_last_error (nothing changed). */
TORCHALLOC_API int torchalloc_set_allocator_settings(const char *settings);
/* Every policy's name, space-separated, in id order (the id a log record's
 * `policy` field holds). */
TORCHALLOC_API const char *torchalloc_policy_names(void);

/* ---------------------------------------------------------------------------
 * Stats, named and defined as in torch.cuda.memory_stats().
 * ------------------------------------------------------------------------- */

enum { TORCHALLOC_POOL_ALL = 0, TORCHALLOC_POOL_SMALL = 1, TORCHALLOC_POOL_LARGE = 2, TORCHALLOC_NPOOLS = 3 };

typedef struct torchalloc_stat {
  int64_t current, peak, allocated, freed;
} torchalloc_stat;

/* Every field of torchalloc_stats, once, in struct order: X(kind, name).
 * The kinds: `version` (an int64_t, TORCHALLOC_STATS_VERSION); `pooled` (a
 * torchalloc_stat per pool, indexed by TORCHALLOC_POOL_*); `torch`, `misuse`
 * and `torchalloc` (int64_t counters: ones torch has too, misuse, and
 * others torch does not have). torchalloc_reset_accumulated_stats zeroes
 * the pooled stats' allocated and freed and the torch and torchalloc
 * counters, not the misuse ones. The struct below, torchalloc_stats_fields()
 * and the library's code that walks every field are made from this list.
 * Bump TORCHALLOC_STATS_VERSION whenever it changes; bindings check it. */
#define TORCHALLOC_STATS_VERSION 4
#define TORCHALLOC_STATS_FIELDS(X)                                                                  \
  X(version, version)                                                                               \
  X(pooled, allocation)                                                                             \
  X(pooled, segment)                                                                                \
  X(pooled, active)                                                                                 \
  X(pooled, inactive_split)                                                                         \
  X(pooled, allocated_bytes)                                                                        \
  X(pooled, reserved_bytes)                                                                         \
  X(pooled, active_bytes)                                                                           \
  X(pooled, inactive_split_bytes)                                                                   \
  X(pooled, requested_bytes)                                                                        \
  X(torch, num_alloc_retries)                                                                       \
  X(torch, num_ooms)                                                                                \
  X(torch, num_device_alloc)                                                                        \
  X(torch, num_device_free)                                                                         \
  /* Misuse counters (not in torch): each kind is printed once, counted always. */                  \
  X(misuse, num_bad_free_unknown) /* pointer torchalloc never handed out */                         \
  X(misuse, num_bad_double_free)  /* pointer already freed */                                       \
  X(misuse, num_bad_free_size)    /* size differs from the allocation's: ignored */                 \
  X(misuse, num_bad_size)         /* absurd request, e.g. (size_t)-1 */                             \
  X(misuse, num_bad_device)       /* device index out of range (process-wide) */                    \
  X(misuse, num_bad_free_stream)  /* stream differs from the allocation's: ignored (version 2) */   \
  /* Device synchronizes torchalloc made (releasing cached memory, an OOM's                         \
   * retry, compact's unmapping); the reclaim mode makes none to allocate                           \
   * (version 3; the bridge answers torch's num_sync_all_streams with it). */                       \
  X(torchalloc, num_synchronizes)                                                                   \
  /* Physical handles of expandable segments (version 4): made and mapped,                          \
   * moved (mapped at a new address: reclaim's donors and lent granules),                           \
   * released to the device. Each move costs the host an unmap, a map and                           \
   * a set-access call (BENCHMARKS.md). */                                                          \
  X(torchalloc, num_handles_created)                                                                \
  X(torchalloc, num_handles_moved)                                                                  \
  X(torchalloc, num_handles_released)                                                               \
  /* Requests for which reclaim declined to move memory under the move                              \
   * budget (TORCHALLOC_CONF move_time) and grew the reserve instead. */                            \
  X(torchalloc, num_moves_declined)                                                                 \
  /* Host nanoseconds inside torchalloc's malloc and free entry points, and                         \
   * the calls timed: counted only under TORCHALLOC_CONF time_calls:1 (two                          \
   * clock reads a call), else 0. */                                                                \
  X(torchalloc, host_ns)                                                                            \
  X(torchalloc, timed_calls)

#define TORCHALLOC_STATS_MEMBER_version(name) int64_t name;
#define TORCHALLOC_STATS_MEMBER_pooled(name) torchalloc_stat name[TORCHALLOC_NPOOLS];
#define TORCHALLOC_STATS_MEMBER_torch(name) int64_t name;
#define TORCHALLOC_STATS_MEMBER_misuse(name) int64_t name;
#define TORCHALLOC_STATS_MEMBER_torchalloc(name) int64_t name;
#define TORCHALLOC_STATS_MEMBER(kind, name) TORCHALLOC_STATS_MEMBER_##kind(name)
typedef struct torchalloc_stats {
  TORCHALLOC_STATS_FIELDS(TORCHALLOC_STATS_MEMBER)
} torchalloc_stats;
#undef TORCHALLOC_STATS_MEMBER
#undef TORCHALLOC_STATS_MEMBER_version
#undef TORCHALLOC_STATS_MEMBER_pooled
#undef TORCHALLOC_STATS_MEMBER_torch
#undef TORCHALLOC_STATS_MEMBER_misuse
#undef TORCHALLOC_STATS_MEMBER_torchalloc

/* Every field of torchalloc_stats in struct order, one line each:
 * "name\tkind\n" (TORCHALLOC_STATS_FIELDS' kinds), for bindings that build
 * their mirror of the struct from it rather than copy it. The library makes
 * such a list from its X-macro list with TORCHALLOC_FIELD_LINE. */
#define TORCHALLOC_FIELD_LINE(kind, name) #name "\t" #kind "\n"
TORCHALLOC_API const char *torchalloc_stats_fields(void);

TORCHALLOC_API size_t torchalloc_stats_size(void);
TORCHALLOC_API int torchalloc_get_stats(int device, torchalloc_stats *out);
TORCHALLOC_API int torchalloc_reset_peak_stats(int device);
TORCHALLOC_API int torchalloc_reset_accumulated_stats(int device);

/* Release every fully free cached segment of `device` (-1: all devices), as
 * torch.cuda.empty_cache() does. Returns the bytes released, or -1. */
TORCHALLOC_API int64_t torchalloc_empty_cache(int device);

/* ---------------------------------------------------------------------------
 * Hooks PyTorch calls through CUDAPluggableAllocator (set_*_fn).
 * ------------------------------------------------------------------------- */

/* set_record_stream_fn: `ptr` is also used on `stream`; when it is freed,
 * it is reused only after the work queued on `stream` so far completes. */
TORCHALLOC_API void torchalloc_record_stream(void *ptr, cudaStream_t stream);
/* set_memory_fraction_fn: cap what torchalloc reserves on `device` at
 * `fraction` of its total memory (0 < fraction <= 1). */
TORCHALLOC_API void torchalloc_set_memory_fraction(double fraction, int device);
/* set_reset_fn (torch.cuda.empty_cache()): release cached segments everywhere. */
TORCHALLOC_API void torchalloc_reset(void);
/* set_init_fn: PyTorch passes the number of devices; prepare their heaps. */
TORCHALLOC_API void torchalloc_init_devices(int device_count);

/* Walk every segment and block of `device` and verify the allocator's
 * invariants (blocks tile segments, no overlap, stats equal a recount).
 * Returns 0, or -1 with a description in torchalloc_last_error(). */
TORCHALLOC_API int torchalloc_check_invariants(int device);

/* ---------------------------------------------------------------------------
 * Phases. The current phase is process-wide (the autograd engine allocates
 * on its own threads on behalf of the main thread's phase). Phases nest; the
 * innermost wins. Before any is named, blocks belong to phase 0, "default".
 * With several threads entering phases, the innermost is the one entered
 * last and not yet left, whichever thread entered it: every allocation, on
 * any thread, belongs to it. A phase entered with torchalloc_phase_enter
 * is left by its token, even when phases entered later (on other threads)
 * are still open; torchalloc_phase_end only leaves the innermost.
 * ------------------------------------------------------------------------- */

#define TORCHALLOC_MAX_PHASES 256
#define TORCHALLOC_PHASE_NAME_MAX 63

/* Enter phase `name` (interned on first use). Returns its id, or -1. */
TORCHALLOC_API int torchalloc_phase_begin(const char *name);
/* Leave the innermost phase; `name` (may be NULL) must match it. 0 or -1. */
TORCHALLOC_API int torchalloc_phase_end(const char *name);
/* Enter phase `name` of `len` bytes (a NUL inside is refused, not cut at)
 * and return a token naming this occurrence (> 0), or -1. */
TORCHALLOC_API int64_t torchalloc_phase_enter(const char *name, size_t len);
/* Leave the occurrence `token` names, wherever it is among the open
 * phases; the innermost of the rest becomes current. 0, or -1 when it is
 * not open (left already, or not a token). */
TORCHALLOC_API int torchalloc_phase_leave(int64_t token);
TORCHALLOC_API int torchalloc_phase_current(void);
/* Id of `name` (interning it), or -1 when the table is full / name invalid. */
TORCHALLOC_API int torchalloc_phase_id(const char *name);
/* Name of phase `id`, or NULL. */
TORCHALLOC_API const char *torchalloc_phase_name(int id);
TORCHALLOC_API int torchalloc_phase_count(void);

/* Every field of torchalloc_phase_stats, once, in struct order: X(int64,
 * name), each an int64_t. The struct and torchalloc_phase_stats_fields()
 * are made from it. */
#define TORCHALLOC_PHASE_STATS_FIELDS(X)                                                              \
  X(int64, occurrences)             /* times the phase ended (process-wide) */                        \
  X(int64, allocated_bytes)         /* block bytes requested while the phase was current */           \
  X(int64, allocated_count)                                                                           \
  X(int64, freed_bytes)             /* block bytes freed while the phase was current */               \
  X(int64, freed_count)                                                                               \
  X(int64, live_bytes)              /* bytes of blocks allocated in this phase, still live */         \
  X(int64, live_peak_bytes)         /* high-water mark of live_bytes */                               \
  X(int64, peak_allocated_bytes)    /* device allocated_bytes high-water mark while current */        \
  X(int64, reserved_growth_bytes)   /* device allocations made for its requests */                    \
  X(int64, reserved_released_bytes) /* device memory released while it was current */                 \
  X(int64, last_persistent_bytes)   /* at its last end: allocated in that occurrence, still live */   \
  X(int64, last_transient_bytes)    /* at its last end: allocated and freed within that occurrence */

#define TORCHALLOC_PHASE_STATS_MEMBER(kind, name) int64_t name;
typedef struct torchalloc_phase_stats {
  TORCHALLOC_PHASE_STATS_FIELDS(TORCHALLOC_PHASE_STATS_MEMBER)
} torchalloc_phase_stats;
#undef TORCHALLOC_PHASE_STATS_MEMBER

/* Every field of torchalloc_phase_stats in struct order, one line each:
 * "name\tint64\n", as torchalloc_stats_fields lists its struct's. */
TORCHALLOC_API const char *torchalloc_phase_stats_fields(void);

TORCHALLOC_API int torchalloc_get_phase_stats(int device, int phase, torchalloc_phase_stats *out);

/* phase_arena only: bytes reserved by the arena of `phase`, and releasing
 * its fully free segments (phase -1: every arena). -1 on error. */
TORCHALLOC_API int64_t torchalloc_arena_reserved(int device, int phase);
TORCHALLOC_API int64_t torchalloc_arena_trim(int device, int phase);

/* ---------------------------------------------------------------------------
 * Private pools: the memory of CUDA graphs and torch.cuda.MemPool, as
 * PyTorch's allocator keeps it (the C++ bridge maps PyTorch's calls here).
 * A pool is named by PyTorch's MempoolId_t pair (id0, id1). Its blocks come
 * only from its own segments, and those go back to the device only after
 * its last user released it (a captured graph replays into them).
 * ------------------------------------------------------------------------- */

/* Create the pool or add a user (createOrIncrefPool, beginAllocateToPool).
 * The use count, or -1. */
TORCHALLOC_API int torchalloc_pool_retain(int device, uint64_t id0, uint64_t id1);
/* Take a user away (releasePool); at 0 the pool's cached segments are
 * released at the next empty_cache. The use count left, or -1 (no such pool). */
TORCHALLOC_API int torchalloc_pool_release(int device, uint64_t id0, uint64_t id1);
/* The use count, or -1 when there is no such pool. */
TORCHALLOC_API int torchalloc_pool_use_count(int device, uint64_t id0, uint64_t id1);
/* torchalloc_try_malloc from the pool (created if it does not exist). */
TORCHALLOC_API void *torchalloc_pool_malloc(size_t size, int device, cudaStream_t stream, uint64_t id0,
                                           uint64_t id1);
/* The addresses of the pool's live blocks, at most `cap` of them into
 * `addrs`; returns how many there are, or -1 when there is no such pool. */
TORCHALLOC_API int64_t torchalloc_pool_live_blocks(int device, uint64_t id0, uint64_t id1, uint64_t *addrs,
                                                   size_t cap);
/* Release a released pool's free segments now. Bytes released, -1: no pool. */
TORCHALLOC_API int64_t torchalloc_pool_empty(int device, uint64_t id0, uint64_t id1);

/* A pool with its own allocator (torch.cuda.MemPool(allocator=...): NCCL's
 * registered buffers, symmetric memory, managed memory). Its segments come
 * from `alloc` and go back through `free` instead of the device; torchalloc
 * still carves them into blocks, caches, counts and logs them, and the
 * memory fraction caps them as any other. Both are called with torchalloc's
 * lock held, so they must not allocate through torchalloc. `alloc` returns
 * NULL when it cannot (the request then fails as out of memory). Once the
 * pool is gone and its last segment freed, `release` (may be NULL) says
 * `ctx` is no longer used. */
typedef struct torchalloc_pool_source {
  void *(*alloc)(void *ctx, size_t size, int device, cudaStream_t stream);
  void (*free)(void *ctx, void *ptr, size_t size, int device, cudaStream_t stream);
  void (*release)(void *ctx);
  void *ctx;
} torchalloc_pool_source;

/* torchalloc_pool_retain for a pool whose segments come from `source`
 * (copied; NULL: the device, as torchalloc_pool_retain). A pool that exists
 * already keeps its source: -1 when `source` is not NULL then (the caller
 * keeps ctx). The use count, or -1. */
TORCHALLOC_API int torchalloc_pool_create(int device, uint64_t id0, uint64_t id1,
                                          const torchalloc_pool_source *source);

/* How a pool serves requests (torchalloc_pool_flags), as PyTorch's
 * MemPool(use_on_oom=..., no_split=...):
 *   USE_ON_OOM: a request outside any pool that the device cannot serve
 *     takes a free cached block of this pool instead (never a new segment
 *     of it), while the pool has users;
 *   NO_SPLIT: each block is a whole segment of its own, never split. */
#define TORCHALLOC_POOL_USE_ON_OOM 1u
#define TORCHALLOC_POOL_NO_SPLIT 2u
/* Turn the pool's flags of `set` on, then those of `clear` off (0, 0: just
 * read them). Its flags now, or -1 when there is no such pool. */
TORCHALLOC_API int torchalloc_pool_flags(int device, uint64_t id0, uint64_t id1, unsigned set, unsigned clear);

/* A beginAllocateToPool context opens / closes on `device`. While any is
 * open, torchalloc never synchronizes, queries or records an event (each
 * would invalidate a CUDA graph capture): cached memory is not released,
 * and frees of blocks used on other streams wait until the last closes.
 * 0, or -1 (bad device, or no context open). */
TORCHALLOC_API int torchalloc_routing_begin(int device);
TORCHALLOC_API int torchalloc_routing_end(int device);

/* ---------------------------------------------------------------------------
 * Inspection: segments and blocks as they are now, stacks, the last OOM.
 * ------------------------------------------------------------------------- */

enum { TORCHALLOC_BLOCK_FREE = 0, TORCHALLOC_BLOCK_LIVE = 1, TORCHALLOC_BLOCK_PENDING = 2 };

typedef struct torchalloc_segment_info {
  uint64_t addr, size;
  uint64_t stream;
  uint64_t pool_id[2];  /* private pool; {0, 0}: the default pool */
  uint64_t first_block; /* index of its first block in the block array */
  uint32_t nblocks;
  uint8_t pool;         /* TORCHALLOC_POOL_SMALL or TORCHALLOC_POOL_LARGE */
  uint8_t policy;       /* registry id (torchalloc_policy_names order) */
  uint8_t expandable;   /* 1: a stretch of mapped granules of an expandable segment */
  uint8_t reserved_;
} torchalloc_segment_info;

typedef struct torchalloc_block_info {
  uint64_t addr, size;
  uint64_t requested;   /* bytes asked for; a free block: its last request's, as PyTorch shows (0: none) */
  uint32_t stack;       /* allocation stack id (stacks:1 with a log open), 0: none */
  uint16_t phase;
  uint8_t state;        /* TORCHALLOC_BLOCK_* */
  uint8_t reserved_;
} torchalloc_block_info;

/* Every segment of `device` in address order, each followed in `blocks` by
 * its blocks in address order (they tile it). An expandable segment shows
 * as one segment per stretch of its mapped granules, as PyTorch's snapshot
 * shows its own (the sizes add up to the reserved bytes), its free blocks
 * cut at a stretch's ends; addresses whose memory serves elsewhere now
 * (reclaim) are in none. Fills at most the capacities;
 * *nsegments / *nblocks receive the counts needed. 0 when everything fit,
 * 1 when the arrays were too small (call again with the counts), -1 error. */
TORCHALLOC_API int torchalloc_snapshot(int device, torchalloc_segment_info *segments, size_t segments_cap,
                                       torchalloc_block_info *blocks, size_t blocks_cap, size_t *nsegments,
                                       size_t *nblocks);

/* Restore a pool to a checkpoint (CUDA graph trees' setCheckpointPoolState):
 * every block it hands out now is freed (addresses into `freed`, at most
 * `freed_cap`; *nfreed the count), then each of the `n` blocks in `live`
 * (addr, size, requested; as torchalloc_snapshot gave them) is allocated
 * again at its address. 0, or -1 when the pool's segments do not match. */
TORCHALLOC_API int torchalloc_pool_restore(int device, uint64_t id0, uint64_t id1,
                                           const torchalloc_block_info *live, size_t n, uint64_t *freed,
                                           size_t freed_cap, size_t *nfreed);
/* The segment containing `ptr` on any device: its base and size. 0, or -1. */
TORCHALLOC_API int torchalloc_segment_of(const void *ptr, void **base, size_t *size, int *device);

/* Bytes of the largest free block cached on `device`, -1 for a bad device. */
TORCHALLOC_API int64_t torchalloc_largest_cached_block(int device);

/* The memory fraction set on `device` (1.0 when none was set), or -1. */
TORCHALLOC_API double torchalloc_get_memory_fraction(int device);

/* Call `visit` for each frame of interned stack `stack`, innermost first.
 * The strings live only during the call; `visit` must not call torchalloc.
 * Returns the number of frames, 0 for an unknown id or no log open. */
typedef void (*torchalloc_frame_visitor)(void *ctx, const char *file, const char *function, uint32_t line);
TORCHALLOC_API int torchalloc_stack_frames(uint32_t stack, torchalloc_frame_visitor visit, void *ctx);

/* Segment observer: `fn` is called for every device allocation (event 1)
 * and release (event 2) of a segment, under the allocator's lock: it must
 * be quick, must not call torchalloc and must not take Python's GIL. One
 * observer at a time; NULL removes it. */
enum { TORCHALLOC_SEGMENT_ALLOC = 1, TORCHALLOC_SEGMENT_FREE = 2 };
typedef void (*torchalloc_segment_observer)(void *ctx, int device, int event, uint64_t addr, uint64_t size,
                                            uint64_t stream);
TORCHALLOC_API void torchalloc_set_segment_observer(torchalloc_segment_observer fn, void *ctx);

/* ---------------------------------------------------------------------------
 * Out of memory, in words (the numbers: torchalloc_oom.h).
 * ------------------------------------------------------------------------- */

/* The last out-of-memory failure on `device` as one paragraph ("CUDA out of
 * memory. Tried to allocate ..."), with the verdict, its advice (one line
 * each) and where the full report was written, into `buf`. Returns its
 * length (snprintf's convention), 0 when there was none, -1 for a bad
 * device. */
TORCHALLOC_API int torchalloc_oom_summary(int device, char *buf, size_t len);

/* The full report of that failure: the numbers, the verdict and advice, a
 * map of the segments, and the live blocks that pin the most fragmented ones
 * with their sites, phases and ages. Same return convention. It is also
 * written, at the failure, to the file torchalloc_oom_report_path names. */
TORCHALLOC_API int torchalloc_oom_report(int device, char *buf, size_t len);
/* Where the last report of `device` was written ("" when none could be). */
TORCHALLOC_API const char *torchalloc_oom_report_path(int device);

/* ---------------------------------------------------------------------------
 * Memory shared beyond one device. Mapped memory (expandable segments) is
 * reachable only from the devices its mapping names: under TORCHALLOC_CONF
 * peers:all (the default) that is every device with a peer-to-peer path
 * to it, from the first mapping; under peers:asked (install() on the
 * bridge route) only the devices named here, which PyTorch's
 * enablePeerAccess does before the first copy between two GPUs.
 * ------------------------------------------------------------------------- */

/* Device `peer` may read and write `device`'s memory, mapped before and
 * after. 0, or -1 (torchalloc_last_error says why: no such device, no
 * peer-to-peer path). */
TORCHALLOC_API int torchalloc_enable_peer_access(int device, int peer);
/* 1 when `peer` may reach `device`'s mapped memory now, 0 when not, -1 for a bad device. */
TORCHALLOC_API int torchalloc_peer_access(int device, int peer);

/* CUDA IPC, in PyTorch's allocator's own format (its shareIpcHandle and
 * getIpcDevPtr), so a torchalloc process and a PyTorch one can exchange
 * CUDA tensors either way. torchalloc_ipc_share describes the live block
 * holding `ptr`: the bytes go to buf (at most cap; *len is the length
 * needed, so a first call with cap 0 asks the size), *offset is where `ptr`
 * lies in what the receiver maps. Mapped memory travels as its physical
 * handles' file descriptors, which the receiver copies out of this
 * process with pidfd_getfd (Linux 5.6; the same user, and a Yama
 * ptrace_scope that allows it). 0 or -1. */
TORCHALLOC_API int torchalloc_ipc_share(const void *ptr, void *buf, size_t cap, size_t *len, size_t *offset);
/* Map on `device` the memory another process described (`len` bytes of
 * `handle`): *ptr is its start. Opening the same bytes again gives the
 * same address and counts one more user. 0 or -1. */
TORCHALLOC_API int torchalloc_ipc_open(int device, const void *handle, size_t len, void **ptr);
/* One user of memory opened at `ptr` is done; it is unmapped when the last
 * one is (after the device is done with it). 0, or -1 when `ptr` was not
 * opened. */
TORCHALLOC_API int torchalloc_ipc_close(void *ptr);
/* Memory of other processes still mapped on `device`; -1 for a bad device. */
TORCHALLOC_API int64_t torchalloc_ipc_open_count(int device);
/* How the caching and phase_arena policies use `device`'s memory:
 * 0 ordinary segments, 1 expandable, 2 compact, 3 reclaim (the
 * TORCHALLOC_CONF key `expandable`, after the device had its say: 0
 * wherever it has no virtual memory management). `configured` (may be
 * NULL) receives what the configuration asked for. -1 for a bad device. */
TORCHALLOC_API int torchalloc_segment_mode(int device, int *configured);

/* ---------------------------------------------------------------------------
 * Event log: every alloc, free, segment allocation and release, OOM, trim,
 * phase begin/end and marker as a fixed-size binary record in a memory-mapped
 * file that survives the process being killed. Format: docs/LOG_FORMAT.md;
 * decoder: torchalloc.log.read_log. TORCHALLOC_CONF keys: log:PATH,
 * log_max:SIZE, stacks:1 (Python source locations), stack_depth:N.
 * One log per process; torchalloc_init and torchalloc_teardown close it.
 * ------------------------------------------------------------------------- */

/* Start logging to `path` (%p: pid, %r: $RANK or $LOCAL_RANK or 0, %%: %),
 * closing the open log first; the configured log_max applies. 0, or -1 with
 * the reason in torchalloc_last_error(). */
TORCHALLOC_API int torchalloc_log_open(const char *path);
/* Write the end record, cut the file to its length and close it. */
TORCHALLOC_API void torchalloc_log_close(void);
/* The open log's path (%p and %r expanded), or NULL when none is open.
 * Any thread may call it while others open and close logs; the string it
 * returns stays valid and unchanged for the life of the process. */
TORCHALLOC_API const char *torchalloc_log_path(void);
/* A MARKER record carrying `label` (interned) and the current phase; does
 * nothing when no log is open. 0, or -1 when label is NULL. */
TORCHALLOC_API int torchalloc_mark(const char *label);

/* Modules (torchalloc.track(model) calls these from nn.Module hooks). The
 * current module is process-wide, like the phase: the autograd engine runs
 * a module's backward on its own threads. It lives in the log only: setting
 * it writes a MODULE record and every ALLOC after it, in the log's order,
 * was made inside that module, so an allocation costs nothing more. Ids are
 * the caller's (0: no module); a log opened later knows only the names given
 * after it opened. Each does nothing when no log is open.
 * Name module `id` (its path, e.g. "model.layers.3.mlp"; cut at 4095 bytes).
 * 0, or -1 when path is NULL or id is 0. */
TORCHALLOC_API int torchalloc_module_name(uint32_t id, const char *path);
/* Make module `id` current (0: none). */
TORCHALLOC_API void torchalloc_module_set(uint32_t id);
/* The block holding `ptr` belongs to module `id` as `role`: 1 a parameter,
 * 2 a parameter's gradient, 3 optimizer state. 0, or -1 for a bad role. */
TORCHALLOC_API int torchalloc_module_tag(const void *ptr, uint32_t id, int role);

#ifdef __cplusplus
}
#endif
#endif /* TORCHALLOC_H */
