/* `exact`: one device allocation per request (rounded to 512 B), returned to
 * the device on free. No cache, no slack: the program's own pattern, and a
 * fit for compute-sanitizer, which cannot see overruns into cached slack. */
#include "policy/policy.h"
#include "segments/services.h"
#include "policy_list.h"
#include "parts/size_classes.h"

static ta_policy *exact_create(ta_segments *segments, uint8_t id, unsigned flags) {
  /* nothing to grow: every request is its own allocation */
  return ta_policy_new(sizeof(ta_policy), &ta_exact_policy, segments, id, flags & ~TA_POLICY_EXPANDABLE);
}

static ta_block *exact_malloc(ta_policy *p, size_t size, cudaStream_t stream, int phase) {
  (void)phase;
  size_t rounded = ta_round_size(size);
  ta_segment *seg = ta_segments_alloc(p->segments, rounded, stream, ta_pool_for(rounded), p, p);
  if (!seg) return NULL;
  seg->first->state = TA_BLOCK_LIVE;
  return seg->first;
}

static void exact_free(ta_policy *p, ta_block *b) {
  b->state = TA_BLOCK_FREE;
  b->requested = 0;
  ta_segments_release(p->segments, b->segment);
}

static size_t exact_release_cached(ta_policy *p) {
  (void)p;
  return 0; /* nothing is ever cached */
}

const ta_policy_ops ta_exact_policy = {
    .name = "exact",
    .create = exact_create,
    .destroy = ta_policy_delete,
    .malloc = exact_malloc,
    .free = exact_free,
    .pool_for = ta_size_class_pool,
    .release_cached = exact_release_cached,
    .frees_to_device = 1,
};
