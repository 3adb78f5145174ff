/* The segment layer (segments.h): slab, registry, device segments. */
#include "segments/segments.h"

#include <stdlib.h>
#include <string.h>

#include "log/log.h"
#include "accounting/observer.h"
#include "accounting/stats.h"

/* ------------------------------------------------------------------------
 * Block slab
 * ---------------------------------------------------------------------- */

#define SLAB_BLOCKS 256

static ta_noinline int slab_grow(ta_block_slab *s) {
  if (ta_grow(&s->chunks, &s->cap_chunks, s->nchunks + 1, 16)) return -1;
  ta_block *chunk = calloc(SLAB_BLOCKS, sizeof *chunk); /* zeroed: destroy reads .state */
  if (!chunk) return -1;
  s->chunks[s->nchunks++] = chunk;
  for (int i = 0; i < SLAB_BLOCKS; i++) {
    chunk[i].next = s->free_list;
    s->free_list = &chunk[i];
  }
  return 0;
}

ta_block *ta_segments_block_new(ta_segments *seg) {
  ta_block_slab *s = &seg->slab;
  if (ta_unlikely(!s->free_list) && slab_grow(s)) return NULL;
  ta_block *b = s->free_list;
  s->free_list = b->next;
  return b; /* uninitialised: every caller sets all fields */
}

void ta_segments_block_delete(ta_segments *seg, ta_block *b) {
  b->next = seg->slab.free_list;
  seg->slab.free_list = b;
}

/* ------------------------------------------------------------------------
 * Registry (sorted by address)
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
  if (ta_grow(&r->items, &r->cap, r->count + 1, 64)) return -1;
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

int ta_segments_register(ta_segments *seg, ta_segment *s) { return registry_insert(&seg->registry, s); }
void ta_segments_unregister(ta_segments *seg, ta_segment *s) { registry_remove(&seg->registry, s); }

ta_segment *ta_segments_find(const ta_segments *seg, uintptr_t addr) {
  const ta_segment_registry *r = &seg->registry;
  size_t i = registry_upper(r, addr);
  if (i == 0) return NULL;
  ta_segment *s = r->items[i - 1];
  return addr < s->addr + s->size ? s : NULL;
}

/* ------------------------------------------------------------------------
 * Segments
 * ---------------------------------------------------------------------- */

#define LOGGING(seg) (ta_unlikely(ta_log_on()) && (seg)->logged)

ta_segment_source *ta_segment_source_new(const torchalloc_pool_source *pub) {
  ta_segment_source *src = malloc(sizeof *src);
  if (src) *src = (ta_segment_source){.pub = *pub, .refs = 1};
  return src;
}

void ta_segment_source_drop(ta_segment_source *src) {
  if (!src || --src->refs > 0) return;
  if (src->pub.release) src->pub.release(src->pub.ctx);
  free(src);
}

/* Device memory for a segment: from the policy's own source, or the backend. */
static int take_memory(ta_segments *seg, ta_segment_source *src, size_t size, cudaStream_t stream, uintptr_t *addr) {
  if (!src) return seg->backend->ops->alloc(seg->backend, seg->device, size, addr);
  void *p = src->pub.alloc(src->pub.ctx, size, seg->device, stream);
  *addr = (uintptr_t)p;
  return p ? TA_OK : TA_ENOMEM;
}

static void give_memory(ta_segments *seg, ta_segment_source *src, uintptr_t addr, size_t size, cudaStream_t stream) {
  if (src) src->pub.free(src->pub.ctx, (void *)addr, size, seg->device, stream);
  else seg->backend->ops->free(seg->backend, seg->device, addr, size);
}

ta_segment *ta_segments_alloc(ta_segments *seg, size_t size, cudaStream_t stream, int pool, void *owner,
                              ta_policy *policy) {
  ta_segment *s = malloc(sizeof *s);
  ta_block *b = ta_segments_block_new(seg);
  uintptr_t addr = 0;
  ta_segment_source *src = policy->source;
  if (!s || !b || seg->no_new_segments) goto fail;
  if (seg->limit && (size_t)ta_stat_total(seg->stats->reserved_bytes) + size > seg->limit) goto fail;
  if (take_memory(seg, src, size, stream, &addr) != TA_OK) goto fail;
  *s = (ta_segment){.addr = addr, .size = size, .stream = stream, .first = b, .owner = owner,
                    .policy_instance = policy, .source = src, .pool = (uint8_t)pool, .policy = policy->id};
  if (registry_insert(&seg->registry, s)) {
    give_memory(seg, src, addr, size, stream);
    goto fail;
  }
  if (src) src->refs++;
  *b = (ta_block){.addr = addr, .size = size, .segment = s, .stream = stream, .owner = owner, .policy = policy->id,
                  .state = TA_BLOCK_FREE};
  s->last = b;
  ta_stats_add(seg->stats->segment, pool, 1);
  ta_segments_account(seg, s, addr, size, +1);
  return s;
fail:
  free(s);
  if (b) ta_segments_block_delete(seg, b);
  return NULL;
}

/* An expandable segment's records say its policy's mode, so that a report
 * replays the variant that recorded the log (all three map the same way). */
static uint8_t log_flags(const ta_segment *s) {
  if (!s->expansion) return 0;
  unsigned mode = s->policy_instance ? s->policy_instance->flags : 0;
  return (uint8_t)(TA_LOG_SEGMENT_EXPANDABLE | (mode & TA_POLICY_COMPACT ? TA_LOG_SEGMENT_COMPACT : 0) |
                   (mode & TA_POLICY_RECLAIM ? TA_LOG_SEGMENT_RECLAIM : 0));
}

/* The log's DEVICE record, before the device's first segment in the file. */
static ta_noinline void tell_device(const ta_segments *seg) {
  size_t free_b = 0, total = 0;
  if (seg->backend->ops->mem_info(seg->backend, seg->device, &free_b, &total) != TA_OK) total = 0;
  ta_log_device(seg->device, total, seg->limit);
}

void ta_segments_set_limit(ta_segments *seg, size_t limit) {
  seg->limit = limit;
  /* a new limit is said at once (a reader takes the device's last record) */
  if (LOGGING(seg)) {
    ta_log_device_untold(seg->device);
    tell_device(seg);
  }
}

void ta_segments_account(ta_segments *seg, const ta_segment *s, uintptr_t addr, size_t bytes, int sign) {
  if (sign > 0) {
    seg->stats->num_device_alloc++;
    seg->phase_growth[seg->phase] += (int64_t)bytes;
    ta_stats_add(seg->stats->reserved_bytes, s->pool, (int64_t)bytes);
    if (ta_stat_total(seg->stats->reserved_bytes) > seg->high_water)
      seg->high_water = ta_stat_total(seg->stats->reserved_bytes);
  } else {
    seg->stats->num_device_free++;
    seg->phase_released[seg->phase] += (int64_t)bytes;
    ta_stats_sub(seg->stats->reserved_bytes, s->pool, (int64_t)bytes);
  }
  uint8_t kind = sign > 0 ? TA_LOG_SEGMENT_ALLOC : TA_LOG_SEGMENT_FREE;
  if (LOGGING(seg)) {
    if (sign > 0 && ta_unlikely(ta_log_device_untold(seg->device))) tell_device(seg);
    ta_log_segment(kind, seg->device, s, addr, bytes, seg->phase, log_flags(s));
  }
  if (seg->logged)
    ta_observe_segment(seg->device, sign > 0 ? TORCHALLOC_SEGMENT_ALLOC : TORCHALLOC_SEGMENT_FREE, addr, bytes,
                       s->stream);
}

void ta_segments_release(ta_segments *seg, ta_segment *s) {
  ta_assert(s->first->state == TA_BLOCK_FREE && !s->first->next && !s->expansion);
  give_memory(seg, s->source, s->addr, s->size, s->stream);
  ta_segment_source_drop(s->source);
  ta_segments_account(seg, s, s->addr, s->size, -1);
  registry_remove(&seg->registry, s);
  ta_stats_sub(seg->stats->segment, s->pool, 1);
  ta_segments_block_delete(seg, s->first);
  free(s);
}

void ta_segments_note_inactive_split(ta_segments *seg, const ta_block *b, int sign) {
  int pool = ta_block_pool(b);
  if (sign > 0) {
    ta_stats_add(seg->stats->inactive_split, pool, 1);
    ta_stats_add(seg->stats->inactive_split_bytes, pool, (int64_t)b->size);
  } else {
    ta_stats_sub(seg->stats->inactive_split, pool, 1);
    ta_stats_sub(seg->stats->inactive_split_bytes, pool, (int64_t)b->size);
  }
}

/* ------------------------------------------------------------------------
 * Init / destroy
 * ---------------------------------------------------------------------- */

void ta_segments_init(ta_segments *s, ta_backend *backend, int device, torchalloc_stats *stats,
                      size_t large_handle, int handle_fixed, size_t run_bytes) {
  memset(s, 0, sizeof *s);
  s->backend = backend;
  s->device = device;
  s->stats = stats;
  s->granule = backend->ops->granularity ? backend->ops->granularity(backend, device) : 0;
  s->large_handle = s->granule ? ta_align_up(large_handle, s->granule) : 0;
  s->handle_fixed = handle_fixed;
  s->run_bytes = s->granule ? run_bytes / s->granule * s->granule : 0;
  s->ramp_over = !s->run_bytes; /* no runs (the default): no first ramp to watch, the heap's free skips it */
}

ta_free_census *ta_segments_census(const ta_segments *s) { return s->census; }

void ta_segments_destroy(ta_segments *seg) {
  ta_segment_registry *r = &seg->registry;
  for (size_t i = 0; i < r->count; i++) {
    ta_segment *s = r->items[i];
    ta_assert(!s->expansion); /* ta_segments_expandable_teardown went first */
    give_memory(seg, s->source, s->addr, s->size, s->stream);
    ta_segment_source_drop(s->source);
    free(s);
  }
  free(r->items);
  r->items = NULL;
  r->count = r->cap = 0;
  ta_block_slab *slab = &seg->slab;
  for (size_t i = 0; i < slab->nchunks; i++) {
    ta_block *chunk = slab->chunks[i];
    for (int j = 0; j < SLAB_BLOCKS; j++)
      if (chunk[j].state != TA_BLOCK_FREE) free(chunk[j].uses); /* record_stream lists of blocks never freed */
    free(chunk);
  }
  free(slab->chunks);
  memset(slab, 0, sizeof *slab);
  ta_segments_marks_destroy(seg);
  ta_segments_donors_destroy(seg);
}
