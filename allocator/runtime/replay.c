/* Replay: a recorded allocation trace driven through one policy on a private
 * simulated device (replay.h; the public torchalloc_replay* functions,
 * api/replay_api.c, call these).
 *
 * Each call builds its own sim backend and heap from a local config, so a
 * replay never touches the process-wide heaps in runtime.c (the library may be
 * serving PyTorch in the same process) and several replays may run at once
 * on different threads. The heap is private to the call and used from one
 * thread only: the loop reads its stats and walks its segments directly.
 *
 * Speed: the loop is one hash-map probe plus one heap call per event. The
 * figures at a new peak of reserved bytes (free bytes and the largest free
 * block, for fragmentation) come from a census of free blocks the policies
 * keep as blocks come and go (accounting/free_census.h; the heap is made
 * with it), not from a walk over every block:
 * a trace whose reserve keeps growing reaches a new peak every few thousand
 * events, and walks made such a replay quadratic. Only when the census
 * could not be kept (host memory ran out) does a new peak walk. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/replay.h"

#include "base/errors.h"
#include "heap/heap.h"

_Static_assert(sizeof(torchalloc_replay_event) == 32, "torchalloc_replay_event is mirrored by numpy: 32 bytes");

/* "Unlimited" capacity: far above any device, far below the sim's 4 PiB
 * address range per device. */
#define REPLAY_UNLIMITED ((uint64_t)1 << 50)
/* How far the simulated device trails the trace, in events: a marker (an
 * event, for the reclaim mode) recorded at event i completes at event
 * i + REPLAY_LAG. A training loop's host runs ahead of its GPU by up to a
 * step (its launch queue holds about a thousand kernels), so memory freed
 * in the trace is not known to be past for that long: what the reclaim
 * mode does then (lending on the same stream) is what a GPU would see. */
#ifndef REPLAY_LAG
#define REPLAY_LAG 1000
#endif

/* ------------------------------------------------------------------------
 * Trace address -> replay block: open addressing, linear probing,
 * backward-shift deletion (no tombstones, so probe chains stay short in a
 * trace that allocates and frees millions of times). An empty slot has
 * ptr == NULL: the heap never hands out NULL for a live block.
 * ---------------------------------------------------------------------- */

typedef struct addr_slot {
  uint64_t key;  /* trace address */
  void *ptr;     /* replay address */
  uint64_t size; /* requested size, passed back to free */
} addr_slot;

typedef struct addr_map {
  addr_slot *slots;
  size_t mask; /* capacity - 1, capacity a power of two */
  size_t count;
  unsigned shift; /* 64 - log2(capacity) */
} addr_map;

static inline size_t map_home(const addr_map *m, uint64_t key) {
  return (size_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> m->shift); /* Fibonacci hashing */
}

static int map_init(addr_map *m, unsigned log2cap) {
  m->slots = calloc((size_t)1 << log2cap, sizeof *m->slots);
  if (!m->slots) return -1;
  m->mask = ((size_t)1 << log2cap) - 1;
  m->shift = 64u - log2cap;
  m->count = 0;
  return 0;
}

static ta_noinline int map_grow(addr_map *m) {
  addr_map bigger;
  if (map_init(&bigger, 64u - m->shift + 1u)) return -1;
  for (size_t i = 0; i <= m->mask; i++) {
    if (!m->slots[i].ptr) continue;
    size_t j = map_home(&bigger, m->slots[i].key);
    while (bigger.slots[j].ptr) j = (j + 1) & bigger.mask;
    bigger.slots[j] = m->slots[i];
  }
  bigger.count = m->count;
  free(m->slots);
  *m = bigger;
  return 0;
}

/* The slot holding `key`, or the empty slot where it would go. */
static inline addr_slot *map_probe(const addr_map *m, uint64_t key) {
  size_t i = map_home(m, key);
  while (m->slots[i].ptr && m->slots[i].key != key) i = (i + 1) & m->mask;
  return &m->slots[i];
}

static inline void map_erase(addr_map *m, addr_slot *slot) {
  size_t i = (size_t)(slot - m->slots);
  /* Shift back every later entry of the run that may no longer be reached. */
  for (size_t j = (i + 1) & m->mask; m->slots[j].ptr; j = (j + 1) & m->mask) {
    size_t home = map_home(m, m->slots[j].key);
    /* Entry j can move to i when its home is not in the cyclic range (i, j]. */
    if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
      m->slots[i] = m->slots[j];
      i = j;
    }
  }
  m->slots[i].ptr = NULL;
  m->count--;
}

/* Reserved bytes now: the heap keeps per-pool values current on the hot path
 * (stats.h), the "all" entry only at export. */
static inline int64_t reserved_now(const ta_heap *h) { return ta_stat_total(h->stats.reserved_bytes); }

/* ------------------------------------------------------------------------
 * The loop
 * ---------------------------------------------------------------------- */

/* reserved_series: bucket b covers events [edge(b), edge(b+1)) with
 * edge(b) = ceil(b * n / len) and holds the highest reserved_bytes after any
 * of its events (an empty bucket, when len > n: the value in force). */
typedef struct series_state {
  int64_t *out;
  size_t len, n;
  size_t bucket;    /* the bucket being filled */
  size_t next_edge; /* edge(bucket + 1) */
  int64_t high;     /* highest reserved so far in that bucket; -1 before its first event */
} series_state;

static inline size_t series_edge(const series_state *s, size_t b) {
  /* ceil(b * n / len) without overflowing b * n */
  return b * (s->n / s->len) + (b * (s->n % s->len) + s->len - 1) / s->len;
}

/* Close every bucket that ends at or before event index `i`. */
static inline void series_close_until(series_state *s, size_t i, int64_t reserved) {
  while (s->bucket < s->len && i >= s->next_edge) {
    s->out[s->bucket++] = s->high >= 0 ? s->high : reserved;
    s->high = -1;
    s->next_edge = series_edge(s, s->bucket + 1);
  }
}

static int validate(const torchalloc_replay_event *e, size_t i) {
  if (ta_unlikely(e->kind < TORCHALLOC_REPLAY_ALLOC || e->kind > TORCHALLOC_REPLAY_PHASE_END)) {
    ta_set_error("replay event %zu: unknown kind %u", i, (unsigned)e->kind);
    return -1;
  }
  if (ta_unlikely(e->phase >= TA_MAX_PHASES)) {
    ta_set_error("replay event %zu: phase %u is out of range (at most %d phases)", i, (unsigned)e->phase,
                 TA_MAX_PHASES);
    return -1;
  }
  if (ta_unlikely(e->kind == TORCHALLOC_REPLAY_ALLOC && e->size > (uint64_t)TA_MAX_REQUEST)) {
    ta_set_error("replay event %zu: size %" PRIu64 " is larger than any device", i, e->size);
    return -1;
  }
  return 0;
}

/* One replay in progress: ta_replay_begin makes it, each ta_replay_feed
 * runs the next events through it, and ta_replay_end gives the result. Event indices (in the result and
 * in error messages) count over everything fed. */
struct torchalloc_replay_run {
  ta_backend *backend;
  ta_heap *h;
  addr_map map;
  torchalloc_replay_result r;
  series_state ser;
  size_t i;    /* events replayed so far */
  int stopped; /* 1: an OOM ended the replay; 2: an error did (`error` says why) */
  char error[256];
  uint32_t epoch[TA_MAX_PHASES];
  ta_free_census *census; /* kept by the heap's policies; NULL: host memory ran out */
  ta_config conf;         /* the heap's configuration: it keeps a pointer to it for its whole life */
  int64_t walked;         /* blocks walked for the figures at new peaks */
};
typedef struct torchalloc_replay_run replay_state;

/* ------------------------------------------------------------------------
 * Fragmentation at a new peak of reserved bytes
 * ---------------------------------------------------------------------- */

/* Free bytes and the largest free block, by a walk over every block.
 * Returns the blocks visited. */
static int64_t walk_free(const ta_heap *h, int64_t *free_bytes, int64_t *largest) {
  int64_t visited = 0;
  *free_bytes = *largest = 0;
  for (size_t i = 0; i < h->seg.registry.count; i++)
    for (const ta_block *b = h->seg.registry.items[i]->first; b; b = b->next, visited++)
      if (b->state == TA_BLOCK_FREE) {
        *free_bytes += (int64_t)b->size;
        if ((int64_t)b->size > *largest) *largest = (int64_t)b->size;
      }
  return visited;
}

static inline int census_ok(const replay_state *st) { return st->census && !st->census->failed; }

static ta_noinline void note_peak(replay_state *st, int64_t event) {
  ta_heap *h = st->h;
  torchalloc_replay_result *r = &st->r;
  int64_t reserved = reserved_now(h);
  int64_t free_bytes = 0, largest = 0;
  /* Replay records no stream uses, so nothing is pending: free = reserved -
   * allocated. Only when something is free (never for `exact`). */
  if (reserved > ta_stat_total(h->stats.allocated_bytes)) {
    if (ta_likely(census_ok(st))) {
      free_bytes = st->census->bytes;
      largest = (int64_t)ta_census_largest(st->census);
    } else {
      st->walked += walk_free(h, &free_bytes, &largest);
    }
  }
  r->peak_reserved = reserved;
  r->peak_reserved_event = event;
  r->free_at_peak = free_bytes;
  r->largest_free_at_peak = largest;
  r->fragmentation_at_peak = free_bytes > 0 ? (double)(free_bytes - largest) / (double)free_bytes : 0.0;
}

int64_t ta_replay_blocks_walked(const torchalloc_replay_run *st) { return st->walked; }

int ta_replay_census_agrees(const torchalloc_replay_run *st) {
  int64_t free_bytes, largest;
  walk_free(st->h, &free_bytes, &largest);
  return census_ok(st) && st->census->bytes == free_bytes && (int64_t)ta_census_largest(st->census) == largest;
}

/* Free the block behind `slot` and forget the trace address. */
static inline void replay_free(replay_state *st, addr_slot *slot, cudaStream_t stream, int phase) {
  ta_heap_free_in_phase(st->h, slot->ptr, (size_t)slot->size, stream, phase);
  map_erase(&st->map, slot);
}

/* One allocation. Returns 0, 1 on OOM, -1 on host OOM. */
static inline int replay_alloc(replay_state *st, const torchalloc_replay_event *e) {
  if (ta_unlikely(e->size == 0)) return 0; /* PyTorch never hands these out; nothing to replay */
  cudaStream_t stream = (cudaStream_t)(uintptr_t)e->stream;
  addr_slot *slot = map_probe(&st->map, e->addr);
  if (ta_unlikely(slot->ptr != NULL)) { /* the trace missed a free: the address must be free again */
    st->r.replaced_allocs++;
    replay_free(st, slot, stream, e->phase);
    slot = map_probe(&st->map, e->addr);
  }
  void *p = ta_heap_malloc_in_phase(st->h, (size_t)e->size, stream, e->phase, st->epoch[e->phase]);
  if (ta_unlikely(p == NULL)) return 1;
  slot->key = e->addr;
  slot->ptr = p;
  slot->size = e->size;
  if (ta_unlikely(++st->map.count * 2 > st->map.mask + 1) && map_grow(&st->map)) return -1;
  return 0;
}

static void run_delete(torchalloc_replay_run *st) {
  free(st->map.slots);
  if (st->h) ta_heap_destroy(st->h); /* its policies tell the census to the end */
  if (st->backend) st->backend->ops->destroy(st->backend);
  ta_census_destroy(st->census);
  free(st);
}

/* The replay cannot go on: keep the reason (the thread's message may be
 * overwritten before ta_replay_end reads it). */
static int run_fail(torchalloc_replay_run *st) {
  snprintf(st->error, sizeof st->error, "%s", ta_error_text());
  st->stopped = 2;
  return -1;
}

torchalloc_replay_run *ta_replay_begin(const char *policy, uint64_t capacity, size_t n_total, int64_t *reserved_series,
                                       size_t series_len) {
  if (!policy || (reserved_series && series_len == 0)) {
    ta_set_error("torchalloc_replay: bad arguments");
    return NULL;
  }
  ta_config conf;
  ta_config_defaults(&conf);
  /* "POLICY+MODE,KEY:VALUE,...": settings after the first comma in TORCHALLOC_CONF's syntax (handle:16MiB,
   * move_time:5), so that a replay can say what a setting changes; the name still decides the policy and the
   * segments, and the replay its device. */
  const char *settings = policy;
  for (int depth = 0; *settings && (*settings != ',' || depth); settings++) /* a bracketed list keeps its commas */
    depth += *settings == '[' ? 1 : *settings == ']' ? -1 : 0;
  if (!*settings) settings = NULL;
  if (settings) {
    char err[256];
    if (ta_config_parse(&conf, settings + 1, err, sizeof err)) {
      ta_set_error("policy '%s': %s", policy, err);
      return NULL;
    }
  }
  /* "POLICY+expandable" / "+compact" / "+reclaim": the policy with expandable:1 / 2 / 3; the policy's name
   * alone: ordinary segments (expandable:0, not the configuration's default). */
  static const char *const suffixes[] = {"+expandable", "+compact", "+reclaim"};
  size_t name_len = settings ? (size_t)(settings - policy) : strlen(policy);
  /* "POLICY@DIVISIONS": with roundup_power2_divisions (its syntax: "4", "[256:1,>:8]"), as the traced
   * program's PyTorch settings had it; before any settings. */
  const char *divisions = memchr(policy, '@', name_len);
  if (divisions) {
    char why[160], value[128];
    snprintf(value, sizeof value, "%.*s", (int)(name_len - (size_t)(divisions + 1 - policy)), divisions + 1);
    if (ta_roundup_parse(value, &conf.roundup, why, sizeof why)) {
      ta_set_error("torchalloc_replay: '%s': %s", policy, why);
      return NULL;
    }
    name_len = (size_t)(divisions - policy);
  }
  conf.expandable = TA_EXPANDABLE_OFF;
  for (int k = 0; k < 3; k++) {
    size_t len = strlen(suffixes[k]);
    if (name_len > len && strncmp(policy + name_len - len, suffixes[k], len) == 0) {
      conf.expandable = k + 1;
      name_len -= len;
      break;
    }
  }
  if (name_len >= sizeof conf.policy) {
    ta_set_error("unknown policy '%s'", policy);
    return NULL;
  }
  memcpy(conf.policy, policy, name_len);
  conf.policy[name_len] = '\0';
  conf.backend = TA_BACKEND_SIM;
  conf.warn = 0;
  conf.log_path[0] = '\0';
  conf.stacks = 0;
  conf.sim_devices = 1;
  conf.sim_capacity = (size_t)(capacity ? capacity : REPLAY_UNLIMITED);
  conf.sim_fail_alloc = 0;

  torchalloc_replay_run *st = calloc(1, sizeof *st);
  if (!st) {
    ta_set_error("torchalloc_replay: out of host memory");
    return NULL;
  }
  st->r.version = TORCHALLOC_REPLAY_VERSION;
  st->r.peak_reserved_event = -1;
  st->r.oom_event = -1;
  for (int p = 0; p < TA_MAX_PHASES; p++) st->epoch[p] = 1;
  /* Wide addresses: a trace may use any number of (stream, pool) pairs,
   * each with an expandable segment reserving up to 1 TiB of addresses. */
  ta_sim_options opts = {.devices = 1, .capacity = conf.sim_capacity, .fail_alloc_at = 0, .wide_addresses = 1,
                          .lag = REPLAY_LAG};
  st->backend = ta_backend_sim_create(&opts);
  if (!st->backend) {
    ta_set_error("torchalloc_replay: cannot create the sim backend");
    run_delete(st);
    return NULL;
  }
  char err[256];
  st->census = ta_census_create(); /* NULL: new peaks walk instead */
  st->conf = conf;
  st->h = ta_heap_create(st->backend, 0, &st->conf, &(ta_heap_options){.census = st->census}, err, sizeof err);
  if (!st->h) {
    ta_set_error("%s%s", err,
                 strncmp(err, "unknown policy", 14) ? "" : "; each may end in +expandable, +compact or +reclaim");
    run_delete(st);
    return NULL;
  }
  if (map_init(&st->map, 12)) {
    ta_set_error("torchalloc_replay: out of host memory");
    run_delete(st);
    return NULL;
  }
  st->ser = (series_state){.out = reserved_series, .len = reserved_series ? series_len : 0, .n = n_total, .high = -1};
  if (st->ser.len) {
    for (size_t k = 0; k < st->ser.len; k++) reserved_series[k] = -1;
    st->ser.next_edge = series_edge(&st->ser, 1);
  }
  return st;
}

/* ta_replay_feed's loop, its arguments checked. */
static int feed_events(torchalloc_replay_run *st, const torchalloc_replay_event *events, size_t n) {
  ta_heap *h = st->h;
  series_state *ser = &st->ser;
  for (size_t k = 0; k < n; k++) {
    const torchalloc_replay_event *e = &events[k];
    size_t i = st->i;
    if (ta_unlikely(validate(e, i))) return run_fail(st);
    if (ser->len) series_close_until(ser, i, reserved_now(h));
    ta_backend_sim_advance(st->backend, 0, 1); /* the device trails by REPLAY_LAG events */
    if (ta_likely(e->kind == TORCHALLOC_REPLAY_ALLOC)) {
      int got = replay_alloc(st, e);
      if (ta_unlikely(got != 0)) {
        if (got < 0) {
          ta_set_error("torchalloc_replay: out of host memory at event %zu", i);
          return run_fail(st);
        }
        if (ta_backend_sim_address_exhausted(st->backend, 0)) { /* not the capacity: the sim's address range */
          ta_set_error("torchalloc_replay: simulated address space exhausted at event %zu", i);
          return run_fail(st);
        }
        st->r.oom = 1;
        st->r.oom_event = (int64_t)i;
        st->r.oom_size = (int64_t)e->size;
        st->i++; /* the failing event counts as replayed */
        st->stopped = 1;
        return 1;
      }
      if (ta_unlikely(reserved_now(h) > st->r.peak_reserved)) note_peak(st, (int64_t)i);
    } else if (e->kind == TORCHALLOC_REPLAY_FREE) {
      addr_slot *slot = map_probe(&st->map, e->addr);
      if (ta_likely(slot->ptr != NULL)) replay_free(st, slot, (cudaStream_t)(uintptr_t)e->stream, e->phase);
      else st->r.unknown_frees++;
    } else if (e->kind == TORCHALLOC_REPLAY_PHASE_BEGIN) {
      st->epoch[e->phase]++;
    } else {
      ta_heap_phase_ended(h, e->phase, st->epoch[e->phase]);
    }
    if (ser->len && reserved_now(h) > ser->high) ser->high = reserved_now(h);
    st->i++;
  }
  return 0;
}

int ta_replay_feed(torchalloc_replay_run *st, const torchalloc_replay_event *events, size_t n) {
  if (!st || (!events && n)) {
    ta_set_error("torchalloc_replay_feed: bad arguments");
    return -1;
  }
  if (st->stopped == 2) {
    ta_set_error("%s", st->error);
    return -1;
  }
  if (st->stopped) return 1; /* past the OOM: nothing more is replayed */
  if (st->ser.len && n > st->ser.n - st->i) {
    ta_set_error("torchalloc_replay_feed: more events than the %zu given to torchalloc_replay_begin", st->ser.n);
    return run_fail(st);
  }
  return feed_events(st, events, n);
}

int ta_replay_end(torchalloc_replay_run *st, torchalloc_replay_result *out) {
  if (!st) {
    ta_set_error("torchalloc_replay_end: bad arguments");
    return -1;
  }
  int rc = 0;
  if (st->stopped == 2) {
    ta_set_error("%s", st->error);
    rc = -1;
  } else if (!out) {
    ta_set_error("torchalloc_replay_end: bad arguments");
    rc = -1;
  } else {
    ta_heap *h = st->h;
    series_state *ser = &st->ser;
    if (ser->len) {
      if (!st->stopped) {
        series_close_until(ser, st->i, reserved_now(h));
      } else { /* stopped at the OOM event i - 1: close its bucket; later ones stay -1 */
        series_close_until(ser, st->i - 1, reserved_now(h));
        if (ser->bucket < ser->len) ser->out[ser->bucket] = ser->high >= 0 ? ser->high : reserved_now(h);
      }
    }
    torchalloc_stats stats;
    ta_heap_get_stats(h, &stats); /* the full view, "all" entries filled in */
    torchalloc_replay_result *r = &st->r;
    r->events = (int64_t)st->i;
    r->peak_allocated = stats.allocated_bytes[TORCHALLOC_POOL_ALL].peak;
    r->peak_requested = stats.requested_bytes[TORCHALLOC_POOL_ALL].peak;
    r->device_allocs = stats.num_device_alloc;
    r->device_frees = stats.num_device_free;
    r->alloc_retries = stats.num_alloc_retries;
    r->synchronizes = stats.num_synchronizes;
    r->handles_created = stats.num_handles_created;
    r->handles_moved = stats.num_handles_moved;
    r->handles_released = stats.num_handles_released;
    r->final_allocated = stats.allocated_bytes[TORCHALLOC_POOL_ALL].current;
    r->final_reserved = stats.reserved_bytes[TORCHALLOC_POOL_ALL].current;
    *out = *r;
  }
  run_delete(st);
  return rc;
}
