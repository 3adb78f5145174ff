/* Host-side descriptors of device memory: segments (one device allocation
 * each) tiled by blocks (what a request gets). Policies split and merge
 * blocks; the core never looks inside a policy, only at these structs, and
 * a policy sees nothing of the core but these, policy/policy.h and the
 * segment layer's services (segments/services.h). */
#ifndef TA_BLOCK_H
#define TA_BLOCK_H

#include "base/common.h"
#include "torchalloc.h"

enum ta_block_state {
  TA_BLOCK_FREE = 0,    /* cached, in its arena's free index */
  TA_BLOCK_LIVE = 1,    /* handed out to the caller */
  TA_BLOCK_PENDING = 2, /* freed by the caller, waiting for stream events */
  TA_BLOCK_RETIRING = 3, /* reclaim: addresses whose memory now serves another range, until the device is past
                          * their last use (then unmapped and free again); in no index, owned by no caller */
};

struct ta_segment;
struct ta_policy;

/* Streams besides the allocation stream that used a block (record_stream). */
typedef struct ta_stream_uses {
  int count, cap;
  cudaStream_t streams[];
} ta_stream_uses;

typedef struct ta_block {
  uintptr_t addr;
  size_t size;      /* bytes the block spans, a multiple of 512 */
  size_t requested; /* bytes the caller asked for; while free, the last request's (0: never handed out) */
  struct ta_block *prev, *next;         /* address neighbours inside the segment */
  struct ta_block *bin_prev, *bin_next; /* free-index links while free */
  struct ta_segment *segment;
  cudaStream_t stream; /* the allocation stream (its segment's) */
  void *owner;         /* the arena (or policy) that made it: frees go back there */
  union {
    uint32_t bin;       /* while free: its free-index bin */
    uint32_t alloc_seq; /* while live: the heap's allocation count when it was made (its age) */
  };
  uint8_t state;       /* enum ta_block_state */
  uint8_t policy;      /* id of the policy that made it */
  uint16_t phase;      /* phase current at allocation */
  uint32_t phase_epoch;/* which occurrence of that phase */
  uint32_t stack_id;   /* interned allocation stack, 0 = none */
  ta_stream_uses *uses;/* record_stream streams; NULL when none */
} ta_block;

enum { TA_POOL_SMALL = 1, TA_POOL_LARGE = 2 }; /* = TORCHALLOC_POOL_* */

struct ta_expansion;
struct ta_stream_marks;
struct ta_segment_source;

typedef struct ta_segment {
  uintptr_t addr;
  size_t size;      /* bytes its blocks span; an expandable segment grows and shrinks at its end */
  size_t unmapped;  /* expandable: bytes of it not backed by device memory now (free granules given back) */
  cudaStream_t stream;
  ta_block *first;  /* lowest-address block */
  ta_block *last;   /* highest-address block: an expandable segment grows from it */
  struct ta_expansion *expansion; /* NULL for an ordinary segment (segments_expand.c) */
  struct ta_stream_marks *marks;  /* reclaim: its stream's progress markers (segments_marks.c); else NULL */
  uint32_t *stamps; /* reclaim: per granule, its stream's marker epoch at the last free of memory it holds */
  unsigned granule_shift; /* expandable: log2 of the granule */
  uint32_t donor_slot; /* reclaim: its place + 1 in the segment layer's donor candidates; 0: not there */
  void *owner;      /* arena or policy that owns it */
  struct ta_segment *owner_prev, *owner_next; /* the owner's own list of its segments (free for its use) */
  struct ta_policy *policy_instance; /* the policy object that made it: its blocks are freed there */
  struct ta_segment_source *source;  /* a pool's own allocator its memory came from; NULL: the device */
  uint8_t pool;     /* TA_POOL_SMALL or TA_POOL_LARGE */
  uint8_t policy;   /* that policy's registry id (the log's `policy` field) */
} ta_segment;

static inline int ta_block_is_split(const ta_block *b) { return b->prev != NULL || b->next != NULL; }
static inline int ta_block_pool(const ta_block *b) { return b->segment->pool; }

#endif
