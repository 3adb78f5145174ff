/* The API driver's operations: each turns its 8 bytes (api_driver.h) into
 * one call, or a few, of the public API, checks what the call returned
 * against its contract in include/, and keeps the shadow map and the
 * expected counters in step. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "canary.h"
#include "base/common.h" /* TA_MAX_REQUEST: larger requests are misuse, smaller ones may OOM */
#include "driver_state.h"
#include "torchalloc_oom.h"
#include "torchalloc_sim.h"

static const char *const phase_names[] = {"forward", "backward", "optimizer", "zero_grad"};

static uint32_t u32_at(const uint8_t *b) { return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24; }

/* ------------------------------------------------------------------------
 * Arguments
 * ---------------------------------------------------------------------- */

/* Sizes of every class that matters, from op bytes 3..7. */
static size_t draw_size(const uint8_t *b) {
  uint32_t r = u32_at(b + 4);
  static const size_t edges[] = {511,          512,          513,          1 * MiB - 1,  1 * MiB,
                                 1 * MiB + 1,  2 * MiB - 1,  2 * MiB + 1,  10 * MiB - 1, 10 * MiB,
                                 10 * MiB + 1, 20 * MiB - 1, 20 * MiB + 1, 12 * MiB + 3, 3};
  static const size_t absurd[] = {0, SIZE_MAX, SIZE_MAX - 511, TA_MAX_REQUEST + 1, SIZE_MAX / 2 + 1, (size_t)1 << 41};
  switch (b[3] % 16) {
    case 0: case 1: case 2: case 3: case 4: case 5: return 1 + r % 4096;
    case 6: case 7: case 8: return 4097 + r % (1 * MiB - 4096);
    case 9: case 10: return 1 * MiB + 1 + r % (9 * MiB);
    case 11: return 10 * MiB + r % (190 * MiB);
    case 12: return (size_t)1 << (r % 31);
    case 13: return edges[r % (sizeof edges / sizeof edges[0])] + (size_t)(b[3] / 16 % 3) * 512;
    case 14: return r % 2 ? TA_MAX_REQUEST - (size_t)(r % 4) * 512 : (size_t)(1 + r % 64) * GiB; /* OOM */
    default: return absurd[r % (sizeof absurd / sizeof absurd[0])];
  }
}

/* Mostly a real device; 0xff in the selector byte: one out of range. */
static int draw_device(uint8_t selector, uint8_t pick) {
  static const int bad[] = {-1, 2, 64, INT_MAX, INT_MIN};
  if (selector == 0xff) return bad[pick % 5];
  return selector % D.ndevices;
}

static int device_ok(int device) { return device >= 0 && device < D.ndevices; }

static uint16_t u16_at(const uint8_t *b) { return (uint16_t)(b[0] | b[1] << 8); }

/* ------------------------------------------------------------------------
 * Operations
 * ---------------------------------------------------------------------- */

/* A block just handed out: the caller now holds it, its kernel writes it
 * (the sim checks nobody else's queued work may still use that memory),
 * and its canary is written. */
static void add_live(uintptr_t p, size_t size, int device, cudaStream_t stream, int pool) {
  shadow_block *b = &D.live[D.nlive++];
  *b = (shadow_block){p, size, stream, device, pool, ++D.serial, 0};
  torchalloc_sim_use(device, stream, (void *)p, size);
  EXPECT(canary_write(p, size, b->serial) == 0, "the canary store is full (%zu words)", canary_words());
  D.n.mallocs++;
}

void drv_free_live(int i, int by_ptr) {
  shadow_block *b = &D.live[i];
  drv_check_canary(b); /* intact up to the moment the caller gives it back */
  /* Its last kernel, queued before the free (not after another stream's use:
   * that order would be the program's own race, not the allocator's). */
  if (!b->shared) torchalloc_sim_use(b->device, b->stream, (void *)b->addr, b->size);
  if (by_ptr)
    EXPECT(torchalloc_free_ptr((void *)b->addr) == 0, "free_ptr of live block %#lx failed", (unsigned long)b->addr);
  else
    torchalloc_free((void *)b->addr, b->size, b->device, b->stream);
  canary_erase(b->addr, b->size);
  D.freed[D.nfreed++ % MAX_FREED] = *b;
  *b = D.live[--D.nlive];
  D.n.frees++;
}

void op_malloc(const uint8_t *b, int from_pool) {
  if (D.nlive == MAX_LIVE) { /* keep the allocator busy: free one instead */
    op_free(b);
    return;
  }
  int device = draw_device(b[1], b[2]);
  cudaStream_t stream = drv_streams[b[2] % NSTREAMS];
  size_t size = draw_size(b);
  int pool = from_pool ? (b[3] >> 4) % NPOOLS : NO_POOL;
  torchalloc_stats before = {0}; /* read only where it was filled; zeroed for the compiler's flow analysis */
  if (D.expandable == 3 && device_ok(device)) before = drv_stats_of(device);
  void *p = pool == NO_POOL ? torchalloc_malloc(size, device, stream)
                            : torchalloc_pool_malloc(size, device, stream, drv_pool_ids[pool][0], drv_pool_ids[pool][1]);
  if (D.expandable == 3 && device_ok(device)) { /* reclaim: only an OOM's retry may wait for the device */
    torchalloc_stats after = drv_stats_of(device);
    EXPECT(after.num_synchronizes == before.num_synchronizes || after.num_alloc_retries != before.num_alloc_retries,
           "malloc(%zu) on device %d synchronized %lld times without an OOM retry", size, device,
           (long long)(after.num_synchronizes - before.num_synchronizes));
  }
  if (size == 0 || !device_ok(device) || size > TA_MAX_REQUEST) {
    EXPECT(p == NULL, "malloc(%zu, device %d) of a request no device can serve returned %p", size, device, p);
    D.misuse += size != 0; /* size 0 is a plain NULL, the rest is misuse */
    D.n.misuse += size != 0;
  } else if (!p) {
    D.ooms[device]++;
    D.n.ooms++;
  } else {
    drv_check_new_block((uintptr_t)p, size, device);
    add_live((uintptr_t)p, size, device, stream, pool);
  }
}

void op_free(const uint8_t *b) {
  if (!D.nlive) return;
  drv_free_live(u16_at(b + 1) % D.nlive, b[3] % 4 == 3);
}

void op_record_stream(const uint8_t *b) {
  if (!D.nlive) return;
  shadow_block *l = &D.live[u16_at(b + 1) % D.nlive];
  cudaStream_t other = drv_streams[b[3] % NSTREAMS];
  torchalloc_record_stream((void *)l->addr, other);
  if (other == l->stream) return;
  /* The other stream waits for the block's writer (the device catches up),
   * then its kernel reads the block: the free must wait for that kernel. */
  torchalloc_sim_advance(l->device, D.lag);
  torchalloc_sim_use(l->device, other, (void *)l->addr, l->size);
  l->shared = 1;
}

void op_empty_cache(const uint8_t *b) {
  switch (b[1] % 4) {
    case 0: EXPECT(torchalloc_empty_cache(-1) >= 0, "empty_cache(-1): %s", torchalloc_last_error()); break;
    case 1: torchalloc_reset(); break;
    default: {
      int device = b[2] % D.ndevices;
      EXPECT(torchalloc_empty_cache(device) >= 0, "empty_cache(%d): %s", device, torchalloc_last_error());
    }
  }
}

/* The innermost frame entered with a token at or below `from`, or -1. */
static int frame_with_token(int from) {
  for (int i = from; i >= 0; i--)
    if (D.phase_tokens[i]) return i;
  return -1;
}

void op_phase(const uint8_t *b) {
  int at;
  if (b[1] % 2 == 0 && D.depth < MAX_DEPTH) {
    const char *name = phase_names[b[2] % 4];
    int64_t token = 0;
    if (b[3] % 3 == 0) { /* by token: leaving it later may take it out of the middle */
      token = torchalloc_phase_enter(name, strlen(name));
      EXPECT(token > 0, "phase_enter(%s): %s", name, torchalloc_last_error());
    } else {
      EXPECT(torchalloc_phase_begin(name) >= 0, "phase_begin(%s): %s", name, torchalloc_last_error());
    }
    D.phase_tokens[D.depth] = token > 0 ? token : 0;
    D.phase_stack[D.depth++] = name;
  } else if (b[3] % 4 == 1 && D.depth && (at = frame_with_token(b[2] % D.depth)) >= 0) {
    int64_t token = D.phase_tokens[at];
    EXPECT(torchalloc_phase_leave(token) == 0, "phase_leave of frame %d of %d: %s", at, D.depth,
           torchalloc_last_error());
    for (int i = at; i + 1 < D.depth; i++) {
      D.phase_stack[i] = D.phase_stack[i + 1];
      D.phase_tokens[i] = D.phase_tokens[i + 1];
    }
    D.depth--;
    EXPECT(torchalloc_phase_leave(token) == -1, "a phase left twice by its token");
  } else if (b[3] % 4 == 0) { /* the wrong name: refused, nothing changes */
    const char *top = D.depth ? D.phase_stack[D.depth - 1] : NULL, *name = phase_names[b[2] % 4];
    if (top && strcmp(top, name) == 0) name = "not_a_phase";
    EXPECT(torchalloc_phase_end(name) == -1, "phase_end(%s) with %s innermost succeeded", name, top ? top : "none");
  } else {
    int rc = torchalloc_phase_end(b[3] % 2 || !D.depth ? NULL : D.phase_stack[D.depth - 1]);
    EXPECT(rc == (D.depth ? 0 : -1), "phase_end at depth %d returned %d", D.depth, rc);
    if (D.depth) D.depth--;
  }
  EXPECT(torchalloc_phase_current() == (D.depth ? torchalloc_phase_id(D.phase_stack[D.depth - 1]) : 0),
         "the current phase is not the innermost one begun");
}

void op_policy(const uint8_t *b) {
  int k = b[1] % 4;
  if (k == 3) {
    EXPECT(torchalloc_set_policy("no_such_policy") == -1, "an unknown policy was accepted");
    return;
  }
  EXPECT(torchalloc_set_policy(drv_policies[k]) == 0, "set_policy(%s): %s", drv_policies[k], torchalloc_last_error());
  EXPECT(strcmp(torchalloc_policy_name(), drv_policies[k]) == 0, "policy is %s after set_policy(%s)",
         torchalloc_policy_name(), drv_policies[k]);
}

/* Begin: as torch.cuda.graph does (pool retained, routing, then the stream
 * captures), or routing alone (use_mem_pool), or a capture the core is not
 * told about (violations allowed). End: in the reverse order. */
void op_capture(const uint8_t *b) {
  int device = b[1] % D.ndevices;
  capture_state *c = &D.cap[device];
  const uint64_t *id = drv_pool_ids[c->pool];
  if (c->state != CAP_NONE) {
    if (c->state != CAP_ROUTING_ONLY)
      EXPECT(torchalloc_sim_capture(device, c->stream, 0) == 0, "sim_capture end on device %d", device);
    if (c->state != CAP_UNGUARDED) {
      EXPECT(torchalloc_routing_end(device) == 0, "routing_end(%d): %s", device, torchalloc_last_error());
      EXPECT(torchalloc_pool_release(device, id[0], id[1]) >= 0, "pool_release of a retained pool: %s",
             torchalloc_last_error());
    } else {
      D.violations[device] = torchalloc_sim_capture_violations(device, NULL, 0);
    }
    c->state = CAP_NONE;
    return;
  }
  static const int kinds[] = {CAP_GUARDED, CAP_GUARDED, CAP_ROUTING_ONLY, CAP_UNGUARDED};
  c->state = kinds[b[2] % 4];
  c->pool = b[3] % NPOOLS;
  c->stream = drv_streams[b[4] % NSTREAMS];
  id = drv_pool_ids[c->pool];
  if (c->state != CAP_UNGUARDED) {
    EXPECT(torchalloc_pool_retain(device, id[0], id[1]) >= 1, "pool_retain: %s", torchalloc_last_error());
    EXPECT(torchalloc_routing_begin(device) == 0, "routing_begin(%d): %s", device, torchalloc_last_error());
  }
  if (c->state != CAP_ROUTING_ONLY)
    EXPECT(torchalloc_sim_capture(device, c->stream, 1) == 0, "sim_capture begin on device %d", device);
  D.n.captures += c->state == CAP_GUARDED;
}

void op_pool(const uint8_t *b) {
  int device = b[1] % D.ndevices, k = b[2] % NPOOLS;
  const uint64_t *id = drv_pool_ids[k];
  switch (b[3] % 4) {
    case 0:
      EXPECT(torchalloc_pool_empty(device, id[0], id[1]) >= -1, "pool_empty");
      break;
    case 1: { /* drop a reference the driver's own capture does not hold */
      int held = D.cap[device].state != CAP_NONE && D.cap[device].state != CAP_UNGUARDED && D.cap[device].pool == k;
      int count = torchalloc_pool_use_count(device, id[0], id[1]);
      if (count > held) EXPECT(torchalloc_pool_release(device, id[0], id[1]) == count - 1, "pool_release");
      break;
    }
    case 2: {
      uint64_t addrs[64];
      int64_t n = torchalloc_pool_live_blocks(device, id[0], id[1], addrs, 64);
      for (int64_t i = 0; i < n && i < 64; i++) {
        int at = drv_find_live((uintptr_t)addrs[i]);
        EXPECT(at >= 0 && D.live[at].pool == k && D.live[at].device == device,
               "pool_live_blocks lists %#llx, which the caller does not hold from that pool",
               (unsigned long long)addrs[i]);
      }
      break;
    }
    default:
      EXPECT(torchalloc_pool_retain(device, id[0], id[1]) >= 1, "pool_retain: %s", torchalloc_last_error());
  }
}

/* Every kind of bad call: each is refused, counted once, and touches
 * nothing live (the next full check sees the same blocks). */
void op_misuse(const uint8_t *b) {
  int device = b[2] % D.ndevices;
  cudaStream_t stream = drv_streams[b[3] % NSTREAMS];
  int i = D.nlive ? (int)(u32_at(b + 4) % (uint32_t)D.nlive) : -1;
  const shadow_block *live = i >= 0 ? &D.live[i] : NULL;
  int counted = 1;
  switch (b[1] % 9) {
    case 0: { /* an address never handed out: far into the device's range, low, or on the host */
      int local;
      uintptr_t addr = b[4] % 3 == 0   ? ((uintptr_t)(device + 1) << 52) + ((uintptr_t)3 << 50) + (uintptr_t)u32_at(b + 4) * 512
                       : b[4] % 3 == 1 ? (uintptr_t)0x1000 * (1 + b[5])
                                       : (uintptr_t)&local;
      torchalloc_free((void *)addr, 4096, device, stream);
      break;
    }
    case 1: { /* a stale pointer: freed before, maybe handed out again since */
      if (!D.nfreed) return;
      unsigned n = D.nfreed < MAX_FREED ? D.nfreed : MAX_FREED;
      const shadow_block *f = &D.freed[u32_at(b + 4) % n];
      int again = drv_find_live(f->addr);
      if (again >= 0 && D.live[again].size == f->size && D.live[again].stream == f->stream &&
          D.live[again].device == f->device)
        return; /* the address was reused with the same size and stream: undetectable (torchalloc.h) */
      torchalloc_free((void *)f->addr, f->size, f->device, f->stream);
      break;
    }
    case 2: /* the wrong size */
      if (!live) return;
      torchalloc_free((void *)live->addr, b[5] % 2 ? live->size + 1 + b[6] : live->size - 1 + (b[6] % 2) * 2 * live->size,
                      live->device, live->stream);
      break;
    case 3: /* a pointer inside a live block */
      if (!live || live->size < 2) return;
      torchalloc_free((void *)(live->addr + 1 + u32_at(b + 4) % (live->size - 1)), live->size, live->device,
                      live->stream);
      break;
    case 4: /* the wrong stream */
      if (!live) return;
      if (stream == live->stream) stream = drv_streams[(b[3] + 1) % NSTREAMS];
      torchalloc_free((void *)live->addr, live->size, live->device, stream);
      break;
    case 5: /* the wrong device: another one, or one out of range */
      if (!live) return;
      torchalloc_free((void *)live->addr, live->size, D.ndevices > 1 ? 1 - live->device : D.ndevices + b[5] % 8,
                      live->stream);
      break;
    case 6:
      EXPECT(torchalloc_free_ptr((void *)(((uintptr_t)(device + 1) << 52) + ((uintptr_t)3 << 50))) == -1,
             "free_ptr of an address never handed out succeeded");
      break;
    case 7:
      torchalloc_record_stream((void *)(((uintptr_t)(device + 1) << 52) + ((uintptr_t)3 << 50)), stream);
      break;
    default:
      counted = 0;
      torchalloc_free(NULL, 4096, device, stream); /* not misuse: nothing happens */
  }
  D.misuse += counted;
  D.n.misuse += (uint64_t)counted;
}

void op_memory_fraction(const uint8_t *b) {
  static const double fractions[] = {0.02, 0.05, 0.1, 0.3, 0.5, 0.9, 1.0};
  int device = b[1] % D.ndevices;
  if (b[2] == 0) { /* outside [0, 1]: refused (with a message on stderr), the old one stays */
    double before = torchalloc_get_memory_fraction(device);
    torchalloc_set_memory_fraction(b[3] % 2 ? -0.5 : 1.5, device);
    EXPECT(torchalloc_get_memory_fraction(device) == before, "a bad memory fraction was applied");
    return;
  }
  double f = fractions[b[2] % 7];
  torchalloc_set_memory_fraction(f, device);
  EXPECT(torchalloc_get_memory_fraction(device) == f, "memory fraction %g was not applied", f);
}

/* Memory shared beyond its device: a peer granted access must reach a
 * live block (mapped before the grant), and the block shared through CUDA
 * IPC and opened again must be the same physical memory at the offset
 * given; opened and closed in this one operation, so nothing outlives it. */
static void share_live(const uint8_t *b) {
  int peer = draw_device(b[3], b[4]);
  if (!D.nlive) return;
  const shadow_block *l = &D.live[u32_at(b + 4) % (uint32_t)D.nlive];
  int rc = torchalloc_enable_peer_access(l->device, peer);
  EXPECT(rc == (device_ok(peer) ? 0 : -1), "enable_peer_access(%d, %d) returned %d: %s", l->device, peer, rc,
         torchalloc_last_error());
  if (rc == 0)
    EXPECT(torchalloc_peer_access(l->device, peer) == 1 && torchalloc_sim_peer_use(l->device, peer, (void *)l->addr,
                                                                                    l->size) == 0,
           "device %d was granted access to device %d but cannot reach %#lx", peer, l->device, (unsigned long)l->addr);
  unsigned char bytes[8192];
  size_t len = 0, offset = 0;
  int shared = torchalloc_ipc_share((void *)l->addr, bytes, sizeof bytes, &len, &offset);
  /* Near capacity a block may lie on a granule mapped in 2 MiB pieces,
   * which PyTorch's format (one handle size a segment) cannot describe:
   * refused, and said so (docs/MULTI_GPU.md). */
  if (shared != 0 && strstr(torchalloc_last_error(), "mapped in") && strstr(torchalloc_last_error(), "pieces")) return;
  /* A block on a run of granules (warm-up growth) is shared once the run is
   * broken into a handle a granule, which needs memory to copy into and no
   * capture underway: refused otherwise, and said so. */
  if (shared != 0 && strstr(torchalloc_last_error(), "one handle of several granules")) return;
  EXPECT(shared == 0, "ipc_share(%#lx): %s", (unsigned long)l->addr, torchalloc_last_error());
  if (len > sizeof bytes) return;
  void *opened = NULL;
  if (D.cap[l->device].state != CAP_NONE) { /* mapping during a capture: refused when the allocator was told */
    if (D.cap[l->device].state != CAP_UNGUARDED)
      EXPECT(torchalloc_ipc_open(l->device, bytes, len, &opened) == -1, "ipc_open during a capture succeeded");
    return;
  }
  EXPECT(torchalloc_ipc_open(l->device, bytes, len, &opened) == 0, "ipc_open: %s", torchalloc_last_error());
  uint64_t mine = 0, theirs = 1;
  torchalloc_sim_physical(l->device, (void *)l->addr, &mine);
  torchalloc_sim_physical(l->device, (char *)opened + offset, &theirs);
  EXPECT(mine == theirs, "memory opened through IPC is not the block's (%#llx, %#llx)", (unsigned long long)mine,
         (unsigned long long)theirs);
  EXPECT(torchalloc_ipc_close(opened) == 0, "ipc_close: %s", torchalloc_last_error());
}

void op_stats(const uint8_t *b) {
  int device = b[2] % D.ndevices;
  if (b[1] % 6 == 5) {
    share_live(b);
    return;
  }
  switch (b[1] % 5) {
    case 0: EXPECT(torchalloc_reset_peak_stats(device) == 0, "reset_peak_stats"); break;
    case 1:
      EXPECT(torchalloc_reset_accumulated_stats(device) == 0, "reset_accumulated_stats");
      D.ooms[device] = 0; /* num_ooms is accumulated */
      break;
    case 2: EXPECT(torchalloc_largest_cached_block(device) >= 0, "largest_cached_block"); break;
    case 3: {
      int phase = b[3] % 2 ? -1 : torchalloc_phase_current();
      EXPECT(torchalloc_arena_trim(device, phase) >= 0, "arena_trim(%d, %d): %s", device, phase,
             torchalloc_last_error());
      break;
    }
    default: {
      if (b[3] % 2) { /* the last failure's detail and advice: figures within what was reserved, lines numbered */
        torchalloc_oom_facts f;
        torchalloc_oom_detail d = {.struct_size = sizeof d};
        int verdict = 0;
        EXPECT(torchalloc_last_oom(device, &f, &verdict) == 0 && torchalloc_last_oom_detail(device, &d) == 0,
               "last_oom / last_oom_detail(%d)", device);
        if (verdict == TORCHALLOC_OOM_NONE) return;
        EXPECT(d.free_granules + d.free_segments <= f.reserved && d.pinned_free + d.pinning <= f.reserved &&
                   d.pinning_other <= d.pinning && d.pinning <= f.allocated,
               "OOM detail beyond the reserved bytes: granules %llu, free segments %llu, pinned %llu + %llu, "
               "reserved %llu, allocated %llu", (unsigned long long)d.free_granules,
               (unsigned long long)d.free_segments, (unsigned long long)d.pinned_free,
               (unsigned long long)d.pinning, (unsigned long long)f.reserved, (unsigned long long)f.allocated);
        char advice[4096];
        int n = torchalloc_oom_advice(&f, &d, NULL, 0, advice, sizeof advice);
        EXPECT(n > 0 && (size_t)n < sizeof advice && strncmp(advice, "1. ", 3) == 0 && strstr(advice, "[based on "),
               "OOM advice: %d bytes: %.200s", n, advice);
        return;
      }
      if (!D.nlive) return;
      const shadow_block *l = &D.live[u32_at(b + 4) % (uint32_t)D.nlive];
      void *base = NULL;
      size_t size = 0;
      int on = -1;
      EXPECT(torchalloc_segment_of((void *)(l->addr + l->size - 1), &base, &size, &on) == 0 && on == l->device &&
                 (uintptr_t)base <= l->addr && l->addr + l->size <= (uintptr_t)base + size,
             "segment_of(%#lx) does not give the segment holding it", (unsigned long)l->addr);
    }
  }
}

void op_log(const uint8_t *b) {
  if (!D.logging) return;
  if (b[1] % 4 == 0) {
    EXPECT(torchalloc_mark("fuzz") == 0, "mark");
  } else if (b[1] % 8 == 1) { /* module records: a name, the current module, a tag on a live block (or none) */
    uint32_t id = 1 + b[2] % 8;
    EXPECT(torchalloc_module_name(id, "fuzz.layer") == 0, "module_name: %s", torchalloc_last_error());
    torchalloc_module_set(b[3] % 2 ? id : 0);
    uintptr_t at = D.nlive ? D.live[u32_at(b + 4) % (uint32_t)D.nlive].addr : 0;
    EXPECT(torchalloc_module_tag((void *)at, id, 1 + b[3] % 3) == 0, "module_tag: %s", torchalloc_last_error());
    EXPECT(torchalloc_module_tag((void *)at, id, 4) == -1, "module_tag accepted role 4");
  } else if (torchalloc_log_path()) {
    torchalloc_log_close();
  } else {
    EXPECT(torchalloc_log_open(D.log_path) == 0, "log_open(%s): %s", D.log_path, torchalloc_last_error());
  }
}