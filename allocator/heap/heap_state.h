/* The heap's state, shared by its files (heap.h): the struct ta_heap and
 * what it holds, for heap.c and the files that do one job each beside it
 * (heap_streams.c, heap_pools.c, heap_oom.c, heap_inspect.c, heap_check.c).
 * Below all of them: it declares no function of theirs. */
#ifndef TA_HEAP_STATE_H
#define TA_HEAP_STATE_H

#include "context/config.h"
#include "base/lock.h"
#include "context/phase.h"
#include "policy/policy.h"
#include "block/ptrmap.h"
#include "segments/segments.h"
#include "accounting/stats.h"
#include "torchalloc_oom.h"

/* A block freed by the caller while work on other streams may still use it
 * (record_stream): reused once every event has completed. Freed while
 * allocations are routed to a private pool (a CUDA graph capture may be
 * underway), its events cannot be recorded yet: nevents is -1 and b->uses
 * keeps the streams until routing ends. */
typedef struct ta_pending_free {
  ta_block *block;
  int nevents;
  void **events;
  /* graph_capture_record_stream_reuse: the capture's nodes that were the
   * last work of the block's streams when it was freed (NULL: it waits for
   * the capture's end); reused in the capture once all of them precede the
   * allocating stream's work (heap_streams.c). */
  uint64_t *markers;
  size_t nmarkers;
} ta_pending_free;

/* A private pool (heap_pools.c): the memory of a CUDA graph, or of a
 * torch.cuda.MemPool. Its blocks are carved only from its own segments and
 * go back only to it; its segments return to the device only once nobody
 * uses the pool (a captured graph replays into those addresses). */
typedef struct ta_private_pool {
  uint64_t id[2];     /* PyTorch's MempoolId_t */
  int use_count;      /* create/retain add one, release takes one; 0: freeable */
  unsigned flags;     /* TORCHALLOC_POOL_USE_ON_OOM, TORCHALLOC_POOL_NO_SPLIT */
  ta_policy *policy;  /* its own policy object (policy->source: its own allocator, if any) */
} ta_private_pool;

/* Per-device accounting of one phase (the reserved growth and release of a
 * phase are counted by the segment layer, which makes them). */
typedef struct ta_phase_acct {
  torchalloc_phase_stats pub;
  uint32_t epoch;     /* occurrence the occ_* counters belong to */
  int64_t occ_alloc;  /* bytes allocated in that occurrence */
  int64_t occ_freed;  /* of those, bytes freed while it was open */
} ta_phase_acct;

#define TA_RECENT_FREES 64

/* The last request this heap could not serve, as it stood at the failure
 * (filled under the lock by heap_oom.c; read by torchalloc_last_oom, the
 * summary in the bridge's OutOfMemoryError, the report file). */
typedef struct ta_oom_info {
  int64_t count;            /* failures so far; 0: none yet */
  torchalloc_oom_facts facts;
  torchalloc_oom_detail detail; /* the segments' free and live memory: what the advice rests on */
  int verdict;              /* TORCHALLOC_OOM_* */
  uintptr_t stream;
  int64_t pending;          /* freed bytes still waiting for other streams */
  size_t largest_free;      /* largest free block in the heap's segments, any stream */
  int phase;
  int routing;              /* a capture or MemPool context was open */
  uint8_t policy;           /* registry id of the policy that failed */
  char report_path[1024];   /* where the full report went ("" until written, or when it could not be) */
} ta_oom_info;

typedef struct ta_heap {
  ta_lock lock;
  int device;
  const ta_config *conf;
  torchalloc_stats stats; /* hot-path layout, see stats.h; read it through ta_heap_get_stats */
  ta_pending_stats pending_stats;
  ta_ptrmap live;
  ta_segments seg;
  ta_policy *policies[TA_MAX_POLICIES]; /* created on first use */
  ta_policy *current;
  ta_pending_free *pending;
  size_t npending, cap_pending;
  ta_private_pool *pools;
  size_t npools, cap_pools;
  /* Open beginAllocateToPool contexts (a graph capture or use_mem_pool):
   * while any is open nothing may synchronize, query or record an event
   * (illegal during stream capture), so cached memory is not released and
   * record_stream frees wait (PyTorch's allocator does the same). */
  int routing;
  /* Routing contexts open on every heap of the process (the runtime's
   * count; NULL for replay's private heaps). CUDA's global capture mode is
   * process-wide: a cudaFree while a stream of any device captures
   * invalidates that capture, so memory this heap would hand back to the
   * device waits while another device's capture may be underway too. */
  const atomic_int *routing_anywhere;
  uint32_t alloc_seq; /* allocations made so far (wraps): blocks keep theirs as their age */
  /* roundup_power2_divisions in force (from the configuration, then from
   * PyTorch's settings: ta_heap_set_roundup); read under the lock. */
  ta_roundup roundup;
  int capture_reuse; /* graph_capture_record_stream_reuse, likewise (heap_streams.c) */
  ta_oom_info oom;
  char *oom_report;   /* the full text of the last failure's report (heap_oom.c) */
  double fraction; /* the memory fraction last set (0 allows nothing), when fraction_set */
  int fraction_set;
  /* The last addresses freed: tells a double free from a wild pointer after
   * the segment is gone (error path only; one store per free). */
  uintptr_t recent_frees[TA_RECENT_FREES];
  unsigned recent_pos;
  ta_phase_acct phases[TA_MAX_PHASES];
} ta_heap;

/* A capture may be underway on this device or another (routing_anywhere). */
static inline int ta_heap_capture_anywhere(const ta_heap *h) TA_REQUIRES(h->lock);
static inline int ta_heap_capture_anywhere(const ta_heap *h) {
  return h->routing || (h->routing_anywhere && atomic_load_explicit(h->routing_anywhere, memory_order_acquire) > 0);
}

/* The block leaves the pointer map and goes back to the policy object that
 * made it (a private pool's, or the heap's instance of its policy). */
static inline void ta_heap_release_block(ta_heap *h, ta_block *b) TA_REQUIRES(h->lock);
static inline void ta_heap_release_block(ta_heap *h, ta_block *b) {
  ta_ptrmap_take(&h->live, b->addr);
  ta_policy *p = b->segment->policy_instance;
  p->ops->free(p, b);
}

#endif
