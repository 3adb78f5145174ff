/* The per-device heap (heap.h): everything around a policy.
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

/* Event log (log.h): when off, one atomic load per call. */
#define LOGGING(h) (ta_unlikely(ta_log_on()) && (h)->seg.logged)

/* ------------------------------------------------------------------------
 * Create / destroy
 * ---------------------------------------------------------------------- */

static ta_policy *policy_get(ta_heap *h, uint8_t id) {
  if (!h->policies[id]) h->policies[id] = ta_policy_by_id(id)->create(&h->seg, id);
  return h->policies[id];
}

ta_heap *ta_heap_create(ta_backend *backend, int device, const ta_config *conf, int logged, char *err,
                        size_t errlen) {
  uint8_t id;
  if (!ta_policy_by_name(conf->policy, &id)) {
    snprintf(err, errlen, "unknown policy '%s' (expected %s)", conf->policy, ta_policy_choices());
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
  h->conf = conf;
  h->stats.version = TORCHALLOC_STATS_VERSION;
  ta_segments_init(&h->seg, backend, device, &h->stats);
  h->seg.logged = logged;
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
  /* Policies first: they release their free segments and their indexes;
   * then the segment layer returns what is left, live blocks included. */
  for (int i = 0; i < TA_MAX_POLICIES; i++)
    if (h->policies[i]) h->policies[i]->ops->destroy(h->policies[i]);
  ta_backend *backend = h->seg.backend;
  for (size_t i = 0; i < h->npending; i++) {
    for (int e = 0; e < h->pending[i].nevents; e++)
      backend->ops->event_release(backend, h->device, h->pending[i].events[e]);
    free(h->pending[i].events);
  }
  free(h->pending);
  ta_segments_destroy(&h->seg);
  ta_ptrmap_destroy(&h->live);
  free(h);
}

/* ------------------------------------------------------------------------
 * malloc / free
 * ---------------------------------------------------------------------- */

/* Returns the drop in reserved bytes: handing back a pending block can
 * release a segment too (exact frees straight to the device). */
static size_t release_cached_locked(ta_heap *h) {
  int64_t before = ta_stat_total(h->stats.reserved_bytes);
  ta_backend *backend = h->seg.backend;
  backend->ops->synchronize(backend, h->device); /* queued kernels may still use cached blocks */
  if (h->npending) ta_heap_process_pending(h);    /* after the synchronize, every event is done */
  for (int i = 0; i < TA_MAX_POLICIES; i++)
    if (h->policies[i]) h->policies[i]->ops->release_cached(h->policies[i]);
  return (size_t)(before - ta_stat_total(h->stats.reserved_bytes));
}

static void report_oom(ta_heap *h, size_t size) {
  size_t free_b = 0, total_b = 0;
  ta_backend *backend = h->seg.backend;
  backend->ops->mem_info(backend, h->device, &free_b, &total_b);
  const torchalloc_stats *s = &h->stats;
  fprintf(stderr,
          "torchalloc: out of memory on %s device %d: tried to allocate %zu bytes; device has %zu of %zu bytes "
          "free; torchalloc holds %" PRId64 " bytes reserved, %" PRId64 " allocated (policy %s)\n",
          backend->ops->name, h->device, size, free_b, total_b, ta_stat_total(s->reserved_bytes),
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

void *ta_heap_malloc(ta_heap *h, size_t size, cudaStream_t stream) {
  ta_phase_now now = ta_phase_read();
  return ta_heap_malloc_in_phase(h, size, stream, now.id, now.epoch);
}

void *ta_heap_malloc_in_phase(ta_heap *h, size_t size, cudaStream_t stream, int phase, uint32_t epoch) {
  ta_lock_acquire(&h->lock);
  h->seg.phase = phase;
  if (ta_unlikely(h->npending != 0)) ta_heap_process_pending(h);
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
  ta_segment *s = ta_segments_find(&h->seg, addr);
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

void ta_heap_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  ta_heap_free_in_phase(h, ptr, size, stream, ta_phase_current());
}

void ta_heap_free_in_phase(ta_heap *h, void *ptr, size_t size, cudaStream_t stream, int phase) {
  (void)stream; /* the block knows its stream; torch passes the same one */
  uintptr_t addr = (uintptr_t)ptr;
  ta_lock_acquire(&h->lock);
  h->seg.phase = phase;
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
    if (ta_unlikely(b->uses != NULL)) ta_heap_defer_free(h, b);
    else ta_heap_release_block(h, b);
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
  h->seg.limit = limit;
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
  h->seg.phase = phase;
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
  out->reserved_growth_bytes = h->seg.phase_growth[phase];
  out->reserved_released_bytes = h->seg.phase_released[phase];
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
  int64_t r = 0;
  for (int i = 0; i < TA_MAX_POLICIES; i++) {
    ta_policy *p = h->policies[i];
    if (p && p->ops->arena_reserved) r += (int64_t)p->ops->arena_reserved(p, phase);
  }
  ta_lock_release(&h->lock);
  return r;
}

int64_t ta_heap_arena_release(ta_heap *h, int phase) {
  int now = ta_phase_current();
  ta_lock_acquire(&h->lock);
  h->seg.phase = now;
  int64_t r = 0;
  int synced = 0;
  for (int i = 0; i < TA_MAX_POLICIES; i++) {
    ta_policy *p = h->policies[i];
    if (!p || !p->ops->arena_release) continue;
    if (!synced) { /* queued kernels may still use the cached blocks */
      h->seg.backend->ops->synchronize(h->seg.backend, h->device);
      synced = 1;
    }
    r += (int64_t)p->ops->arena_release(p, phase);
  }
  if (synced && LOGGING(h)) ta_log_trim(h->device, (size_t)r, now, TA_LOG_TRIM_ARENA);
  ta_lock_release(&h->lock);
  return r;
}
