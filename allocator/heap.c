/* The per-device heap: everything around a policy.
 *
 * Fast path of malloc: lock, policy->malloc (an O(1) bin lookup), pointer
 * map insert, five stat updates, unlock. Everything rare (device OOM and the
 * retry, misuse, growth) lives in noinline functions below. */
#include "heap.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "misuse.h"
#include "phase.h"
#include "stats.h"

/* Event log (log.h): when off, one atomic load per call. */
#define LOGGING(h) (ta_unlikely(ta_log_on()) && (h)->logged)

/* ------------------------------------------------------------------------
 * Block slab
 * ---------------------------------------------------------------------- */

#define SLAB_BLOCKS 256

static ta_noinline int slab_grow(ta_block_slab *s) {
  if (s->nchunks == s->cap_chunks) {
    size_t cap = s->cap_chunks ? s->cap_chunks * 2 : 16;
    void **chunks = realloc(s->chunks, cap * sizeof *chunks);
    if (!chunks) return -1;
    s->chunks = chunks;
    s->cap_chunks = cap;
  }
  ta_block *chunk = calloc(SLAB_BLOCKS, sizeof *chunk); /* zeroed: destroy reads .state */
  if (!chunk) return -1;
  s->chunks[s->nchunks++] = chunk;
  for (int i = 0; i < SLAB_BLOCKS; i++) {
    chunk[i].next = s->free_list;
    s->free_list = &chunk[i];
  }
  return 0;
}

ta_block *ta_heap_block_new(ta_heap *h) {
  ta_block_slab *s = &h->slab;
  if (ta_unlikely(!s->free_list) && slab_grow(s)) return NULL;
  ta_block *b = s->free_list;
  s->free_list = b->next;
  return b; /* uninitialised: every caller sets all fields */
}

void ta_heap_block_delete(ta_heap *h, ta_block *b) {
  b->next = h->slab.free_list;
  h->slab.free_list = b;
}

/* ------------------------------------------------------------------------
 * Segment registry (sorted by address)
 * ---------------------------------------------------------------------- */

/* Index of the first segment whose address is > addr. */
static size_t registry_upper(const ta_segment_registry *r, uintptr_t addr) {
  size_t lo = 0, hi = r->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->items[mid]->addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int registry_insert(ta_segment_registry *r, ta_segment *s) {
  if (r->count == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 64;
    ta_segment **items = realloc(r->items, cap * sizeof *items);
    if (!items) return -1;
    r->items = items;
    r->cap = cap;
  }
  size_t i = registry_upper(r, s->addr);
  memmove(&r->items[i + 1], &r->items[i], (r->count - i) * sizeof *r->items);
  r->items[i] = s;
  r->count++;
  return 0;
}

static void registry_remove(ta_segment_registry *r, ta_segment *s) {
  size_t i = registry_upper(r, s->addr);
  ta_assert(i > 0 && r->items[i - 1] == s);
  i--;
  memmove(&r->items[i], &r->items[i + 1], (r->count - i - 1) * sizeof *r->items);
  r->count--;
}

/* The segment containing addr, or NULL. */
static ta_segment *registry_find(const ta_segment_registry *r, uintptr_t addr) {
  size_t i = registry_upper(r, addr);
  if (i == 0) return NULL;
  ta_segment *s = r->items[i - 1];
  return addr < s->addr + s->size ? s : NULL;
}

/* ------------------------------------------------------------------------
 * Services for policies
 * ---------------------------------------------------------------------- */

ta_segment *ta_heap_segment_alloc(ta_heap *h, size_t size, cudaStream_t stream, int pool, void *owner,
                                  uint8_t policy) {
  ta_segment *s = malloc(sizeof *s);
  ta_block *b = ta_heap_block_new(h);
  uintptr_t addr = 0;
  if (!s || !b) goto fail;
  if (h->limit && (size_t)ta_stat_total(h->stats.reserved_bytes) + size > h->limit) goto fail;
  if (h->backend->ops->alloc(h->backend, h->device, size, &addr) != TA_OK) goto fail;
  *s = (ta_segment){.addr = addr, .size = size, .stream = stream, .first = b, .owner = owner,
                    .pool = (uint8_t)pool, .policy = policy};
  if (registry_insert(&h->segments, s)) {
    h->backend->ops->free(h->backend, h->device, addr, size);
    goto fail;
  }
  *b = (ta_block){.addr = addr, .size = size, .segment = s, .stream = stream, .owner = owner, .policy = policy,
                  .state = TA_BLOCK_FREE};
  h->stats.num_device_alloc++;
  h->phases[h->request_phase].pub.reserved_growth_bytes += (int64_t)size;
  ta_stats_add(h->stats.segment, pool, 1);
  ta_stats_add(h->stats.reserved_bytes, pool, (int64_t)size);
  if (LOGGING(h)) ta_log_segment(TA_LOG_SEGMENT_ALLOC, h->device, s, h->request_phase);
  return s;
fail:
  free(s);
  if (b) ta_heap_block_delete(h, b);
  return NULL;
}

void ta_heap_segment_release(ta_heap *h, ta_segment *s) {
  ta_assert(s->first->state == TA_BLOCK_FREE && !s->first->next);
  h->backend->ops->free(h->backend, h->device, s->addr, s->size);
  registry_remove(&h->segments, s);
  h->stats.num_device_free++;
  h->phases[h->request_phase].pub.reserved_released_bytes += (int64_t)s->size;
  ta_stats_sub(h->stats.segment, s->pool, 1);
  ta_stats_sub(h->stats.reserved_bytes, s->pool, (int64_t)s->size);
  if (LOGGING(h)) ta_log_segment(TA_LOG_SEGMENT_FREE, h->device, s, h->request_phase);
  ta_heap_block_delete(h, s->first);
  free(s);
}

void ta_heap_note_inactive_split(ta_heap *h, const ta_block *b, int sign) {
  int pool = ta_block_pool(b);
  if (sign > 0) {
    ta_stats_add(h->stats.inactive_split, pool, 1);
    ta_stats_add(h->stats.inactive_split_bytes, pool, (int64_t)b->size);
  } else {
    ta_stats_sub(h->stats.inactive_split, pool, 1);
    ta_stats_sub(h->stats.inactive_split_bytes, pool, (int64_t)b->size);
  }
}

/* ------------------------------------------------------------------------
 * Create / destroy
 * ---------------------------------------------------------------------- */

static ta_policy *policy_get(ta_heap *h, uint8_t id) {
  if (!h->policies[id]) h->policies[id] = ta_policy_by_id(id)->create(h, id);
  return h->policies[id];
}

ta_heap *ta_heap_create(ta_backend *backend, int device, const ta_config *conf, char *err, size_t errlen) {
  uint8_t id;
  if (!ta_policy_by_name(conf->policy, &id)) {
    snprintf(err, errlen, "unknown policy '%s'", conf->policy);
    return NULL;
  }
  ta_heap *h = calloc(1, sizeof *h);
  if (!h || ta_ptrmap_init(&h->live)) {
    free(h);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  ta_lock_init(&h->lock);
  h->device = device;
  h->backend = backend;
  h->conf = conf;
  h->stats.version = TORCHALLOC_STATS_VERSION;
  h->current = policy_get(h, id);
  if (!h->current) {
    snprintf(err, errlen, "out of host memory");
    ta_heap_destroy(h);
    return NULL;
  }
  return h;
}

void ta_heap_destroy(ta_heap *h) {
  if (!h) return;
  /* Return every segment, live blocks included, then drop the bookkeeping. */
  for (size_t i = 0; i < h->segments.count; i++) {
    ta_segment *s = h->segments.items[i];
    h->backend->ops->free(h->backend, h->device, s->addr, s->size);
    free(s);
  }
  h->segments.count = 0;
  for (int i = 0; i < TA_NPOLICIES; i++)
    if (h->policies[i]) h->policies[i]->ops->destroy(h->policies[i]);
  free(h->segments.items);
  for (size_t i = 0; i < h->npending; i++) {
    for (int e = 0; e < h->pending[i].nevents; e++)
      h->backend->ops->event_release(h->backend, h->device, h->pending[i].events[e]);
    free(h->pending[i].events);
  }
  free(h->pending);
  for (size_t i = 0; i < h->slab.nchunks; i++) {
    ta_block *chunk = h->slab.chunks[i];
    for (int j = 0; j < SLAB_BLOCKS; j++) if (chunk[j].state != TA_BLOCK_FREE) free(chunk[j].uses);
  }
  for (size_t i = 0; i < h->slab.nchunks; i++) free(h->slab.chunks[i]);
  free(h->slab.chunks);
  ta_ptrmap_destroy(&h->live);
  free(h);
}

/* ------------------------------------------------------------------------
 * malloc / free
 * ---------------------------------------------------------------------- */

static void process_pending(ta_heap *h);

/* Returns the drop in reserved bytes: handing back a pending block can
 * release a segment too (exact frees straight to the device). */
static size_t release_cached_locked(ta_heap *h) {
  int64_t before = ta_stat_total(h->stats.reserved_bytes);
  h->backend->ops->synchronize(h->backend, h->device); /* queued kernels may still use cached blocks */
  if (h->npending) process_pending(h);                 /* after the synchronize, every event is done */
  for (int i = 0; i < TA_NPOLICIES; i++)
    if (h->policies[i]) h->policies[i]->ops->release_cached(h->policies[i]);
  return (size_t)(before - ta_stat_total(h->stats.reserved_bytes));
}

static void report_oom(ta_heap *h, size_t size) {
  size_t free_b = 0, total_b = 0;
  h->backend->ops->mem_info(h->backend, h->device, &free_b, &total_b);
  const torchalloc_stats *s = &h->stats;
  fprintf(stderr,
          "torchalloc: out of memory on %s device %d: tried to allocate %zu bytes; device has %zu of %zu bytes "
          "free; torchalloc holds %" PRId64 " bytes reserved, %" PRId64 " allocated (policy %s)\n",
          h->backend->ops->name, h->device, size, free_b, total_b, ta_stat_total(s->reserved_bytes),
          ta_stat_total(s->allocated_bytes), h->current->ops->name);
}

/* The device said no: release every fully free cached segment, retry once. */
static ta_noinline ta_block *malloc_retry(ta_heap *h, size_t size, cudaStream_t stream, int phase) {
  h->stats.num_alloc_retries++;
  size_t released = release_cached_locked(h);
  if (LOGGING(h)) ta_log_trim(h->device, released, phase, TA_LOG_TRIM_OOM_RETRY);
  ta_block *b = h->current->ops->malloc(h->current, size, stream, phase);
  if (!b) {
    h->stats.num_ooms++;
    if (LOGGING(h)) ta_log_oom(h->device, size, stream, phase, (size_t)ta_stat_total(h->stats.reserved_bytes));
    if (h->conf->warn) report_oom(h, size);
  }
  return b;
}

static inline void count_alloc(ta_heap *h, const ta_block *b) {
  int pool = ta_block_pool(b);
  int64_t size = (int64_t)b->size;
  ta_phase_acct *pa = &h->phases[b->phase];
  if (ta_unlikely(pa->epoch != b->phase_epoch)) { /* first request of a new occurrence */
    pa->epoch = b->phase_epoch;
    pa->occ_alloc = pa->occ_freed = 0;
  }
  pa->occ_alloc += size;
  pa->pub.allocated_bytes += size;
  pa->pub.allocated_count++;
  pa->pub.live_bytes += size;
  if (pa->pub.live_bytes > pa->pub.live_peak_bytes) pa->pub.live_peak_bytes = pa->pub.live_bytes;
  ta_stats_add(h->stats.allocation, pool, 1);
  ta_stats_add(h->stats.allocated_bytes, pool, (int64_t)b->size);
  ta_stats_add(h->stats.requested_bytes, pool, (int64_t)b->requested);
  int64_t allocated = ta_stat_total(h->stats.allocated_bytes);
  if (allocated > pa->pub.peak_allocated_bytes) pa->pub.peak_allocated_bytes = allocated;
}

/* The caller's free: the bytes stop being allocated. */
static inline void count_free(ta_heap *h, const ta_block *b, int phase_now) {
  int pool = ta_block_pool(b);
  int64_t size = (int64_t)b->size;
  ta_phase_acct *pa = &h->phases[b->phase];
  pa->pub.live_bytes -= size;
  /* Transient: allocated in this occurrence of its phase, freed before it ended. */
  if (b->phase_epoch == pa->epoch &&
      b->phase_epoch == atomic_load_explicit(&ta_phase_open_epoch[b->phase], memory_order_relaxed))
    pa->occ_freed += size;
  h->phases[phase_now].pub.freed_bytes += size;
  h->phases[phase_now].pub.freed_count++;
  ta_stats_sub(h->stats.allocation, pool, 1);
  ta_stats_sub(h->stats.allocated_bytes, pool, (int64_t)b->size);
  ta_stats_sub(h->stats.requested_bytes, pool, (int64_t)b->requested);
}

/* The block goes back to its policy. */
static inline void release_block(ta_heap *h, ta_block *b) {
  ta_ptrmap_take(&h->live, b->addr);
  ta_policy *p = h->policies[b->policy];
  p->ops->free(p, b);
}

/* ------------------------------------------------------------------------
 * record_stream: deferred frees
 * ---------------------------------------------------------------------- */

int ta_heap_record_stream(ta_heap *h, void *ptr, cudaStream_t stream) {
  ta_lock_acquire(&h->lock);
  ta_block *b = ta_ptrmap_get(&h->live, (uintptr_t)ptr);
  int found = b && b->state == TA_BLOCK_LIVE;
  if (found && stream != b->stream) {
    ta_stream_uses *u = b->uses;
    int seen = 0;
    for (int i = 0; u && i < u->count; i++) seen |= u->streams[i] == stream;
    if (!seen && (!u || u->count == u->cap)) {
      int cap = u ? u->cap * 2 : 4;
      ta_stream_uses *grown = realloc(u, sizeof *u + (size_t)cap * sizeof(cudaStream_t));
      if (grown) {
        if (!u) grown->count = 0;
        grown->cap = cap;
        b->uses = u = grown;
      } else {
        seen = 1;
        fprintf(stderr, "torchalloc: warning: out of host memory in record_stream(%p); the block may be reused "
                        "before that stream is done with it\n", ptr);
      }
    }
    if (!seen) u->streams[u->count++] = stream;
  }
  ta_lock_release(&h->lock);
  return found;
}

/* Record an event on every stream that used `b`; the block is reused only
 * when they have all completed (process_pending). */
static ta_noinline void defer_free(ta_heap *h, ta_block *b) {
  ta_stream_uses *u = b->uses;
  b->uses = NULL;
  void **events = malloc((size_t)u->count * sizeof *events);
  int n = 0;
  for (int i = 0; events && i < u->count; i++) {
    void *ev = h->backend->ops->event_record(h->backend, h->device, u->streams[i]);
    if (!ev) break;
    events[n++] = ev;
  }
  int complete = events && n == u->count;
  free(u);
  if (complete && h->npending == h->cap_pending) {
    size_t cap = h->cap_pending ? h->cap_pending * 2 : 16;
    ta_pending_free *p = realloc(h->pending, cap * sizeof *p);
    if (p) {
      h->pending = p;
      h->cap_pending = cap;
    } else {
      complete = 0;
    }
  }
  if (!complete) { /* could not track the streams: wait for the device instead */
    for (int i = 0; i < n; i++) h->backend->ops->event_release(h->backend, h->device, events[i]);
    free(events);
    h->backend->ops->synchronize(h->backend, h->device);
    release_block(h, b);
    return;
  }
  b->state = TA_BLOCK_PENDING;
  ta_stats_add(h->pending_stats.count, ta_block_pool(b), 1);
  ta_stats_add(h->pending_stats.bytes, ta_block_pool(b), (int64_t)b->size);
  h->pending[h->npending++] = (ta_pending_free){.block = b, .nevents = n, .events = events};
}

/* Hand back every pending block whose events have all completed. */
static ta_noinline void process_pending(ta_heap *h) {
  for (size_t i = 0; i < h->npending;) {
    ta_pending_free *p = &h->pending[i];
    while (p->nevents > 0 && h->backend->ops->event_done(h->backend, h->device, p->events[p->nevents - 1]))
      h->backend->ops->event_release(h->backend, h->device, p->events[--p->nevents]);
    if (p->nevents > 0) {
      i++;
      continue;
    }
    free(p->events);
    ta_stats_sub(h->pending_stats.count, ta_block_pool(p->block), 1);
    ta_stats_sub(h->pending_stats.bytes, ta_block_pool(p->block), (int64_t)p->block->size);
    release_block(h, p->block);
    h->pending[i] = h->pending[--h->npending];
  }
}

void *ta_heap_malloc(ta_heap *h, size_t size, cudaStream_t stream) {
  ta_phase_now now = ta_phase_read();
  return ta_heap_malloc_in_phase(h, size, stream, now.id, now.epoch);
}

void *ta_heap_malloc_in_phase(ta_heap *h, size_t size, cudaStream_t stream, int phase, uint32_t epoch) {
  ta_lock_acquire(&h->lock);
  h->request_phase = phase;
  if (ta_unlikely(h->npending != 0)) process_pending(h);
  ta_block *b = h->current->ops->malloc(h->current, size, stream, phase);
  if (ta_unlikely(!b)) b = malloc_retry(h, size, stream, phase);
  void *ptr = NULL;
  if (ta_likely(b != NULL)) {
    if (ta_unlikely(ta_ptrmap_put(&h->live, b->addr, b) != 0)) {
      policy_get(h, b->policy)->ops->free(policy_get(h, b->policy), b); /* host OOM: give it back */
    } else {
      b->requested = size;
      b->phase = (uint16_t)phase;
      b->phase_epoch = epoch;
      count_alloc(h, b);
      if (LOGGING(h)) ta_log_alloc(h->device, b);
      ptr = (void *)b->addr;
    }
  }
  ta_lock_release(&h->lock);
  return ptr;
}

/* Why `addr` is not a live block. A block start that is free or waiting for
 * its streams, or an address freed recently (its segment may be gone since:
 * exact, empty_cache), was handed out and freed already: a double free.
 * Anything else, an address inside a block included, was never handed out. */
static int was_freed(ta_heap *h, uintptr_t addr) {
  ta_segment *s = registry_find(&h->segments, addr);
  for (ta_block *b = s ? s->first : NULL; b && b->addr <= addr; b = b->next)
    if (b->addr == addr) return b->state != TA_BLOCK_LIVE || ta_ptrmap_get(&h->live, addr) != NULL;
  for (int i = 0; i < TA_RECENT_FREES; i++)
    if (h->recent_frees[i] == addr) return 1;
  return 0;
}

static ta_noinline void report_bad_free(ta_heap *h, uintptr_t addr) {
  if (was_freed(h, addr)) {
    h->stats.num_bad_double_free++;
    ta_misuse_report(h->conf->warn, TA_MISUSE_DOUBLE_FREE,
                     "free of %p on device %d, which was already freed (double free); ignored", (void *)addr,
                     h->device);
  } else {
    h->stats.num_bad_free_unknown++;
    ta_misuse_report(h->conf->warn, TA_MISUSE_FREE_UNKNOWN,
                     "free of %p on device %d, which torchalloc never allocated; ignored", (void *)addr, h->device);
  }
}

/* record_stream of a pointer that is not a live block of any device. */
void ta_heap_report_bad_record_stream(ta_heap *h, void *ptr) {
  ta_lock_acquire(&h->lock);
  h->stats.num_bad_free_unknown++;
  ta_lock_release(&h->lock);
  ta_misuse_report(h->conf->warn, TA_MISUSE_RECORD_STREAM_UNKNOWN,
                   "record_stream of %p, which is not a live torchalloc block; ignored", ptr);
}

void ta_heap_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  ta_heap_free_in_phase(h, ptr, size, stream, ta_phase_current());
}

void ta_heap_free_in_phase(ta_heap *h, void *ptr, size_t size, cudaStream_t stream, int phase) {
  (void)stream; /* the block knows its stream; torch passes the same one */
  uintptr_t addr = (uintptr_t)ptr;
  ta_lock_acquire(&h->lock);
  h->request_phase = phase;
  ta_block *b = ta_ptrmap_get(&h->live, addr);
  if (ta_unlikely(!b || b->state != TA_BLOCK_LIVE)) {
    report_bad_free(h, addr);
  } else if (ta_unlikely(b->requested != size)) {
    /* Most likely a stale free of an address since handed to someone else:
     * freeing it would corrupt their data, so the block stays allocated. */
    h->stats.num_bad_free_size++;
    ta_misuse_report(h->conf->warn, TA_MISUSE_FREE_SIZE,
                     "free of %p with size %zu, but it was allocated with size %zu; ignored, the block stays "
                     "allocated",
                     ptr, size, b->requested);
  } else {
    if (LOGGING(h)) ta_log_free(h->device, b, phase, b->uses ? TA_LOG_FREE_DEFERRED : 0);
    count_free(h, b, phase);
    h->recent_frees[h->recent_pos++ % TA_RECENT_FREES] = addr;
    if (ta_unlikely(b->uses != NULL)) defer_free(h, b);
    else release_block(h, b);
  }
  ta_lock_release(&h->lock);
}

/* ------------------------------------------------------------------------
 * Control
 * ---------------------------------------------------------------------- */

int ta_heap_set_policy(ta_heap *h, const char *name) {
  uint8_t id;
  if (!ta_policy_by_name(name, &id)) return -1;
  ta_lock_acquire(&h->lock);
  ta_policy *p = policy_get(h, id);
  if (p) h->current = p;
  ta_lock_release(&h->lock);
  return p ? 0 : -1;
}

void ta_heap_set_limit(ta_heap *h, size_t limit) {
  ta_lock_acquire(&h->lock);
  h->limit = limit;
  ta_lock_release(&h->lock);
}

size_t ta_heap_live_blocks(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  size_t live = (size_t)ta_stat_total(h->stats.allocation); /* pending blocks were freed by the caller */
  ta_lock_release(&h->lock);
  return live;
}

size_t ta_heap_release_cached(ta_heap *h) {
  int phase = ta_phase_current();
  ta_lock_acquire(&h->lock);
  h->request_phase = phase;
  size_t released = release_cached_locked(h);
  if (LOGGING(h)) ta_log_trim(h->device, released, phase, TA_LOG_TRIM_EMPTY_CACHE);
  ta_lock_release(&h->lock);
  return released;
}

void ta_heap_get_stats(ta_heap *h, torchalloc_stats *out) {
  ta_lock_acquire(&h->lock);
  ta_stats_export(&h->stats, &h->pending_stats, out);
  ta_lock_release(&h->lock);
}

void ta_heap_reset_peak_stats(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  ta_stats_reset_peak(&h->stats, &h->pending_stats);
  ta_lock_release(&h->lock);
}

void ta_heap_reset_accumulated_stats(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  ta_stats_reset_accumulated(&h->stats, &h->pending_stats);
  ta_lock_release(&h->lock);
}

void ta_heap_get_phase_stats(ta_heap *h, int phase, torchalloc_phase_stats *out) {
  ta_lock_acquire(&h->lock);
  *out = h->phases[phase].pub;
  ta_lock_release(&h->lock);
}

void ta_heap_phase_ended(ta_heap *h, int phase, uint32_t epoch) {
  ta_lock_acquire(&h->lock);
  ta_phase_acct *pa = &h->phases[phase];
  int seen = pa->epoch == epoch; /* did this occurrence allocate on this device? */
  pa->pub.last_persistent_bytes = seen ? pa->occ_alloc - pa->occ_freed : 0;
  pa->pub.last_transient_bytes = seen ? pa->occ_freed : 0;
  ta_lock_release(&h->lock);
}

int64_t ta_heap_arena_reserved(ta_heap *h, int phase) {
  ta_lock_acquire(&h->lock);
  ta_policy *p = h->policies[TA_POLICY_PHASE_ARENA];
  int64_t r = p ? (int64_t)p->ops->arena_reserved(p, phase) : 0;
  ta_lock_release(&h->lock);
  return r;
}

int64_t ta_heap_arena_release(ta_heap *h, int phase) {
  int now = ta_phase_current();
  ta_lock_acquire(&h->lock);
  h->request_phase = now;
  ta_policy *p = h->policies[TA_POLICY_PHASE_ARENA];
  int64_t r = 0;
  if (p) {
    h->backend->ops->synchronize(h->backend, h->device);
    r = (int64_t)p->ops->arena_release(p, phase);
    if (LOGGING(h)) ta_log_trim(h->device, (size_t)r, now, TA_LOG_TRIM_ARENA);
  }
  ta_lock_release(&h->lock);
  return r;
}

/* ------------------------------------------------------------------------
 * Invariant checker: recount everything from the segment and block lists.
 * ---------------------------------------------------------------------- */

typedef struct recount {
  int64_t allocation[3], allocated_bytes[3], requested_bytes[3], active[3], active_bytes[3];
  int64_t segment[3], reserved_bytes[3], inactive_split[3], inactive_split_bytes[3];
  size_t live_blocks;
} recount;

static void add3(int64_t v[3], int pool, int64_t n) {
  v[0] += n;
  v[pool] += n;
}

#define FAIL(...)                            \
  do {                                       \
    snprintf(err, errlen, __VA_ARGS__);      \
    return -1;                               \
  } while (0)

static int check_segment(ta_heap *h, const ta_segment *s, recount *rc, char *err, size_t errlen) {
  uintptr_t expect = s->addr;
  const ta_block *prev = NULL;
  for (const ta_block *b = s->first; b; prev = b, b = b->next) {
    if (b->addr != expect) FAIL("segment %p: block at %p, expected %p (gap or overlap)", (void *)s->addr,
                                (void *)b->addr, (void *)expect);
    if (b->prev != prev) FAIL("block %p: prev link broken", (void *)b->addr);
    if (b->segment != s) FAIL("block %p: points to the wrong segment", (void *)b->addr);
    if (b->size == 0 || b->size % 512) FAIL("block %p: size %zu is not a positive multiple of 512", (void *)b->addr, b->size);
    if (b->stream != s->stream) FAIL("block %p: stream differs from its segment's", (void *)b->addr);
    expect = b->addr + b->size;
    if (b->state == TA_BLOCK_FREE) {
      if (prev && prev->state == TA_BLOCK_FREE) FAIL("blocks %p and %p are both free but not merged",
                                                     (void *)prev->addr, (void *)b->addr);
      if (ta_block_is_split(b)) {
        add3(rc->inactive_split, s->pool, 1);
        add3(rc->inactive_split_bytes, s->pool, (int64_t)b->size);
      }
    } else {
      if (ta_ptrmap_get(&h->live, b->addr) != b) FAIL("live block %p is missing from the pointer map", (void *)b->addr);
      if (b->requested == 0 || b->requested > b->size) FAIL("live block %p: requested %zu outside (0, %zu]",
                                                           (void *)b->addr, b->requested, b->size);
      rc->live_blocks++;
      add3(rc->active, s->pool, 1);
      add3(rc->active_bytes, s->pool, (int64_t)b->size);
      if (b->state == TA_BLOCK_LIVE) {
        add3(rc->allocation, s->pool, 1);
        add3(rc->allocated_bytes, s->pool, (int64_t)b->size);
        add3(rc->requested_bytes, s->pool, (int64_t)b->requested);
      }
    }
  }
  if (expect != s->addr + s->size) FAIL("segment %p: blocks cover %zu of %zu bytes", (void *)s->addr,
                                        (size_t)(expect - s->addr), s->size);
  add3(rc->segment, s->pool, 1);
  add3(rc->reserved_bytes, s->pool, (int64_t)s->size);
  return 0;
}

static int compare(const char *name, const torchalloc_stat st[3], const int64_t v[3], char *err, size_t errlen) {
  for (int p = 0; p < 3; p++)
    if (st[p].current != v[p]) FAIL("stat %s[%d].current is %" PRId64 ", recount gives %" PRId64, name, p,
                                    st[p].current, v[p]);
  return 0;
}

int ta_heap_check(ta_heap *h, char *err, size_t errlen) {
  ta_lock_acquire(&h->lock);
  recount rc;
  memset(&rc, 0, sizeof rc);
  int bad = 0;
  const ta_segment_registry *r = &h->segments;
  for (size_t i = 0; i < r->count && !bad; i++) {
    const ta_segment *s = r->items[i];
    if (i > 0 && r->items[i - 1]->addr + r->items[i - 1]->size > s->addr) {
      snprintf(err, errlen, "segments %p and %p overlap", (void *)r->items[i - 1]->addr, (void *)s->addr);
      bad = 1;
    } else {
      bad = check_segment(h, s, &rc, err, errlen) != 0;
    }
  }
  if (!bad && rc.live_blocks != h->live.count) {
    snprintf(err, errlen, "pointer map holds %zu blocks, segments hold %zu live ones", h->live.count, rc.live_blocks);
    bad = 1;
  }
  torchalloc_stats exported;
  const torchalloc_stats *s = &exported;
  ta_stats_export(&h->stats, &h->pending_stats, &exported);
  bad = bad || compare("allocation", s->allocation, rc.allocation, err, errlen) ||
        compare("allocated_bytes", s->allocated_bytes, rc.allocated_bytes, err, errlen) ||
        compare("requested_bytes", s->requested_bytes, rc.requested_bytes, err, errlen) ||
        compare("active", s->active, rc.active, err, errlen) ||
        compare("active_bytes", s->active_bytes, rc.active_bytes, err, errlen) ||
        compare("segment", s->segment, rc.segment, err, errlen) ||
        compare("reserved_bytes", s->reserved_bytes, rc.reserved_bytes, err, errlen) ||
        compare("inactive_split", s->inactive_split, rc.inactive_split, err, errlen) ||
        compare("inactive_split_bytes", s->inactive_split_bytes, rc.inactive_split_bytes, err, errlen);
  ta_lock_release(&h->lock);
  return bad ? -1 : 0;
}
