/* `caching`: PyTorch's caching allocator, observably — one arena for the
 * whole device, blocks split and coalesced, reuse per stream. */
#include "parts/arena.h"
#include "parts/size_classes.h"
#include "policy_list.h"

typedef struct caching_policy {
  ta_policy base;
  ta_arena *arena;
} caching_policy;

static ta_policy *caching_create(ta_segments *segments, uint8_t id, unsigned flags) {
  caching_policy *p = (caching_policy *)ta_policy_new(sizeof *p, &ta_caching_policy, segments, id, flags);
  if (!p) return NULL;
  p->arena = ta_arena_create(segments, &p->base);
  if (!p->arena) {
    ta_policy_delete(&p->base);
    return NULL;
  }
  return &p->base;
}

static void caching_destroy(ta_policy *base) {
  ta_arena_destroy(((caching_policy *)base)->arena);
  ta_policy_delete(base);
}

static ta_block *caching_malloc(ta_policy *base, size_t size, cudaStream_t stream, int phase) {
  (void)phase;
  return ta_arena_malloc(((caching_policy *)base)->arena, size, stream);
}

static void caching_free(ta_policy *base, ta_block *b) {
  (void)base;
  ta_arena_free((ta_arena *)b->owner, b);
}

static ta_block *caching_claim(ta_policy *base, ta_segment *seg, uintptr_t addr, size_t size) {
  return ta_arena_claim(((caching_policy *)base)->arena, seg, addr, size);
}

static size_t caching_release_cached(ta_policy *base) {
  return ta_arena_release_cached(((caching_policy *)base)->arena);
}

const ta_policy_ops ta_caching_policy = {
    .name = "caching",
    .create = caching_create,
    .destroy = caching_destroy,
    .malloc = caching_malloc,
    .free = caching_free,
    .pool_for = ta_size_class_pool,
    .release_cached = caching_release_cached,
    .claim = caching_claim,
};
