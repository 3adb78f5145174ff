/* The arena (arena.h): split on malloc, coalesce on free, per-stream bins. */
#include "arena.h"

#include <stdlib.h>

#include "arena_streams.h"
#include "segments/services.h"
#include "size_classes.h"

ta_arena *ta_arena_create(ta_segments *segments, ta_policy *policy) {
  ta_arena *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->segments = segments;
  a->policy = policy;
  a->census = ta_segments_census(segments);
  a->expandable = (policy->flags & TA_POLICY_EXPANDABLE) && ta_segments_granule(segments) > 0;
  a->compact = a->expandable && (policy->flags & (TA_POLICY_COMPACT | TA_POLICY_RECLAIM));
  a->reclaim = a->expandable && (policy->flags & TA_POLICY_RECLAIM);
  return a;
}

void ta_arena_join(ta_arena *a, ta_arena **family) {
  a->family = family;
  a->family_next = *family;
  *family = a;
}

/* The arenas reclaim works across: `a`'s family, or `a` alone. */
#define FOR_FAMILY(f, a) for (ta_arena *f = (a)->family ? *(a)->family : (a); f; f = (a)->family ? f->family_next : NULL)

size_t ta_arena_reserved(const ta_arena *a) {
  size_t total = 0;
  for (const ta_segment *s = a->owned; s; s = s->owner_next) total += s->size - s->unmapped;
  return total;
}

/* bins_for's slow path: another stream, or a pool of the stream not used yet. */
static ta_noinline ta_bins *bins_slow(ta_arena *a, cudaStream_t stream, int pool) {
  size_t i = ta_arena_find_stream(a, stream);
  ta_stream_bins *s = i < a->nstreams ? &a->streams[i] : ta_arena_add_stream(a, stream);
  if (!s) return NULL;
  a->last = (size_t)(s - a->streams);
  if (!s->pool[pool]) s->pool[pool] = ta_bins_create();
  return s->pool[pool];
}

/* The free index of `stream` and `pool`; created on first use (a trace may
 * name thousands of streams, most with one pool). NULL only when host
 * memory runs out. */
static inline ta_bins *bins_for(ta_arena *a, cudaStream_t stream, int pool) {
  if (ta_likely(a->nstreams && a->streams[a->last].stream == stream)) {
    ta_bins *bins = a->streams[a->last].pool[pool];
    if (ta_likely(bins != NULL)) return bins;
  }
  return bins_slow(a, stream, pool);
}

/* The census the segment layer carries (replay's), out of the hot path's way. */
static ta_noinline __attribute__((cold)) void tell_census(ta_arena *a, size_t size, int delta) {
  ta_census_note(a->census, size, delta);
}

/* Every block enters and leaves a free index through these two, so the
 * inactive_split stats follow from the block's shape at that moment. */
static inline void put_free(ta_arena *a, ta_bins *bins, ta_block *b) {
  b->state = TA_BLOCK_FREE;
  ta_bins_insert(bins, b);
  if (ta_block_is_split(b)) ta_segments_note_inactive_split(a->segments, b, +1);
  if (ta_unlikely(a->census != NULL)) tell_census(a, b->size, +1);
}

static inline void take_free(ta_arena *a, ta_bins *bins, ta_block *b) {
  ta_bins_remove(bins, b);
  if (ta_block_is_split(b)) ta_segments_note_inactive_split(a->segments, b, -1);
  if (ta_unlikely(a->census != NULL)) tell_census(a, b->size, -1);
}

/* Cut `b` (out of the index) after its first `keep` bytes; the rest, in the
 * descriptor `rest`, becomes a free block of the index. */
static inline void split_after(ta_arena *a, ta_bins *bins, ta_block *b, size_t keep, ta_block *rest) {
  *rest = *b;
  rest->addr = b->addr + keep;
  rest->size = b->size - keep;
  rest->prev = b;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  b->size = keep;
  if (!rest->next) b->segment->last = rest;
  put_free(a, bins, rest);
}

/* ------------------------------------------------------------------------
 * Expandable segments
 * ---------------------------------------------------------------------- */

/* Reclaim: the retiring blocks the device is past (`all`: every one, after
 * a synchronize or at teardown) lose their old addresses and are free again;
 * not `keep` (the end of a range about to grow, which may be retiring) nor
 * one next to it (it would merge away under the caller), which wait for
 * the next time. */
static void retire(ta_arena *a, int all, const ta_block *keep) {
  for (size_t i = 0; i < a->nretiring;) {
    ta_block *r = a->retiring[i];
    if ((!all && !ta_segments_range_past(r->segment, r->addr, r->size)) ||
        (keep && (r == keep || r->next == keep || r->prev == keep))) {
      i++;
      continue;
    }
    a->retiring[i] = a->retiring[--a->nretiring];
    ta_segments_retire(a->segments, r->segment, r->addr, r->size);
    ta_arena_free(a, r); /* back to the index, merged with free neighbours */
  }
}

/* Reclaim: lend up to `want` bytes of mapped granules inside free blocks of
 * `stream`'s segments of this arena (and its family) that the device may
 * still be using (those it is past went first, device-wide): each run is
 * carved out as a retiring block of its arena and its memory becomes
 * donors. Safe without waiting: the donors serve a request of the same
 * stream, whose work runs after what is queued there. Returns the bytes. */
static size_t lend_from(ta_arena *a, cudaStream_t stream, size_t granule, size_t want, const ta_block *keep) {
  size_t got = 0, i = ta_arena_find_stream(a, stream);
  if (i == a->nstreams) return 0;
  /* The stream's expandable segments (its others are ordinary: nothing to
   * lend), the newest first, as they are in the arena's list. */
  ta_segment *segs[2] = {a->streams[i].expandable[TA_POOL_SMALL], a->streams[i].expandable[TA_POOL_LARGE]};
  if (a->streams[i].newest == TA_POOL_LARGE) segs[0] = segs[1], segs[1] = a->streams[i].expandable[TA_POOL_SMALL];
  for (int k = 0; k < 2 && got < want; k++) {
    ta_segment *seg = segs[k];
    if (!seg || !seg->marks || ta_segments_granule_of(seg) != granule) continue;
    for (ta_block *b = seg->first; b && got < want; b = b->next) {
      uintptr_t lo, hi;
      if (b->state != TA_BLOCK_FREE || b == keep ||
          !ta_segments_mapped_run(seg, b->addr, b->addr + b->size, want - got, &lo, &hi))
        continue;
      if (ta_grow(&a->retiring, &a->cap_retiring, a->nretiring + 1, 16)) return got;
      ta_block *r = ta_arena_claim(a, seg, lo, hi - lo);
      if (!r) return got; /* host memory */
      r->state = TA_BLOCK_RETIRING;
      ta_segments_lend(a->segments, seg, lo, hi - lo);
      a->retiring[a->nretiring++] = r;
      got += hi - lo;
      b = r; /* the loop goes on after it */
    }
  }
  return got;
}

static size_t lend(ta_arena *a, cudaStream_t stream, size_t granule, size_t want, const ta_block *keep) {
  size_t got = lend_from(a, stream, granule, want, keep); /* the requester's own arena first */
  FOR_FAMILY(f, a) if (f != a && got < want) got += lend_from(f, stream, granule, want - got, keep);
  return got;
}

/* Compact and reclaim: before `bytes` are mapped past the most ever
 * reserved (or after the device said no: `failed`), free
 * granules elsewhere go back to the device (compact: after a synchronize)
 * or become donors (reclaim: never waiting). Returns 1 when it found any. */
static int make_room(ta_arena *a, cudaStream_t stream, size_t granule, size_t bytes, const ta_block *keep,
                     int failed) {
  ta_segments *s = a->segments;
  /* After the device said no, free memory elsewhere is the way out (under
   * the slack, growth maps new memory first: segments_expand.c). */
  if (!a->compact || !(failed ? ta_segments_may_remap(s) : ta_segments_would_raise_peak(s, bytes))) return 0;
  if (!a->reclaim) return ta_segments_unmap_free(s, bytes, keep) > 0;
  /* Markers on the streams freed on since their last, then asked: a device
   * that has caught up (or nearly) says at once that all of it is past. */
  ta_segments_marks_poll(s);
  ta_segments_marks_record(s);
  ta_segments_marks_poll(s);
  /* While the device waits for the host, moves are step time: within a
   * budget (segments_moves.c); past it the reserve grows instead. */
  if (!ta_segments_move_allowed(s, stream, failed)) return 0;
  FOR_FAMILY(f, a) retire(f, 0, keep);
  size_t got = ta_segments_take_past(s, bytes, granule, keep);
  if (got < bytes) got += lend(a, stream, granule, bytes - got, keep);
  ta_segments_marks_record(s); /* what was lent gets its marker now: it retires soon */
  return got > 0;
}

/* Reclaim: the time a request's moves took, from `since` (0 for other
 * modes or without a move budget), charged to the budget when any memory
 * moved; and the donors the mapping did not use given back. */
static uint64_t moves_begin(ta_arena *a) { return a->reclaim ? ta_segments_move_since(a->segments) : 0; }

static void moves_end(ta_arena *a, int moved, uint64_t since) {
  if (!a->reclaim) return;
  ta_segments_donors_drop(a->segments);
  if (moved) ta_segments_move_charge(a->segments, since);
}

/* A free block of at least `rounded` bytes at the end of the stream's
 * expandable segment, out of the index: the segment made, or grown by what
 * its free end lacks. Compact: growing past the most ever reserved first
 * gives back free granules elsewhere, so the device's memory follows what
 * lives instead of the address range's high-water mark. NULL with *status
 * TA_ENOMEM (device full), or TA_ENOSPACE (no addresses: the caller makes
 * an ordinary segment). */
static ta_block *expand(ta_arena *a, ta_stream_bins *sb, int pool, ta_bins *bins, size_t rounded, int *status) {
  ta_segment *seg = sb->expandable[pool];
  /* The segment's own handles (the size for new ones may have changed since: a memory fraction). */
  size_t granule = seg ? ta_segments_granule_of(seg) : ta_segments_handle_size(a->segments, pool);
  if (!seg) {
    size_t bytes = ta_align_up(rounded, granule);
    uint64_t since = moves_begin(a);
    int moved = make_room(a, sb->stream, granule, bytes, NULL, 0);
    seg = ta_segments_alloc_expandable(a->segments, rounded, sb->stream, pool, a, a->policy, status);
    if (!seg && *status == TA_ENOMEM && make_room(a, sb->stream, granule, bytes, NULL, 1)) {
      moved = 1;
      seg = ta_segments_alloc_expandable(a->segments, rounded, sb->stream, pool, a, a->policy, status);
    }
    moves_end(a, moved, since);
    if (!seg) return NULL;
    ta_arena_own(a, seg);
    sb->expandable[pool] = seg;
    sb->newest = (uint8_t)pool;
    return seg->first;
  }
  ta_block *tail = seg->last;
  size_t have = tail->state == TA_BLOCK_FREE ? tail->size : 0;
  if (have >= rounded) { /* the index may pass over a fitting block of the request's own size class */
    take_free(a, bins, tail);
    return tail;
  }
  ta_block *fresh = have ? tail : ta_segments_block_new(a->segments);
  size_t bytes = ta_align_up(rounded - have, granule);
  uint64_t since = moves_begin(a);
  int moved = fresh && make_room(a, sb->stream, granule, bytes, tail, 0);
  *status = fresh ? ta_segments_grow(a->segments, seg, bytes) : TA_ENOMEM;
  if (*status == TA_ENOMEM && fresh && make_room(a, sb->stream, granule, bytes, tail, 1)) {
    moved = 1;
    *status = ta_segments_grow(a->segments, seg, bytes);
  }
  moves_end(a, moved, since);
  if (*status != TA_OK) {
    if (fresh && fresh != tail) ta_segments_block_delete(a->segments, fresh);
    return NULL;
  }
  if (have) {
    take_free(a, bins, tail);
    tail->size += bytes;
    return tail;
  }
  *fresh = (ta_block){.addr = tail->addr + tail->size, .size = bytes, .prev = tail, .segment = seg,
                      .stream = seg->stream, .owner = a, .policy = tail->policy, .state = TA_BLOCK_FREE};
  tail->next = fresh;
  seg->last = fresh;
  return fresh;
}

/* Release cached memory of an expandable segment: every free granule, the
 * free end cut off, the whole segment when nothing in it lives. Returns the
 * bytes given back. The caller synchronized. */
/* An expandable segment whose only block is free (in the index) goes, and
 * with its stream's last segment the stream's entry. */
static void release_whole(ta_arena *a, ta_segment *seg) {
  take_free(a, bins_for(a, seg->stream, seg->pool), seg->first);
  a->streams[a->last].expandable[seg->pool] = NULL; /* bins_for left `last` at the segment's stream */
  ta_arena_disown(a, seg);
  ta_segments_release_expandable(a->segments, seg);
}

static int empty(const ta_segment *seg) {
  return seg && seg->first == seg->last && seg->first->state == TA_BLOCK_FREE && ta_segments_nothing_mapped(seg);
}

/* Reclaim and compact: a stream whose every segment moving or giving back
 * memory left with nothing mapped and nothing in use (a stream done with)
 * loses them, and with them its entry and markers, whichever arena owns
 * them: they hold only addresses (as many as the device has bytes each). A
 * stream that still has a segment elsewhere (another phase's arena) keeps
 * them: its next
 * request maps memory there again, at the addresses it had (replay of the
 * phases trace under phase_arena moved 3 % more handles when they went).
 * Called when no entry of a->streams is in use up the stack (entries move
 * when one goes). */
static ta_noinline void release_drained(ta_arena *a) {
  ta_segment *seg;
  while ((seg = ta_segments_next_drained(a->segments)) != NULL) {
    ta_arena *owner = seg->owner; /* expandable segments are all arenas' (expand) */
    size_t i = ta_arena_find_stream(owner, seg->stream);
    if (!empty(seg) || i == owner->nstreams) continue;
    ta_segment *small = owner->streams[i].expandable[TA_POOL_SMALL], *large = owner->streams[i].expandable[TA_POOL_LARGE];
    size_t gone = (size_t)empty(small) + (size_t)empty(large);
    /* Segments of the stream elsewhere: counted by its markers under
     * reclaim; compact has none, so only an arena alone lets them go. */
    int elsewhere = seg->marks ? seg->marks->segments != gone : owner->family != NULL;
    if (owner->streams[i].segments != gone || elsewhere) continue;
    if (empty(small)) release_whole(owner, small);
    if (empty(large)) release_whole(owner, large); /* (release_whole finds the entry anew) */
  }
}

static size_t shrink(ta_arena *a, ta_segment *seg) {
  ta_block *b = seg->last;
  ta_bins *bins = bins_for(a, seg->stream, seg->pool);
  if (b == seg->first && b->state == TA_BLOCK_FREE) {
    size_t mapped = seg->size - seg->unmapped;
    release_whole(a, seg);
    return mapped;
  }
  size_t released = 0;
  for (ta_block *f = seg->first; f; f = f->next)
    if (f->state == TA_BLOCK_FREE) released += ta_segments_unmap(a->segments, seg, f->addr, f->size);
  /* at a handle's edge: a run of granules is given back only whole */
  size_t keep = ta_segments_handle_edge(seg, ta_align_up(b->addr - seg->addr, ta_segments_granule_of(seg)));
  if (b->state != TA_BLOCK_FREE || keep >= seg->size) return released;
  take_free(a, bins, b);
  if (b->addr == seg->addr + keep) { /* the free block goes entirely */
    b->prev->next = NULL;
    seg->last = b->prev;
    ta_segments_block_delete(a->segments, b);
  } else {
    b->size = seg->addr + keep - b->addr;
    put_free(a, bins, b);
  }
  ta_segments_shrink(a->segments, seg, keep); /* its granules were unmapped above */
  return released;
}

/* A block about to be handed out may cover granules given back earlier. */
static ta_noinline int map_block(ta_arena *a, ta_block *b) {
  size_t need = a->compact ? ta_segments_unmapped_in(b->segment, b->addr, b->size) : 0; /* a walk: only when used */
  if (a->compact && !need) return 0; /* its granules are mapped: the segment's holes are elsewhere */
  size_t granule = ta_segments_granule_of(b->segment);
  uint64_t since = moves_begin(a);
  int moved = need && make_room(a, b->stream, granule, need, b, 0);
  int rc = ta_segments_map(a->segments, b->segment, b->addr, b->size);
  if (rc != TA_OK && need && make_room(a, b->stream, granule, need, b, 1)) {
    moved = 1;
    rc = ta_segments_map(a->segments, b->segment, b->addr, b->size);
  }
  moves_end(a, moved, since);
  return rc == TA_OK ? 0 : -1;
}

/* A fresh block for a request no free block fits (the slow path). */
static ta_noinline ta_block *fresh_block(ta_arena *a, cudaStream_t stream, int pool, ta_bins *bins, size_t rounded) {
  if (a->expandable) {
    int status = TA_ENOMEM;
    ta_block *b = expand(a, &a->streams[a->last], pool, bins, rounded, &status);
    if (b || status != TA_ENOSPACE) return b;
  }
  /* Unsplit, a block is its segment: no bigger than the granule-rounded request. */
  size_t size =
      a->policy->flags & TA_POLICY_NO_SPLIT ? ta_align_up(rounded, TA_ROUND_LARGE) : ta_segment_size_for(rounded);
  ta_segment *seg = ta_segments_alloc(a->segments, size, stream, pool, a, a->policy);
  if (!seg) return NULL;
  ta_arena_own(a, seg);
  return seg->first;
}

static ta_block *carve(ta_arena *a, ta_bins *bins, ta_block *b, uintptr_t addr, size_t size);

/* Free blocks asked for a mapped window before the best fit maps instead. */
#define TA_WINDOW_PROBES 64

static int has_mapped_window(const ta_block *b, size_t size, void *at) {
  if (!b->segment->expansion || !b->segment->unmapped) {
    *(uintptr_t *)at = b->addr;
    return 1;
  }
  return ta_segments_mapped_window(b->segment, b->addr, b->addr + b->size, size, at);
}

/* Reclaim: when the best fit `b` would start on granules given back, the
 * smallest free block with `rounded` bytes on mapped granules, anywhere in
 * it, serves instead (at its start: returned free, as `b`; in its middle:
 * carved out, returned live). Why: mapping there takes memory from
 * elsewhere (a move: ~55 us of host time a handle), and the granules given
 * back are where the last step's layout differed: placed by best fit
 * alone, GPT-2 moved 268 handles every step after the warm-up, placed on
 * mapped memory first none (replay of its H200 log with the device keeping
 * up; ResNet-50 40 -> 0, ViT-B/16 28 -> 5, BENCHMARKS.md). The cost is
 * addresses: the granules given back stay unused while mapped memory
 * serves, and the segment's end moves on (a Llama-style pattern of varying
 * lengths spanned 2.3x what it reserved after 120 steps, and no more after
 * 240). So once half of the segment's addresses are used, best fit maps
 * the holes again (segments_expand.c reserves four times the device's
 * memory of addresses for the large pool). `b` as well when no block of
 * the first TA_WINDOW_PROBES asked has such a window. *mapped: 1 when the
 * returned block's first `rounded` bytes are known to lie on mapped
 * granules (nothing for map_block to do). */
static ta_noinline ta_block *on_mapped_memory(ta_arena *a, ta_bins *bins, ta_block *b, size_t rounded, int *mapped) {
  *mapped = ta_segments_unmapped_in(b->segment, b->addr, rounded) == 0;
  if (*mapped || ta_segments_addresses_left(b->segment) < b->segment->size) return b;
  uintptr_t at = 0;
  ta_block *m = ta_bins_find_where(bins, rounded, has_mapped_window, &at, TA_WINDOW_PROBES);
  if (!m) return b;
  *mapped = 1;
  if (at == m->addr) return m;
  ta_block *carved = carve(a, bins, m, at, rounded);
  *mapped = carved != NULL;
  return carved ? carved : b; /* without host memory for a descriptor: the best fit */
}

ta_block *ta_arena_malloc(ta_arena *a, size_t size, cudaStream_t stream) {
  size_t rounded = ta_round_size(size);
  int pool = ta_pool_for(rounded);
  ta_bins *bins = bins_for(a, stream, pool);
  if (ta_unlikely(!bins)) { /* no host memory for the index: a stream new here keeps no entry without segments */
    ta_arena_drop_if_unused(a, stream);
    return NULL;
  }
  ta_block *b = ta_bins_find(bins, rounded);
  int mapped = 0; /* b's first `rounded` bytes lie on mapped granules (on_mapped_memory found so) */
  int fresh = 0;  /* b is new memory: compact mode's drained segments are released below (why there: see there) */
  if (b && ta_unlikely(b->segment->unmapped != 0) && a->reclaim && !(a->policy->flags & TA_POLICY_NO_SPLIT)) {
    b = on_mapped_memory(a, bins, b, rounded, &mapped);
    if (b->state == TA_BLOCK_LIVE) return b; /* carved out of the middle of a free block, mapped */
  }
  if (b) {
    take_free(a, bins, b);
  } else {
    b = fresh_block(a, stream, pool, bins, rounded);
    fresh = 1;
    if (!b) {
      if (a->compact) release_drained(a);
      ta_arena_drop_if_unused(a, stream);
      return NULL;
    }
  }
  if (ta_should_split(b->size, rounded, pool, b->segment->expansion != NULL) &&
      ta_likely(!(a->policy->flags & TA_POLICY_NO_SPLIT))) {
    ta_block *rest = ta_segments_block_new(a->segments);
    if (ta_likely(rest != NULL)) split_after(a, bins, b, rounded, rest); /* without host memory: whole */
  }
  b->state = TA_BLOCK_LIVE;
  /* Only now: a fresh block is FREE until here, so a segment that making it drained (its only block, nothing
   * mapped yet) looked empty and went, block and all (found by fuzz_api); and `bins`, an entry of a->streams
   * that releasing may move, is not used past this point. A block taken from the index drains nothing, so the
   * hot path (a cached block) pays no test of the mode. */
  if (ta_unlikely(fresh) && a->compact) release_drained(a);
  /* Known mapped: all of it when the split left it `rounded` bytes (not without host memory for the rest). */
  if (ta_unlikely(b->segment->unmapped != 0) && !(mapped && b->size == rounded)) {
    int failed = map_block(a, b);
    if (a->compact) release_drained(a);
    if (failed) {
      ta_arena_free(a, b); /* back to the index, merged with its free neighbours */
      return NULL;
    }
  }
  return b;
}

ta_block *ta_arena_claim(ta_arena *a, ta_segment *seg, uintptr_t addr, size_t size) {
  if (seg->owner != a || size == 0 || size % 512 || addr < seg->addr || addr + size > seg->addr + seg->size) return NULL;
  ta_block *b = seg->first;
  while (b && b->addr + b->size <= addr) b = b->next;
  if (!b || b->state != TA_BLOCK_FREE || addr + size > b->addr + b->size) return NULL;
  return carve(a, bins_for(a, b->stream, seg->pool), b, addr, size);
}

/* [addr, addr + size) of the free block b, out of the index and live; the
 * bytes of b around it stay free. NULL without host memory (b unchanged). */
static ta_block *carve(ta_arena *a, ta_bins *bins, ta_block *b, uintptr_t addr, size_t size) {
  int free_before = addr > b->addr, free_after = addr + size < b->addr + b->size;
  /* Both descriptors first: a failure must leave the segment as it was. */
  ta_block *claimed = free_before ? ta_segments_block_new(a->segments) : b;
  ta_block *after = free_after ? ta_segments_block_new(a->segments) : NULL;
  if (!bins || !claimed || (free_after && !after)) {
    if (claimed && claimed != b) ta_segments_block_delete(a->segments, claimed);
    if (after) ta_segments_block_delete(a->segments, after);
    return NULL;
  }
  take_free(a, bins, b);
  if (free_before) { /* b keeps the free bytes before the range */
    split_after(a, bins, b, addr - b->addr, claimed);
    take_free(a, bins, claimed);
    put_free(a, bins, b); /* re-indexed: it is split now */
  }
  if (free_after) split_after(a, bins, claimed, size, after);
  claimed->state = TA_BLOCK_LIVE;
  return claimed;
}

void ta_arena_free(ta_arena *a, ta_block *b) {
  ta_segments_note_free(a->segments, b); /* reclaim: the stamps of what was freed, before it merges */
  ta_bins *bins = bins_for(a, b->stream, ta_block_pool(b));
  ta_block *p = b->prev, *n = b->next;
  if (p && p->state == TA_BLOCK_FREE) {
    take_free(a, bins, p);
    b->addr = p->addr;
    b->size += p->size;
    b->prev = p->prev;
    if (p->prev) p->prev->next = b;
    else b->segment->first = b;
    ta_segments_block_delete(a->segments, p);
  }
  if (n && n->state == TA_BLOCK_FREE) {
    take_free(a, bins, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    else b->segment->last = b;
    ta_segments_block_delete(a->segments, n);
  }
  /* b->requested stays: a snapshot shows a free block with its last request, as PyTorch's does. */
  put_free(a, bins, b);
}

size_t ta_arena_release_cached(ta_arena *a) {
  size_t released = 0;
  retire(a, 1, NULL); /* the caller synchronized (or tears down): every old address is free of queued work */
  for (ta_segment *s = a->owned, *next; s; s = next) {
    next = s->owner_next;
    if (s->expansion) {
      released += shrink(a, s);
      continue;
    }
    ta_block *b = s->first;
    if (b->state != TA_BLOCK_FREE || b->next) continue;
    take_free(a, bins_for(a, s->stream, s->pool), b);
    released += s->size;
    ta_arena_disown(a, s);
    ta_segments_release(a->segments, s);
  }
  return released;
}

void ta_arena_destroy(ta_arena *a) {
  if (!a) return;
  ta_arena_release_cached(a);
  for (size_t i = 0; i < a->nstreams; i++) {
    ta_bins_destroy(a->streams[i].pool[TA_POOL_SMALL]);
    ta_bins_destroy(a->streams[i].pool[TA_POOL_LARGE]);
  }
  free(a->streams);
  free(a->index);
  free(a->retiring);
  free(a);
}
