/* The byte-driven API driver (api_driver.h): its state, start, step and
 * finish. Single-threaded: one driver per process, its state in one
 * static struct (the fuzzer calls it for millions of inputs; nothing is
 * allocated per input). The operations are in api_ops.c, the checks in
 * api_checks.c, the simulated device's canary words in canary.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "canary.h"
#include "driver_state.h"
#include "torchalloc_sim.h"

const cudaStream_t drv_streams[NSTREAMS] = {(cudaStream_t)0, (cudaStream_t)0x1000, (cudaStream_t)0x2000,
                                            (cudaStream_t)0x3000};
const uint64_t drv_pool_ids[NPOOLS][2] = {{1, 0}, {2, 0}, {0, 3}};
const char *const drv_policies[3] = {"caching", "exact", "phase_arena"};

driver_state D;

void drv_fail(const char *fmt, ...) {
  fprintf(stderr, "api_driver: FAILED at operation %llu (bytes", (unsigned long long)D.n.ops);
  for (int i = 0; i < DRV_OP_BYTES; i++) fprintf(stderr, " %02x", D.op[i]);
  fprintf(stderr, ") with conf %s: ", D.conf);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  abort();
}

/* ------------------------------------------------------------------------
 * The driver
 * ---------------------------------------------------------------------- */

void drv_start(const uint8_t c[DRV_CONFIG_BYTES], unsigned check_every) {
  static const char *const capacities[] = {"80GiB", "80GiB", "1GiB", "256MiB", "64MiB", "24MiB"};
  static const unsigned long long capacity_mib[] = {80 << 10, 80 << 10, 1 << 10, 256, 64, 24};
  static const unsigned long long held_mib[] = {0, 0, 0, 16, 30, 2 << 10};
  torchalloc_teardown();
  torchalloc_segment_info *segs = D.segs;
  torchalloc_block_info *blocks = D.blocks;
  size_t segs_cap = D.segs_cap, blocks_cap = D.blocks_cap;
  memset(&D, 0, sizeof D);
  canary_reset(); /* a fresh device: after a failed input the last run's words may remain */
  D.segs = segs, D.blocks = blocks, D.segs_cap = segs_cap, D.blocks_cap = blocks_cap;
  static const uint64_t lags[] = {0, 1, 8, 64};
  D.check_every = check_every ? check_every : 1;
  D.ndevices = 1 + c[1] % MAX_DEVICES;
  D.logging = c[6] % 8 == 0;
  D.expandable = (c[7] >> 1) % 4; /* off, on, compact, reclaim */
  D.lag = lags[(c[5] >> 2) % 4];
  canary_set_translate(drv_physical);
  torchalloc_sim_on_copy(drv_copied);
  snprintf(D.log_path, sizeof D.log_path, "/tmp/torchalloc-fuzz-%ld.talog", (long)getpid());
  /* Another process cannot hold more than the device: past its capacity, all of it. */
  unsigned long long held = held_mib[c[4] % 6] < capacity_mib[c[2] % 6] ? held_mib[c[4] % 6] : capacity_mib[c[2] % 6];
  snprintf(D.conf, sizeof D.conf,
           "backend:sim,warn:0,oom_report:off,policy:%s,sim_devices:%d,sim_capacity:%s,sim_fail_alloc:%d,"
           "sim_held_elsewhere:%lluMiB,sim_event_polls:%d,log_max:256KiB,stacks:%d,expandable:%d,sim_lag:%llu,"
           "run:%s",
           drv_policies[c[0] % 3], D.ndevices, capacities[c[2] % 6], c[3] < 128 ? 0 : 1 + c[3] % 32, held,
           c[5] % 4, c[7] % 2, D.expandable, (unsigned long long)D.lag, (c[6] >> 3) % 2 ? "64MiB" : "0");
  EXPECT(torchalloc_init(D.conf) == 0, "init: %s", torchalloc_last_error());
  EXPECT(torchalloc_device_count() == D.ndevices, "device_count %d", torchalloc_device_count());
}

void drv_step(const uint8_t op[DRV_OP_BYTES]) {
  memcpy(D.op, op, DRV_OP_BYTES);
  uint8_t k = op[0];
  if (k < DRV_OP_FREE) op_malloc(op, 0);
  else if (k < DRV_OP_POOL_MALLOC) op_free(op);
  else if (k < DRV_OP_RECORD_STREAM) op_malloc(op, 1);
  else if (k < DRV_OP_EMPTY_CACHE) op_record_stream(op);
  else if (k < DRV_OP_PHASE) op_empty_cache(op);
  else if (k < DRV_OP_POLICY) op_phase(op);
  else if (k < DRV_OP_CAPTURE) op_policy(op);
  else if (k < DRV_OP_POOL) op_capture(op);
  else if (k < DRV_OP_MISUSE) op_pool(op);
  else if (k < DRV_OP_FRACTION) op_misuse(op);
  else if (k < DRV_OP_STATS) op_memory_fraction(op);
  else if (k < DRV_OP_LOG) op_stats(op);
  else op_log(op);
  D.n.ops++;
  drv_check_capture_violations();
  if (++D.since_check >= D.check_every) {
    D.since_check = 0;
    drv_full_check();
  }
}

static drv_counts totals; /* over every run */

void drv_finish(void) {
  memset(D.op, 0, sizeof D.op); /* failures from here on are the wind-down's */
  for (int d = 0; d < D.ndevices; d++)
    if (D.cap[d].state != CAP_NONE) op_capture((const uint8_t[DRV_OP_BYTES]){0, (uint8_t)d});
  drv_check_capture_violations();
  while (D.depth > 0) {
    EXPECT(torchalloc_phase_end(NULL) == 0, "phase_end at depth %d", D.depth);
    D.depth--;
  }
  drv_full_check();
  while (D.nlive > 0) drv_free_live(D.nlive - 1, 0);
  EXPECT(canary_words() == 0, "%zu canary words left with no block live", canary_words());
  EXPECT(torchalloc_empty_cache(-1) >= 0, "empty_cache(-1)");
  drv_full_check();
  for (int d = 0; d < D.ndevices; d++) {
    uint64_t n = (uint64_t)drv_stats_of(d).num_synchronizes;
    D.n.synchronizes += n;
    if (D.expandable == 3) D.n.reclaim_synchronizes += n;
  }
  if (torchalloc_log_path()) torchalloc_log_close();
  if (D.logging) unlink(D.log_path);
  torchalloc_teardown();
  totals.ops += D.n.ops, totals.mallocs += D.n.mallocs, totals.frees += D.n.frees, totals.ooms += D.n.ooms;
  totals.misuse += D.n.misuse, totals.captures += D.n.captures, totals.checks += D.n.checks;
  totals.synchronizes += D.n.synchronizes, totals.reclaim_synchronizes += D.n.reclaim_synchronizes;
}

const drv_counts *drv_totals(void) { return &totals; }

const char *drv_conf(void) { return D.conf; }