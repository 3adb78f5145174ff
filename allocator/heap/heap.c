/* The per-device heap (heap.h): everything around a policy.
 *
 * Fast path of malloc: lock, policy->malloc (an O(1) bin lookup), pointer
 * map insert, five stat updates, unlock. Everything rare (device OOM and the
 * retry, misuse, growth) lives in noinline functions below. */
#include "heap/heap.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log/log.h"
#include "accounting/misuse.h"

/* Event log (log.h): when off, one atomic load per call. */
#define LOGGING(h) (ta_unlikely(ta_log_on()) && (h)->seg.logged)

/* ------------------------------------------------------------------------
 * Create / destroy
 * ---------------------------------------------------------------------- */

static ta_policy *policy_get(ta_heap *h, uint8_t id) TA_REQUIRES(h->lock) {
  static const unsigned by_mode[] = {[TA_EXPANDABLE_OFF] = 0,
                                     [TA_EXPANDABLE_GROW] = TA_POLICY_EXPANDABLE,
                                     [TA_EXPANDABLE_COMPACT] = TA_POLICY_EXPANDABLE | TA_POLICY_COMPACT,
                                     [TA_EXPANDABLE_RECLAIM] = TA_POLICY_EXPANDABLE | TA_POLICY_RECLAIM};
  unsigned flags = by_mode[h->conf->expandable];
  if (!h->policies[id]) h->policies[id] = ta_policy_by_id(id)->create(&h->seg, id, flags);
  return h->policies[id];
}

ta_heap *ta_heap_create(ta_backend *backend, int device, const ta_config *conf, const ta_heap_options *options,
                        char *err, size_t errlen) {
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
  h->roundup = conf->roundup;
  h->capture_reuse = conf->capture_reuse;
  h->stats.version = TORCHALLOC_STATS_VERSION;
  ta_segments_init(&h->seg, backend, device, &h->stats, conf->large_handle, conf->large_handle_set,
                   conf->run_bytes);
  ta_segments_moves_init(&h->seg, (unsigned)conf->move_time, conf->grow_below);
  h->seg.logged = options->logged;
  h->seg.census = options->census; /* before the first policy, which takes it from the segment layer */
  ta_lock_acquire(&h->lock); /* no other thread has the heap yet: as everywhere, policies are made under it */
  h->current = policy_get(h, id);
  ta_lock_release(&h->lock);
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
  ta_heap_pools_destroy(h);
  ta_backend *backend = h->seg.backend;
  for (size_t i = 0; i < h->npending; i++) {
    for (int e = 0; e < h->pending[i].nevents; e++)
      backend->ops->event_release(backend, h->device, h->pending[i].events[e]);
    free(h->pending[i].events);
  }
  free(h->pending);
  ta_segments_ipc_teardown(&h->seg);
  ta_segments_expandable_teardown(&h->seg);
  ta_segments_destroy(&h->seg);
  ta_ptrmap_destroy(&h->live);
  free(h->oom_report);
  free(h);
}

/* ------------------------------------------------------------------------
 * malloc / free
 * ---------------------------------------------------------------------- */

/* Returns the drop in reserved bytes: handing back a pending block can
 * release a segment too (exact frees straight to the device). Nothing while
 * routing: a capture may be underway, and synchronizing would break it. */
static size_t release_cached_locked(ta_heap *h) TA_REQUIRES(h->lock) {
  if (ta_heap_capture_anywhere(h)) return 0; /* device frees and synchronizes would break a capture */
  int64_t before = ta_stat_total(h->stats.reserved_bytes);
  ta_segments_synchronize(&h->seg); /* queued kernels may still use cached blocks */
  if (h->npending) ta_heap_process_pending(h);    /* after the synchronize, every event is done */
  for (int i = 0; i < TA_MAX_POLICIES; i++)
    if (h->policies[i]) h->policies[i]->ops->release_cached(h->policies[i]);
  if (h->npools) ta_heap_release_freeable_pools(h);
  return (size_t)(before - ta_stat_total(h->stats.reserved_bytes));
}

void ta_heap_last_oom(ta_heap *h, ta_oom_info *out) {
  ta_lock_acquire(&h->lock);
  *out = h->oom;
  ta_lock_release(&h->lock);
}

/* The device said no: release every fully free cached segment, retry once
 * (not while routing: see release_cached_locked), and again after large
 * handles gave back their free granules; then, for a request
 * outside any pool, a free block of a use_on_oom pool. */
static ta_noinline ta_block *malloc_retry(ta_heap *h, ta_policy *policy, size_t size, cudaStream_t stream,
                                          int phase) TA_REQUIRES(h->lock) {
  ta_block *b = NULL;
  if (!h->routing) {
    h->stats.num_alloc_retries++;
    size_t released = release_cached_locked(h);
    if (LOGGING(h)) ta_log_trim(h->device, released, phase, TA_LOG_TRIM_OOM_RETRY);
    b = policy->ops->malloc(policy, size, stream, phase);
    /* Large handles holding free 2 MiB granules: replaced, so those go back
     * too (the device is idle: release_cached_locked synchronized). */
    if (!b && !ta_heap_capture_anywhere(h)) {
      release_cached_locked(h); /* what the failed try mapped for itself */
      if (ta_segments_split_free(&h->seg, size)) b = policy->ops->malloc(policy, size, stream, phase);
    }
  }
  if (!b && policy == h->current && h->npools) b = ta_heap_pools_serve_oom(h, size, stream, phase);
  if (!b) {
    h->stats.num_ooms++;
    ta_heap_note_oom(h, policy, size, stream, phase);
    if (LOGGING(h)) ta_log_oom(h->device, &h->oom.facts, stream, phase, h->oom.verdict, h->oom.detail.granule);
  }
  return b;
}

/* The caller's allocation: the bytes become allocated. Values are kept in
 * registers rather than re-read from fields just stored (see stats.h). */
static inline void count_alloc(ta_heap *h, const ta_block *b) TA_REQUIRES(h->lock) {
  int pool = ta_block_pool(b);
  int64_t size = (int64_t)b->size, requested = (int64_t)b->requested;
  ta_phase_acct *pa = &h->phases[b->phase];
  if (ta_unlikely(pa->epoch != b->phase_epoch)) { /* first request of a new occurrence */
    pa->epoch = b->phase_epoch;
    pa->occ_alloc = pa->occ_freed = 0;
  }
  int64_t allocated = ta_stat_total(h->stats.allocated_bytes) + size;
  ta_stats_add(h->stats.allocation, pool, 1);
  ta_stats_add(h->stats.allocated_bytes, pool, size);
  ta_stats_add(h->stats.requested_bytes, pool, requested);
  int64_t live = pa->pub.live_bytes + size;
  pa->occ_alloc += size;
  pa->pub.allocated_bytes += size;
  pa->pub.allocated_count++;
  pa->pub.live_bytes = live;
  if (live > pa->pub.live_peak_bytes) pa->pub.live_peak_bytes = live;
  if (allocated > pa->pub.peak_allocated_bytes) pa->pub.peak_allocated_bytes = allocated;
}

/* The caller's free: the bytes stop being allocated. */
static inline void count_free(ta_heap *h, const ta_block *b, int phase_now) TA_REQUIRES(h->lock) {
  int pool = ta_block_pool(b);
  int64_t size = (int64_t)b->size, requested = (int64_t)b->requested;
  ta_phase_acct *pa = &h->phases[b->phase];
  pa->pub.live_bytes -= size;
  /* Transient: allocated in this occurrence of its phase, freed before it ended. */
  if (b->phase_epoch == pa->epoch &&
      b->phase_epoch == atomic_load_explicit(&ta_phase_open_epoch[b->phase], memory_order_relaxed))
    pa->occ_freed += size;
  h->phases[phase_now].pub.freed_bytes += size;
  h->phases[phase_now].pub.freed_count++;
  ta_stats_sub(h->stats.allocation, pool, 1);
  ta_stats_sub(h->stats.allocated_bytes, pool, size);
  ta_stats_sub(h->stats.requested_bytes, pool, requested);
  /* Only a large block's free asks whether the first ramp is over: a step's activations going are large
   * blocks, and a small free that crossed the line is seen at the next large one. Why: until the ramp ends the
   * question is asked at every free it reaches, and most frees are of small blocks. */
  if (pool == TORCHALLOC_POOL_LARGE) ta_segments_note_allocated(&h->seg, ta_stat_total(h->stats.allocated_bytes));
}

void *ta_heap_malloc(ta_heap *h, size_t size, cudaStream_t stream) {
  ta_phase_now now = ta_phase_read();
  return ta_heap_malloc_in_phase(h, size, stream, now.id, now.epoch);
}

/* malloc from `policy` with the OOM retry (lock held). */
static inline ta_block *malloc_locked(ta_heap *h, ta_policy *policy, size_t size, cudaStream_t stream, int phase,
                                      uint32_t epoch) TA_REQUIRES(h->lock) {
  h->seg.phase = phase;
  if (ta_unlikely(h->npending != 0)) {
    if (!h->routing) ta_heap_process_pending(h);
    else if (h->capture_reuse) ta_heap_reuse_in_capture(h, stream);
  }
  /* Rounded here, not in each policy: every policy, private pools and replay get PyTorch's sizes. */
  size_t ask = ta_unlikely(h->roundup.any) ? ta_roundup_size(&h->roundup, size) : size;
  ta_block *b = policy->ops->malloc(policy, ask, stream, phase);
  if (ta_unlikely(!b)) b = malloc_retry(h, policy, ask, stream, phase);
  if (ta_unlikely(b == NULL)) return NULL;
  if (ta_unlikely(ta_ptrmap_put(&h->live, b->addr, b) != 0)) {
    policy->ops->free(policy, b); /* host OOM: give it back */
    return NULL;
  }
  b->requested = size;
  b->phase = (uint16_t)phase;
  b->phase_epoch = epoch;
  b->alloc_seq = h->alloc_seq++;
  count_alloc(h, b);
  if (LOGGING(h)) ta_log_alloc(h->device, b);
  return b;
}

void *ta_heap_malloc_in_phase(ta_heap *h, size_t size, cudaStream_t stream, int phase, uint32_t epoch) {
  ta_lock_acquire(&h->lock);
  ta_block *b = malloc_locked(h, h->current, size, stream, phase, epoch);
  ta_lock_release(&h->lock);
  return b ? (void *)b->addr : NULL;
}

void *ta_heap_pool_malloc(ta_heap *h, size_t size, cudaStream_t stream, const uint64_t id[2]) {
  ta_phase_now now = ta_phase_read();
  ta_lock_acquire(&h->lock);
  ta_policy *pool = ta_heap_pool_policy(h, id);
  /* The request holds its pool: the OOM retry releases freeable pools (use
   * count 0) and must not destroy this one under it (found by fuzz_api). */
  if (pool) ta_heap_pool_hold(h, id, 1);
  ta_block *b = pool ? malloc_locked(h, pool, size, stream, now.id, now.epoch) : NULL;
  if (pool) ta_heap_pool_hold(h, id, -1);
  ta_lock_release(&h->lock);
  return b ? (void *)b->addr : NULL;
}

/* Why `addr` is not a live block. A block start that is free or waiting for
 * its streams, or an address freed recently (its segment may be gone since:
 * exact, empty_cache), was handed out and freed already: a double free.
 * Anything else, an address inside a block included, was never handed out. */
static int was_freed(ta_heap *h, uintptr_t addr) TA_REQUIRES(h->lock) {
  ta_segment *s = ta_segments_find(&h->seg, addr);
  for (ta_block *b = s ? s->first : NULL; b && b->addr <= addr; b = b->next)
    if (b->addr == addr) return b->state != TA_BLOCK_LIVE || ta_ptrmap_get(&h->live, addr) != NULL;
  for (int i = 0; i < TA_RECENT_FREES; i++)
    if (h->recent_frees[i] == addr) return 1;
  return 0;
}

static ta_noinline void report_bad_free(ta_heap *h, uintptr_t addr) TA_REQUIRES(h->lock) {
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

/* The caller's free of live block `b` (lock held). While routing here or
 * on another device, a block whose policy would hand its memory straight
 * back to the device waits (a device free during a capture invalidates
 * it, whichever device captures). */
static inline void free_locked(ta_heap *h, ta_block *b, int phase) TA_REQUIRES(h->lock) {
  if (LOGGING(h)) ta_log_free(h->device, b, phase, b->uses ? TA_LOG_FREE_DEFERRED : 0);
  count_free(h, b, phase);
  h->recent_frees[h->recent_pos++ % TA_RECENT_FREES] = b->addr;
  if (ta_unlikely(b->uses != NULL) ||
      (b->segment->policy_instance->ops->frees_to_device && ta_unlikely(ta_heap_capture_anywhere(h))))
    ta_heap_defer_free(h, b);
  else ta_heap_release_block(h, b);
}

/* A free whose size or stream is not the live block's is most likely a
 * stale free of an address since handed to someone else: freeing it would
 * corrupt their data, so the block stays allocated. */
static ta_noinline void report_mismatched_free(ta_heap *h, const ta_block *b, size_t size, cudaStream_t stream)
    TA_REQUIRES(h->lock) {
  if (b->requested != size) {
    h->stats.num_bad_free_size++;
    ta_misuse_report(h->conf->warn, TA_MISUSE_FREE_SIZE,
                     "free of %p with size %zu, but it was allocated with size %zu; ignored, the block stays "
                     "allocated",
                     (void *)b->addr, size, b->requested);
  } else {
    h->stats.num_bad_free_stream++;
    ta_misuse_report(h->conf->warn, TA_MISUSE_FREE_STREAM,
                     "free of %p on stream %p, but it was allocated on stream %p (a stale free of a reused "
                     "address?); ignored, the block stays allocated",
                     (void *)b->addr, (void *)stream, (void *)b->stream);
  }
}

/* `check_stream`: the caller's free names the allocation stream, as PyTorch
 * always does; replay's does not (a trace may free on another stream). */
static inline void free_checked(ta_heap *h, void *ptr, size_t size, cudaStream_t stream, int check_stream,
                                int phase) {
  uintptr_t addr = (uintptr_t)ptr;
  ta_lock_acquire(&h->lock);
  h->seg.phase = phase;
  ta_block *b = ta_ptrmap_get(&h->live, addr);
  if (ta_unlikely(!b || b->state != TA_BLOCK_LIVE)) report_bad_free(h, addr);
  else if (ta_unlikely(b->requested != size || (check_stream && b->stream != stream)))
    report_mismatched_free(h, b, size, stream);
  else free_locked(h, b, phase);
  ta_lock_release(&h->lock);
}

void ta_heap_count_host_time(ta_heap *h, uint64_t ns) {
  __atomic_fetch_add(&h->stats.host_ns, (int64_t)ns, __ATOMIC_RELAXED);
  __atomic_fetch_add(&h->stats.timed_calls, 1, __ATOMIC_RELAXED);
}

void ta_heap_free(ta_heap *h, void *ptr, size_t size, cudaStream_t stream) {
  free_checked(h, ptr, size, stream, 1, ta_phase_current());
}

void ta_heap_free_in_phase(ta_heap *h, void *ptr, size_t size, cudaStream_t stream, int phase) {
  free_checked(h, ptr, size, stream, 0, phase);
}

ta_noinline void ta_heap_report_bad_size(ta_heap *h, size_t size) {
  ta_lock_acquire(&h->lock);
  h->stats.num_bad_size++;
  ta_lock_release(&h->lock);
  ta_misuse_report(h->conf->warn, TA_MISUSE_BAD_SIZE,
                   "request of %zu bytes on device %d is beyond any device (limit %zu); returning NULL", size,
                   h->device, (size_t)TA_MAX_REQUEST);
}

void ta_heap_report_bad_free(ta_heap *h, uintptr_t addr) {
  ta_lock_acquire(&h->lock);
  report_bad_free(h, addr);
  ta_lock_release(&h->lock);
}

int ta_heap_free_if_live(ta_heap *h, void *ptr) {
  int phase = ta_phase_current();
  ta_lock_acquire(&h->lock);
  ta_block *b = ta_ptrmap_get(&h->live, (uintptr_t)ptr);
  int found = b && b->state == TA_BLOCK_LIVE;
  if (found) {
    h->seg.phase = phase;
    free_locked(h, b, phase);
  }
  ta_lock_release(&h->lock);
  return found;
}

/* ------------------------------------------------------------------------
 * A private pool back to a checkpoint (CUDA graph trees)
 * ---------------------------------------------------------------------- */

/* The live blocks of `policy`'s segments (lock held): a malloc'ed array. */
static uintptr_t *live_blocks_of(ta_heap *h, const ta_policy *policy, size_t *n) TA_REQUIRES(h->lock) {
  const ta_segment_registry *r = &h->seg.registry;
  size_t count = 0, cap = 16;
  uintptr_t *out = malloc(cap * sizeof *out);
  for (size_t i = 0; out && i < r->count; i++) {
    if (r->items[i]->policy_instance != policy) continue;
    for (const ta_block *b = r->items[i]->first; out && b; b = b->next) {
      if (b->state != TA_BLOCK_LIVE) continue;
      if (ta_grow(&out, &cap, count + 1, 16)) {
        free(out);
        out = NULL;
        break;
      }
      out[count++] = b->addr;
    }
  }
  *n = count;
  return out;
}

int ta_heap_pool_restore(ta_heap *h, const uint64_t id[2], const torchalloc_block_info *live, size_t n,
                         uint64_t *freed, size_t freed_cap, size_t *nfreed, char *err, size_t errlen) {
  ta_phase_now now = ta_phase_read();
  ta_lock_acquire(&h->lock);
  h->seg.phase = now.id;
  int rc = -1;
  size_t nlive = 0;
  uintptr_t *was_live = NULL;
  ta_policy *pool = NULL;
  for (size_t i = 0; i < h->npools; i++)
    if (h->pools[i].id[0] == id[0] && h->pools[i].id[1] == id[1]) pool = h->pools[i].policy;
  if (!pool || !pool->ops->claim) {
    snprintf(err, errlen, "no private pool (%llu, %llu) on device %d", (unsigned long long)id[0],
             (unsigned long long)id[1], h->device);
    goto out;
  }
  /* Everything the pool hands out now is freed; the checkpoint's live
   * blocks are then carved again at their addresses. */
  was_live = live_blocks_of(h, pool, &nlive);
  if (!was_live) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
  *nfreed = nlive;
  for (size_t i = 0; i < nlive; i++) {
    if (i < freed_cap) freed[i] = was_live[i];
    free_locked(h, ta_ptrmap_get(&h->live, was_live[i]), now.id);
  }
  for (size_t i = 0; i < n; i++) {
    ta_segment *s = ta_segments_find(&h->seg, (uintptr_t)live[i].addr);
    ta_block *b = s && s->policy_instance == pool ? pool->ops->claim(pool, s, (uintptr_t)live[i].addr,
                                                                     (size_t)live[i].size)
                                                  : NULL;
    if (!b || ta_ptrmap_put(&h->live, b->addr, b) != 0) {
      if (b) pool->ops->free(pool, b);
      snprintf(err, errlen, "cannot restore block %#llx (%llu bytes) of pool (%llu, %llu): the pool's segments "
               "no longer match its checkpoint", (unsigned long long)live[i].addr, (unsigned long long)live[i].size,
               (unsigned long long)id[0], (unsigned long long)id[1]);
      goto out;
    }
    b->requested = live[i].requested ? (size_t)live[i].requested : b->size;
    b->phase = (uint16_t)now.id;
    b->phase_epoch = now.epoch;
    count_alloc(h, b);
    if (LOGGING(h)) ta_log_alloc(h->device, b);
  }
  rc = 0;
out:
  free(was_live);
  ta_lock_release(&h->lock);
  return rc;
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

void ta_heap_set_pytorch_settings(ta_heap *h, const ta_roundup *r, int capture_reuse) {
  ta_lock_acquire(&h->lock);
  h->roundup = *r;
  h->capture_reuse = capture_reuse;
  ta_lock_release(&h->lock);
}

void ta_heap_set_limit(ta_heap *h, size_t limit, double fraction) {
  ta_lock_acquire(&h->lock);
  ta_segments_set_limit(&h->seg, limit);
  h->fraction = fraction;
  h->fraction_set = 1;
  ta_lock_release(&h->lock);
}

double ta_heap_fraction(ta_heap *h) {
  ta_lock_acquire(&h->lock);
  double f = h->fraction_set ? h->fraction : -1.0;
  ta_lock_release(&h->lock);
  return f;
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
  for (int i = 0; i < TA_MAX_POLICIES && !h->routing; i++) { /* never during a capture: see release_cached_locked */
    ta_policy *p = h->policies[i];
    if (!p || !p->ops->arena_release) continue;
    if (!synced) { /* queued kernels may still use the cached blocks */
      ta_segments_synchronize(&h->seg);
      synced = 1;
    }
    r += (int64_t)p->ops->arena_release(p, phase);
  }
  if (synced && LOGGING(h)) ta_log_trim(h->device, (size_t)r, now, TA_LOG_TRIM_ARENA);
  ta_lock_release(&h->lock);
  return r;
}
