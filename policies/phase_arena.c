/* `phase_arena`: one arena per phase. A request made in phase P is served
 * from P's segments and a block returns to the arena that made it, so
 * long-lived blocks (optimizer state, gradients) never pin segments that
 * short-lived activations churn through. */
#include "parts/arena.h"
#include "parts/size_classes.h"
#include "policy_list.h"

#define NARENAS TORCHALLOC_MAX_PHASES

typedef struct phase_arena_policy {
  ta_policy base;
  ta_arena *arenas[NARENAS];
  ta_arena *family; /* the arenas made so far, linked: reclaim moves memory between them */
} phase_arena_policy;

static ta_policy *phase_arena_create(ta_segments *segments, uint8_t id, unsigned flags) {
  return ta_policy_new(sizeof(phase_arena_policy), &ta_phase_arena_policy, segments, id, flags);
}

static void phase_arena_destroy(ta_policy *base) {
  phase_arena_policy *p = (phase_arena_policy *)base;
  for (int i = 0; i < NARENAS; i++) ta_arena_destroy(p->arenas[i]);
  ta_policy_delete(base);
}

static ta_block *phase_arena_malloc(ta_policy *base, size_t size, cudaStream_t stream, int phase) {
  phase_arena_policy *p = (phase_arena_policy *)base;
  ta_arena *a = p->arenas[phase];
  if (ta_unlikely(!a)) {
    a = p->arenas[phase] = ta_arena_create(base->segments, base);
    if (!a) return NULL;
    ta_arena_join(a, &p->family);
  }
  return ta_arena_malloc(a, size, stream);
}

static void phase_arena_free(ta_policy *base, ta_block *b) {
  (void)base;
  ta_arena_free((ta_arena *)b->owner, b);
}

static size_t arena_reserved(ta_policy *base, int phase) {
  phase_arena_policy *p = (phase_arena_policy *)base;
  size_t total = 0;
  for (int i = 0; i < NARENAS; i++)
    if (p->arenas[i] && (phase < 0 || phase == i)) total += ta_arena_reserved(p->arenas[i]);
  return total;
}

static size_t arena_release(ta_policy *base, int phase) {
  phase_arena_policy *p = (phase_arena_policy *)base;
  size_t released = 0;
  for (int i = 0; i < NARENAS; i++)
    if (p->arenas[i] && (phase < 0 || phase == i)) released += ta_arena_release_cached(p->arenas[i]);
  return released;
}

static size_t release_all(ta_policy *base) { return arena_release(base, -1); }

const ta_policy_ops ta_phase_arena_policy = {
    .name = "phase_arena",
    .create = phase_arena_create,
    .destroy = phase_arena_destroy,
    .malloc = phase_arena_malloc,
    .free = phase_arena_free,
    .pool_for = ta_size_class_pool,
    .release_cached = release_all,
    .arena_reserved = arena_reserved,
    .arena_release = arena_release,
};
