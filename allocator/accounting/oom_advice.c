/* The advice for an out-of-memory failure (oom_advice.h).
 *
 * need = allocated + requested; held = total - free - reserved (others);
 * usable = what torchalloc could have had (the device less what others
 * hold, capped by the memory fraction); headroom = usable - reserved, what
 * was never reserved. Per verdict (oom_verdict.c):
 *
 * - fragmentation. Expandable segments map device memory granule by
 *   granule and, when a request finds no room, give back every free granule
 *   and map it again where the request needs it: so they would have served
 *   this request if the free granules, wholly free segments and headroom
 *   together hold the request rounded up to a granule. The line says
 *   whether they do, with the figures; it is not offered where it cannot
 *   apply (the device has no virtual memory, the policy caches nothing, a
 *   capture forbade releasing anything, or expandable segments were on
 *   already: then the free granules were given back before the failure).
 *   Arenas per phase (phase_arena) keep blocks of different phases out of
 *   each other's segments: offered only where live blocks of a phase other
 *   than the request's pin the segments that hold free memory, naming the
 *   phases. Then what no setting does for you; last, when their figures do
 *   not cover the request, that expandable segments would not have served
 *   it (so the first line is always one worth trying).
 * - capacity: the bytes that must go (need - usable).
 * - held elsewhere: what others hold, and the fraction to ask for when the
 *   memory fraction is what binds.
 *
 * Every line ends in "[based on ...]": what its figures come from. */
#include "accounting/oom_advice.h"

#include <stdarg.h>
#include <stdio.h>

#include "accounting/oom_verdict.h"
#include "base/text.h"

#define SZ(x) ta_format_size((uint64_t)(x)).text

/* Appends to a fixed buffer; counts what did not fit, as snprintf does. */
typedef struct out {
  char *buf;
  size_t len, used;
  int lines;
  const char *indent;
} out;

__attribute__((format(printf, 2, 3))) static void put(out *o, const char *fmt, ...) {
  char *at = o->used < o->len ? o->buf + o->used : NULL;
  size_t room = o->used < o->len ? o->len - o->used : 0;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(at, room, fmt, ap);
  va_end(ap);
  if (n > 0) o->used += (size_t)n;
}

static void line_start(out *o) { put(o, "%s%d. ", o->indent, ++o->lines); }

static const char *phase_name(ta_oom_phase_namer name, void *ctx, int phase, char scratch[24]) {
  const char *s = name ? name(ctx, phase) : NULL;
  if (s && *s) return s;
  snprintf(scratch, 24, "phase %d", phase);
  return scratch;
}

/* "2 MiB" for a whole number of MiB (the granule), else the usual format. */
static ta_size_text granule_text(uint64_t granule) {
  ta_size_text t;
  if (granule && granule % (1u << 20) == 0) snprintf(t.text, sizeof t.text, "%llu MiB", (unsigned long long)(granule >> 20));
  else t = ta_format_size(granule);
  return t;
}

typedef struct room {
  uint64_t need, held, usable, headroom;
} room;

static room room_of(const torchalloc_oom_facts *f) {
  room r = {.need = f->allocated + f->requested};
  if (!f->device_total) return r;
  r.held = f->device_total > f->device_free + f->reserved ? f->device_total - f->device_free - f->reserved : 0;
  r.usable = f->device_total - r.held;
  if (f->limit && f->limit < r.usable) r.usable = f->limit;
  r.headroom = r.usable > f->reserved ? r.usable - f->reserved : 0;
  return r;
}

/* ------------------------------------------------------------------------
 * Fragmentation
 * ---------------------------------------------------------------------- */

/* 1 when expandable segments could change anything about this failure. */
static int expandable_applies(const torchalloc_oom_detail *d) {
  return d && d->granule && !d->expandable && !(d->flags & (TORCHALLOC_OOM_FREES_TO_DEVICE | TORCHALLOC_OOM_ROUTING));
}

static int expandable_serves(const torchalloc_oom_facts *f, const torchalloc_oom_detail *d, room r) {
  uint64_t want = (f->requested + d->granule - 1) / d->granule * d->granule;
  return d->free_granules + d->free_segments + r.headroom >= want;
}

static void expandable_line(out *o, const torchalloc_oom_facts *f, const torchalloc_oom_detail *d, room r) {
  uint64_t want = (f->requested + d->granule - 1) / d->granule * d->granule;
  int serves = expandable_serves(f, d, r);
  line_start(o);
  put(o, "%s would %s this request: %s in whole free %s granules", TA_ADVICE_EXPANDABLE,
      serves ? "have served" : "not have served", SZ(d->free_granules), granule_text(d->granule).text);
  if (d->free_segments) put(o, " + %s in wholly free segments", SZ(d->free_segments));
  if (r.headroom || !serves) put(o, " + %s not yet reserved", SZ(r.headroom));
  put(o, " %s %s requested", serves ? ">=" : "<", SZ(f->requested));
  if (want != f->requested) put(o, " (%s in whole granules)", SZ(want));
  put(o,
      " [based on the free blocks of the %u segments that also hold live blocks, at the failure: expandable "
      "segments give whole free granules back and map them again where a request needs them]\n",
      (unsigned)d->pinned_segments);
}

static void phases_line(out *o, const torchalloc_oom_detail *d, ta_oom_phase_namer name, void *ctx) {
  char scratch[24];
  line_start(o);
  put(o, "%s, with torchalloc.phase() around each part of a step, keeps each phase's blocks in segments of its "
      "own: %s of the %s of live blocks pinning the %u segments that hold free memory (%s free in them) were "
      "allocated in ", TA_ADVICE_PHASES, SZ(d->pinning_other), SZ(d->pinning), (unsigned)d->pinned_segments,
      SZ(d->pinned_free));
  for (int k = 0; k < TORCHALLOC_OOM_OTHER_PHASES && d->other_bytes[k]; k++)
    put(o, "%sphase '%s' (%s)", k ? ", " : "", phase_name(name, ctx, d->other_phases[k], scratch),
        SZ(d->other_bytes[k]));
  put(o, ", the request in phase '%s' [based on the live blocks in the segments holding free memory, by the phase "
      "each was allocated in]\n", phase_name(name, ctx, d->phase, scratch));
}

static void fragmentation(out *o, const torchalloc_oom_facts *f, const torchalloc_oom_detail *d, room r,
                          ta_oom_phase_namer name, void *ctx) {
  int expand = expandable_applies(d), serves = expand && expandable_serves(f, d, r);
  if (serves) expandable_line(o, f, d, r);
  if (d && d->pinning_other && !(d->flags & TORCHALLOC_OOM_PHASE_ARENAS)) phases_line(o, d, name, ctx);
  line_start(o);
  put(o, "allocate long-lived tensors before short-lived ones, or reuse buffers of one size [based on the verdict "
      "alone: %s of the %s reserved was free but split between live blocks, the largest free block on the "
      "request's stream %s; the report names the blocks that pin the segments]\n",
      SZ(f->reserved > f->allocated ? f->reserved - f->allocated : 0), SZ(f->reserved), SZ(f->largest_free));
  if (expand && !serves) expandable_line(o, f, d, r); /* last: it says what would not help */
}

/* ------------------------------------------------------------------------
 * Capacity and held elsewhere
 * ---------------------------------------------------------------------- */

static void device_basis(out *o, const torchalloc_oom_facts *f, room r) {
  put(o, "[based on the device's numbers at the failure: %s in total, %s free, %s reserved by torchalloc",
      SZ(f->device_total), SZ(f->device_free), SZ(f->reserved));
  if (r.held) put(o, ", so %s held by others", SZ(r.held));
  if (f->limit) put(o, ", the memory fraction's cap %s", SZ(f->limit));
  put(o, "]\n");
}

static void capacity(out *o, const torchalloc_oom_facts *f, room r) {
  line_start(o);
  if (!f->device_total) {
    put(o, "shrink live tensors (smaller batch or sequence, activation checkpointing, lower precision, sharding): "
        "%s live + %s requested exceed the %s torchalloc had reserved [based on the log's numbers alone: the "
        "device's were not recorded]\n", SZ(f->allocated), SZ(f->requested), SZ(f->reserved));
    return;
  }
  put(o, "shrink live tensors by at least %s (smaller batch or sequence, activation checkpointing, lower precision, "
      "sharding): %s live + %s requested = %s > the %s torchalloc could use; no allocator setting can help ",
      SZ(r.need - r.usable), SZ(f->allocated), SZ(f->requested), SZ(r.need), SZ(r.usable));
  device_basis(o, f, r);
}

static void held_elsewhere(out *o, const torchalloc_oom_facts *f, room r) {
  uint64_t without_others = f->device_total - r.held; /* what this process could have with the fraction lifted */
  if (r.held && r.need > without_others) {
    line_start(o);
    put(o, "free what other processes (or allocators, or the CUDA context) hold: %s of the device; this request "
        "needs %s more than the %s torchalloc could use ", SZ(r.held), SZ(r.need - r.usable), SZ(r.usable));
    device_basis(o, f, r);
  }
  if (f->limit && f->limit < without_others) {
    /* The fraction of the device that covers need, rounded up to a hundredth. */
    double fraction = (double)r.need / (double)f->device_total;
    int hundredths = (int)(fraction * 100.0);
    if ((double)hundredths < fraction * 100.0) hundredths++;
    line_start(o);
    put(o, "raise the memory fraction to at least %d.%02d (torch.cuda.set_per_process_memory_fraction): it caps "
        "torchalloc at %s, %s short of the %s live + requested", hundredths / 100, hundredths % 100, SZ(f->limit),
        SZ(r.need - f->limit), SZ(r.need));
    if (r.need > without_others) put(o, " (and others must free memory too)");
    put(o, " ");
    device_basis(o, f, r);
  }
  if (!o->lines) { /* the device said no although the numbers left room: say so rather than nothing */
    line_start(o);
    put(o, "retry: the device refused %s although its numbers left room (another process may have taken memory "
        "and given it back) ", SZ(f->requested));
    device_basis(o, f, r);
  }
}

int ta_oom_advice_write(const torchalloc_oom_facts *f, const torchalloc_oom_detail *d, ta_oom_phase_namer name,
                        void *ctx, const char *indent, char *buf, size_t len) {
  out o = {.buf = buf, .len = buf ? len : 0, .indent = indent ? indent : ""};
  if (o.len) buf[0] = '\0';
  room r = room_of(f);
  switch (ta_oom_verdict(f)) {
    case TORCHALLOC_OOM_FRAGMENTATION: fragmentation(&o, f, d, r, name, ctx); break;
    case TORCHALLOC_OOM_CAPACITY: capacity(&o, f, r); break;
    case TORCHALLOC_OOM_HELD_ELSEWHERE: held_elsewhere(&o, f, r); break;
    default: break;
  }
  return (int)o.used;
}

