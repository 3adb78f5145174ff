/* torchalloc — a CUDA memory allocator for PyTorch that explains itself.
 *
 * The one public header. Every exported symbol starts with `torchalloc_`.
 * PyTorch loads the library with
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

/* Bump TORCHALLOC_STATS_VERSION whenever this struct changes; bindings check it. */
#define TORCHALLOC_STATS_VERSION 4

typedef struct torchalloc_stats {
  int64_t version;
  torchalloc_stat allocation[TORCHALLOC_NPOOLS];
  torchalloc_stat segment[TORCHALLOC_NPOOLS];
  torchalloc_stat active[TORCHALLOC_NPOOLS];
  torchalloc_stat inactive_split[TORCHALLOC_NPOOLS];
  torchalloc_stat allocated_bytes[TORCHALLOC_NPOOLS];
  torchalloc_stat reserved_bytes[TORCHALLOC_NPOOLS];
  torchalloc_stat active_bytes[TORCHALLOC_NPOOLS];
  torchalloc_stat inactive_split_bytes[TORCHALLOC_NPOOLS];
  torchalloc_stat requested_bytes[TORCHALLOC_NPOOLS];
  int64_t num_alloc_retries;
  int64_t num_ooms;
  int64_t num_device_alloc;
  int64_t num_device_free;
  /* Misuse counters (not in torch): each kind is printed once, counted always. */
  int64_t num_bad_free_unknown;   /* pointer torchalloc never handed out */
  int64_t num_bad_double_free;    /* pointer already freed */
  int64_t num_bad_free_size;      /* size differs from the allocation's: ignored */
  int64_t num_bad_size;           /* absurd request, e.g. (size_t)-1 */
  int64_t num_bad_device;         /* device index out of range (process-wide) */
  int64_t num_bad_free_stream;    /* stream differs from the allocation's: ignored (version 2) */
  /* Device synchronizes torchalloc made (releasing cached memory, an OOM's
   * retry, compact's unmapping); the reclaim mode makes none to allocate
   * (version 3; the bridge answers torch's num_sync_all_streams with it). */
  int64_t num_synchronizes;
  /* Physical handles of expandable segments (version 4): made and mapped,
   * moved (mapped at a new address: reclaim's donors and lent granules),
   * released to the device. Each move costs the host an unmap, a map and
   * a set-access call (BENCHMARKS.md). */
  int64_t num_handles_created;
  int64_t num_handles_moved;
  int64_t num_handles_released;
  /* Requests for which reclaim declined to move memory under the move
   * budget (TORCHALLOC_CONF move_time) and grew the reserve instead. */
  int64_t num_moves_declined;
  /* Host nanoseconds inside torchalloc's malloc and free entry points, and
   * the calls timed: counted only under TORCHALLOC_CONF time_calls:1 (two
   * clock reads a call), else 0. */
  int64_t host_ns;
  int64_t timed_calls;
} torchalloc_stats;

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

typedef struct torchalloc_phase_stats {
  int64_t occurrences;            /* times the phase ended (process-wide) */
  int64_t allocated_bytes;        /* block bytes requested while the phase was current */
  int64_t allocated_count;
  int64_t freed_bytes;            /* block bytes freed while the phase was current */
  int64_t freed_count;
  int64_t live_bytes;             /* bytes of blocks allocated in this phase, still live */
  int64_t live_peak_bytes;        /* high-water mark of live_bytes */
  int64_t peak_allocated_bytes;   /* device allocated_bytes high-water mark while current */
  int64_t reserved_growth_bytes;  /* device allocations made for its requests */
  int64_t reserved_released_bytes;/* device memory released while it was current */
  int64_t last_persistent_bytes;  /* at its last end: allocated in that occurrence, still live */
  int64_t last_transient_bytes;   /* at its last end: allocated and freed within that occurrence */
} torchalloc_phase_stats;

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
 * Out of memory: why, in numbers and in words.
 * ------------------------------------------------------------------------- */

enum {
  TORCHALLOC_OOM_NONE = 0,
  TORCHALLOC_OOM_FRAGMENTATION = 1, /* the bytes were there, cached but split between live blocks */
  TORCHALLOC_OOM_CAPACITY = 2,      /* live tensors plus the request exceed the device */
  TORCHALLOC_OOM_HELD_ELSEWHERE = 3 /* others hold the device's memory, or a memory fraction caps it */
};

typedef struct torchalloc_oom_facts {
  uint64_t requested;    /* bytes asked for */
  uint64_t allocated;    /* bytes in live blocks at the failure */
  uint64_t reserved;     /* bytes torchalloc held in segments */
  uint64_t device_total; /* 0 when unknown */
  uint64_t device_free;  /* as the device said at the failure */
  uint64_t limit;        /* the memory fraction's ceiling, 0 for none */
  uint64_t largest_free; /* largest free cached block on the request's stream */
} torchalloc_oom_facts;

/* The verdict (TORCHALLOC_OOM_*) for these numbers: the one rule behind the
 * failure report, torchalloc.last_oom() and `torchalloc report`. -1 for NULL. */
TORCHALLOC_API int torchalloc_oom_verdict(const torchalloc_oom_facts *facts);

/* The last failure on `device`: its numbers and verdict. 0 (and *verdict
 * TORCHALLOC_OOM_NONE) when there was none; -1 for a bad device. */
TORCHALLOC_API int torchalloc_last_oom(int device, torchalloc_oom_facts *facts, int *verdict);

/* What the advice rests on besides the facts: the free and live memory of
 * the segments at the failure (default pool only: private pools serve no
 * other request). The struct may grow at its end: `struct_size` says how
 * much of it the caller knows, and the library reads and writes no byte
 * past it. */
#define TORCHALLOC_OOM_OTHER_PHASES 3
enum {
  TORCHALLOC_OOM_PHASE_ARENAS = 1,     /* the failing policy keeps phases in arenas of their own */
  TORCHALLOC_OOM_FREES_TO_DEVICE = 2,  /* the failing policy caches nothing (expandable segments do not apply) */
  TORCHALLOC_OOM_ROUTING = 4           /* a capture or MemPool context was open: nothing could be released */
};
typedef struct torchalloc_oom_detail {
  uint64_t struct_size;     /* sizeof(torchalloc_oom_detail) as the caller was compiled */
  uint64_t granule;         /* bytes expandable segments map at a time; 0: the device cannot */
  uint64_t free_granules;   /* free bytes lying in whole granules of segments that hold live blocks too */
  uint64_t free_segments;   /* bytes of segments with no live or pending block (gone after the retry, unless routing) */
  uint64_t pinned_free;     /* free bytes in segments that hold live blocks too */
  uint64_t pinning;         /* live bytes in those segments */
  uint64_t pinning_other;   /* of which allocated in a phase other than the request's */
  uint64_t other_bytes[TORCHALLOC_OOM_OTHER_PHASES]; /* the other phases pinning the most, most first */
  uint16_t other_phases[TORCHALLOC_OOM_OTHER_PHASES];
  uint16_t phase;           /* the request's phase */
  uint32_t pinned_segments; /* segments holding free memory and live blocks */
  uint8_t expandable;       /* the failing heap's expandable:N, 0 for off */
  uint8_t flags;            /* TORCHALLOC_OOM_PHASE_ARENAS | _FREES_TO_DEVICE | _ROUTING */
  uint8_t reserved_[2];     /* 96 bytes, no implicit padding (ctypes mirrors it) */
} torchalloc_oom_detail;

/* The last failure's detail on `device` (all zero but struct_size when there
 * was none). 0, or -1 for a bad device or a struct_size below 8. */
TORCHALLOC_API int torchalloc_last_oom_detail(int device, torchalloc_oom_detail *detail);

/* The advice for these numbers, one line each ("expandable:reclaim would have
 * served this request: ... [based on ...]"), the line a user should try
 * first first: the rule behind the failure's summary and report, and what
 * `torchalloc report` calls with the numbers it reads from a log.
 * `phase_names[i]` names phase i (i < nnames; NULL or missing: "phase i").
 * `detail` may be NULL (the advice then rests on the facts alone). Returns
 * the length (snprintf's convention), -1 when `facts` is NULL. */
TORCHALLOC_API int torchalloc_oom_advice(const torchalloc_oom_facts *facts, const torchalloc_oom_detail *detail,
                                         const char *const *phase_names, size_t nnames, char *buf, size_t len);

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
 * The simulated device's model of CUDA stream capture, for tests and
 * fuzzers: while `stream` of sim device `device` is capturing, any
 * synchronize, event record, event query or device free is a violation
 * (each would invalidate a real capture) and is counted. -1 when the
 * backend is not sim.
 * ------------------------------------------------------------------------- */
TORCHALLOC_API int torchalloc_sim_capture(int device, cudaStream_t stream, int capturing);
/* `waiter` waits for the work queued on `waited` so far (an event recorded
 * on `waited`, then cudaStreamWaitEvent on `waiter`). In a capture the sim
 * models its topology: a kernel reported with torchalloc_sim_use on a
 * capturing stream is a node after that stream's last ones, and a wait adds
 * `waited`'s last nodes to `waiter`'s (a stream outside the capture joins
 * it: a fork; a stream waiting for a forked one: a join). -1 when the
 * backend is not sim. */
TORCHALLOC_API int torchalloc_sim_stream_wait(int device, cudaStream_t waiter, cudaStream_t waited);
/* Violations so far on `device` (and the last one's description in `buf`):
 * the capture ones, and those of the lag model below. */
TORCHALLOC_API int64_t torchalloc_sim_capture_violations(int device, char *buf, size_t len);
/* The lag model (TORCHALLOC_CONF sim_lag:N): the simulated device runs N
 * ticks behind the host. The program says what its kernels touch: each
 * call is one kernel launched on `stream` touching [ptr, ptr + size), one
 * tick of the clock; it is done N ticks later, as is an event recorded
 * when it was launched. A violation is counted when a kernel touches
 * unmapped memory, touches physical memory that a kernel of another stream
 * may still be using (memory handed out too early; two addresses of one
 * physical granule are the same memory), or when memory is unmapped while
 * a kernel queued on it may still run. -1 when the backend is not sim. */
TORCHALLOC_API int torchalloc_sim_use(int device, cudaStream_t stream, const void *ptr, size_t size);
/* `ticks` of host time pass on sim device `device` without kernels. */
TORCHALLOC_API int torchalloc_sim_advance(int device, uint64_t ticks);
/* The physical memory behind `ptr` on sim device `device` (a number unique
 * among the memory mapped now: aliases of one granule give the same); -1
 * when it is not mapped or the backend is not sim. */
TORCHALLOC_API int torchalloc_sim_physical(int device, const void *ptr, uint64_t *phys);
/* Called when sim device `device` copies `size` bytes of physical memory
 * (torchalloc_sim_physical's numbers) from `src` to `dst`: the out-of-memory
 * path moves live bytes into smaller handles, and a test that keeps data
 * by physical memory moves it with them. NULL: none. */
typedef void (*torchalloc_sim_copy_fn)(int device, uint64_t dst, uint64_t src, size_t size);
TORCHALLOC_API void torchalloc_sim_on_copy(torchalloc_sim_copy_fn fn);

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
/* The simulated device's peer access: a copy or kernel of device `peer`
 * touches [ptr, ptr + size) of sim device `device`. 0 when allowed, 1 (a
 * counted violation, see torchalloc_sim_capture_violations) when that
 * memory grants `peer` no access, -1 when the backend is not sim. */
TORCHALLOC_API int torchalloc_sim_peer_use(int device, int peer, const void *ptr, size_t size);

/* How the caching and phase_arena policies use `device`'s memory:
 * 0 ordinary segments, 1 expandable, 2 compact, 3 reclaim (the
 * TORCHALLOC_CONF key `expandable`, after the device had its say: 0
 * wherever it has no virtual memory management). `configured` (may be
 * NULL) receives what the configuration asked for. -1 for a bad device. */
TORCHALLOC_API int torchalloc_segment_mode(int device, int *configured);

/* ---------------------------------------------------------------------------
 * Replay: drive a recorded allocation trace through one policy on a private
 * simulated device (no GPU, no process-wide state touched), for
 * `torchalloc replay`. Python fills the events from a numpy structured array
 * in one go; the loop runs in C.
 * ------------------------------------------------------------------------- */

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

/* Bump TORCHALLOC_REPLAY_VERSION whenever this struct changes; bindings check it. */
#define TORCHALLOC_REPLAY_VERSION 3

typedef struct torchalloc_replay_result {
  int64_t version;
  int64_t events;               /* events replayed: all of them, or up to and including the OOM one */
  int64_t peak_allocated;       /* allocated_bytes peak (block bytes, as torch counts them) */
  int64_t peak_requested;       /* requested_bytes peak */
  int64_t peak_reserved;        /* reserved_bytes peak */
  int64_t peak_reserved_event;  /* index of the event that first reached it; -1 when nothing was reserved */
  int64_t free_at_peak;         /* reserved minus active bytes at that event */
  int64_t largest_free_at_peak; /* largest free block at that event */
  double fragmentation_at_peak; /* (free_at_peak - largest_free_at_peak) / free_at_peak; 0 when nothing is free */
  int64_t device_allocs;        /* num_device_alloc */
  int64_t device_frees;         /* num_device_free */
  int64_t alloc_retries;        /* device said no, cached segments released, tried again */
  int64_t unknown_frees;        /* frees of addresses not live in the trace (ring buffer started mid-run) */
  int64_t replaced_allocs;      /* allocs of an address still live in the trace: the old block is freed first */
  int64_t oom;                  /* 1 when an allocation failed at `capacity` (the replay stopped there) */
  int64_t oom_event;            /* index of that event, -1 when none */
  int64_t oom_size;             /* the size it asked for */
  int64_t final_allocated;      /* allocated_bytes after the last event replayed */
  int64_t final_reserved;       /* reserved_bytes after the last event replayed */
  int64_t synchronizes;         /* device synchronizes the policy made (num_synchronizes; version 2) */
  int64_t handles_created;      /* num_handles_created, num_handles_moved, num_handles_released (version 3) */
  int64_t handles_moved;
  int64_t handles_released;
} torchalloc_replay_result;

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
