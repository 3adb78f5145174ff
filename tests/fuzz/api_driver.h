/* Drives the public C API on the simulated device from a stream of bytes,
 * and checks after each operation that nothing the caller holds was lost
 * or corrupted. Its files: api_driver.c (start, step, finish), api_ops.c
 * (the operations), api_checks.c (the checks), canary.c (the device's
 * words). One driver, two feeders: the libFuzzer target
 * (fuzz_api.c, bytes from the fuzzer) and the soak (soak.c, bytes from a
 * seeded generator).
 *
 * Bytes: the first DRV_CONFIG_BYTES choose the configuration (policy,
 * devices, capacity, injected device failures, memory held elsewhere,
 * event polls, logging); then every DRV_OP_BYTES are one operation: byte 0
 * picks it (malloc, free, record_stream, empty_cache, phases, policy
 * switch, capture begin/end with private pools, bad frees of every kind,
 * memory fraction, arena trim, stats, log on/off), the rest are its
 * arguments. Any byte string is a valid program.
 *
 * The driver keeps a shadow map of every live block (address, size,
 * device, stream, private pool) and aborts, printing the operation, when:
 *   - a new block is misaligned, outside its device's range, or overlaps
 *     a live block (every operation);
 *   - a block's canary words (canary.h: what a program would have written
 *     into it on the simulated device, kept by physical address, so two
 *     addresses of one granule are one word) changed before its owner
 *     freed it (at each free and every full check);
 *   - the sim's lag model saw a violation: the driver's kernels touch every
 *     block when it is handed out and before it is freed, and a record_stream
 *     stream's kernel touches it then (torchalloc_sim_use), so memory
 *     unmapped, remapped or handed to another stream while a queued kernel
 *     may still use it is caught (every operation, with the capture checks);
 *   - in the reclaim mode, a request was served with a device synchronize
 *     other than an OOM's retry (every malloc);
 *   - a device the caller did not tell about a capture is not the only
 *     one allowed capture violations: a device whose capture was begun
 *     after torchalloc_routing_begin has none (every operation);
 *   - torchalloc_check_invariants fails on a device; the LIVE blocks of
 *     torchalloc_snapshot are not exactly the shadow map's (same address,
 *     size, device and pool); allocation/requested stats disagree with the
 *     shadow; the misuse counters moved other than by one per bad call;
 *     num_ooms differs from the NULLs returned for valid requests (every
 *     `check_every` operations, and at the end);
 *   - any call returns something its contract in include/ rules out. */
#ifndef TA_TEST_API_DRIVER_H
#define TA_TEST_API_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#define DRV_CONFIG_BYTES 8
#define DRV_OP_BYTES 8

/* Byte 0 of an operation picks it: each operation owns the values from its
 * code up to the next code (the wider ranges run more often). Bytes 1..7
 * are its arguments (api_driver.c). tests/fuzz/make_corpus.py reads these
 * lines to write its scenario seeds. */
#define DRV_OP_MALLOC 0
#define DRV_OP_FREE 80
#define DRV_OP_POOL_MALLOC 140
#define DRV_OP_RECORD_STREAM 152
#define DRV_OP_EMPTY_CACHE 162
#define DRV_OP_PHASE 170
#define DRV_OP_POLICY 182
#define DRV_OP_CAPTURE 190
#define DRV_OP_POOL 202
#define DRV_OP_MISUSE 208
#define DRV_OP_FRACTION 234
#define DRV_OP_STATS 240
#define DRV_OP_LOG 248

typedef struct drv_counts {
  uint64_t ops;       /* operations executed */
  uint64_t mallocs;   /* blocks handed out */
  uint64_t frees;     /* blocks freed by their owner */
  uint64_t ooms;      /* valid requests that got NULL */
  uint64_t misuse;    /* bad calls made (each refused and counted) */
  uint64_t captures;  /* captures begun with routing */
  uint64_t checks;    /* full checks passed */
  uint64_t synchronizes;         /* device synchronizes the allocator made (empty_cache, OOM retries, compact) */
  uint64_t reclaim_synchronizes; /* of those, in runs of the reclaim mode (none of them to serve a request) */
} drv_counts;

/* Tear the allocator down and initialise it as `config` says; the shadow
 * starts empty. A full check runs after every `check_every` operations. */
void drv_start(const uint8_t config[DRV_CONFIG_BYTES], unsigned check_every);
/* One operation. */
void drv_step(const uint8_t op[DRV_OP_BYTES]);
/* End captures and phases, free every block, check, tear down. */
void drv_finish(void);
/* Counts over every run of this process. */
const drv_counts *drv_totals(void);
/* The TORCHALLOC_CONF of the current run. */
const char *drv_conf(void);

#endif
