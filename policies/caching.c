/* `caching`: PyTorch's caching allocator, observably — one arena for the
 * whole device, blocks split and coalesced, reuse per stream. */
#include <stdlib.h>

#include "parts/arena.h"
#include "parts/size_classes.h"
#include "policy_list.h"

typedef struct caching_policy {
  ta_policy base;
  ta_arena *arena;
} caching_policy;

static ta_policy *caching_create(ta_segments *segments, uint8_t id, unsigned flags) {
  caching_policy *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->base.ops = &ta_caching_policy;
  p->base.segments = segments;
  p->base.id = id;
  p->base.flags = flags;
  p->arena = ta_arena_create(segments, &p->base);
  if (!p->arena) {
    free(p);
    return NULL;
  }
  return &p->base;
}

static void caching_destroy(ta_policy *base) {
  caching_policy *p = (caching_policy *)base;
  ta_arena_destroy(p->arena);
  free(p);
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
