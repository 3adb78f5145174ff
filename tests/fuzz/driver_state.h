/* The API driver's state, shared by its three files: api_driver.c (start,
 * step, finish), api_ops.c (the operations) and api_checks.c (the checks).
 * Internal to the driver: feeders include api_driver.h only. */
#ifndef TA_TEST_DRIVER_STATE_H
#define TA_TEST_DRIVER_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "api_driver.h"
#include "torchalloc.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define MAX_LIVE 512
#define MAX_FREED 64
#define MAX_DEVICES 2
#define NSTREAMS 4
#define NPOOLS 3
#define MAX_DEPTH 8
#define NO_POOL (-1)

extern const cudaStream_t drv_streams[NSTREAMS];
extern const uint64_t drv_pool_ids[NPOOLS][2];
extern const char *const drv_policies[3];

typedef struct shadow_block {
  uintptr_t addr;
  size_t size;
  cudaStream_t stream;
  int device;
  int pool;        /* index into drv_pool_ids, or NO_POOL */
  uint64_t serial; /* the allocation's number: its canary words (canary.h) */
  int shared;      /* record_stream'ed: another stream's kernel used it last */
} shadow_block;

/* What the driver told the allocator and the sim about captures. */
enum { CAP_NONE, CAP_GUARDED, CAP_UNGUARDED, CAP_ROUTING_ONLY };
typedef struct capture_state {
  int state;
  int pool;
  cudaStream_t stream;
} capture_state;

typedef struct driver_state {
  char conf[256];
  char log_path[128];
  int ndevices;
  int logging;
  int expandable;  /* the conf's mode (0-3); 3, reclaim: no synchronize may serve a request */
  uint64_t lag;    /* sim_lag: the device trails the driver's kernels (torchalloc_sim_use) by this many */
  unsigned check_every, since_check;
  shadow_block live[MAX_LIVE];
  int nlive;
  shadow_block freed[MAX_FREED]; /* a ring of the last blocks freed: stale pointers to reuse */
  unsigned nfreed;
  uint64_t serial; /* allocations so far */
  const char *phase_stack[MAX_DEPTH];
  int64_t phase_tokens[MAX_DEPTH]; /* torchalloc_phase_enter's token, 0 for a phase_begin */
  int depth;
  capture_state cap[MAX_DEVICES];
  int64_t violations[MAX_DEVICES]; /* the sim's capture violations, as expected */
  int64_t misuse;                  /* misuse counted so far, as expected */
  int64_t ooms[MAX_DEVICES];       /* num_ooms, as expected */
  uint8_t op[DRV_OP_BYTES];        /* the operation in flight, for failure messages */
  drv_counts n;
  torchalloc_segment_info *segs; /* snapshot buffers, grown on demand */
  torchalloc_block_info *blocks;
  size_t segs_cap, blocks_cap;
} driver_state;

extern driver_state D;

/* Print the operation, the configuration and the message; abort (libFuzzer
 * saves the input, the soak prints its seed). */
void drv_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#define EXPECT(cond, ...)               \
  do {                                  \
    if (!(cond)) drv_fail(__VA_ARGS__); \
  } while (0)

/* api_checks.c */
torchalloc_stats drv_stats_of(int device);
uint64_t drv_physical(uintptr_t addr);
/* torchalloc_sim_on_copy's hook: the canary words of copied memory move with it. */
void drv_copied(int device, uint64_t dst, uint64_t src, size_t size);
int drv_find_live(uintptr_t addr);
void drv_check_new_block(uintptr_t p, size_t size, int device);
void drv_check_canary(const shadow_block *b);
void drv_check_capture_violations(void);
void drv_full_check(void);

/* api_ops.c: one operation each, from its 8 bytes (api_driver.h) */
void op_malloc(const uint8_t *b, int from_pool);
void op_free(const uint8_t *b);
void op_record_stream(const uint8_t *b);
void op_empty_cache(const uint8_t *b);
void op_phase(const uint8_t *b);
void op_policy(const uint8_t *b);
void op_capture(const uint8_t *b);
void op_pool(const uint8_t *b);
void op_misuse(const uint8_t *b);
void op_memory_fraction(const uint8_t *b);
void op_stats(const uint8_t *b);
void op_log(const uint8_t *b);
/* Free live block i through the API and forget it (its canary checked first). */
void drv_free_live(int i, int by_ptr);

#endif
