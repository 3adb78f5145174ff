/* torchalloc: an out-of-memory failure in numbers -- the facts, the verdict
 * and the advice that torchalloc_oom_summary's words rest on -- for the
 * bindings that give them as data (torchalloc.last_oom()) and the tools that
 * compute them again from numbers read elsewhere (`torchalloc report`, from
 * a log). Exported by libtorchalloc.so beside the plug-in API (torchalloc.h). */
#ifndef TORCHALLOC_OOM_H
#define TORCHALLOC_OOM_H

#include "torchalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  TORCHALLOC_OOM_NONE = 0,
  TORCHALLOC_OOM_FRAGMENTATION = 1, /* the bytes were there, cached but split between live blocks */
  TORCHALLOC_OOM_CAPACITY = 2,      /* live tensors plus the request exceed the device */
  TORCHALLOC_OOM_HELD_ELSEWHERE = 3 /* others hold the device's memory, or a memory fraction caps it */
};

/* Every field of torchalloc_oom_facts, once, in struct order: X(uint64,
 * name), each a uint64_t. The struct and torchalloc_oom_facts_fields() are
 * made from it. */
#define TORCHALLOC_OOM_FACTS_FIELDS(X)                                            \
  X(uint64, requested)    /* bytes asked for */                                   \
  X(uint64, allocated)    /* bytes in live blocks at the failure */               \
  X(uint64, reserved)     /* bytes torchalloc held in segments */                 \
  X(uint64, device_total) /* 0 when unknown */                                    \
  X(uint64, device_free)  /* as the device said at the failure */                 \
  X(uint64, limit)        /* the memory fraction's ceiling, 0 for none */         \
  X(uint64, largest_free) /* largest free cached block on the request's stream */

#define TORCHALLOC_OOM_FACTS_MEMBER(kind, name) uint64_t name;
typedef struct torchalloc_oom_facts {
  TORCHALLOC_OOM_FACTS_FIELDS(TORCHALLOC_OOM_FACTS_MEMBER)
} torchalloc_oom_facts;
#undef TORCHALLOC_OOM_FACTS_MEMBER

/* Every field of torchalloc_oom_facts in struct order, one line each:
 * "name\tuint64\n" (TORCHALLOC_FIELD_LINE, torchalloc.h). */
TORCHALLOC_API const char *torchalloc_oom_facts_fields(void);

/* The verdict (TORCHALLOC_OOM_*) for these numbers: the one rule behind the
 * failure report, torchalloc.last_oom() and `torchalloc report`. -1 for NULL. */
TORCHALLOC_API int torchalloc_oom_verdict(const torchalloc_oom_facts *facts);

/* The last failure on `device`: its numbers and verdict. 0 (and *verdict
 * TORCHALLOC_OOM_NONE) when there was none; -1 for a bad device. */
TORCHALLOC_API int torchalloc_last_oom(int device, torchalloc_oom_facts *facts, int *verdict);

/* What the advice rests on besides the facts: the free and live memory of
 * the segments at the failure (default pool only: private pools serve no
 * other request). The struct may grow at its end: `struct_size` says how
 * much of it the caller knows, and the library reads and writes no byte
 * past it. */
#define TORCHALLOC_OOM_OTHER_PHASES 3
enum {
  TORCHALLOC_OOM_PHASE_ARENAS = 1,     /* the failing policy keeps phases in arenas of their own */
  TORCHALLOC_OOM_FREES_TO_DEVICE = 2,  /* the failing policy caches nothing (expandable segments do not apply) */
  TORCHALLOC_OOM_ROUTING = 4           /* a capture or MemPool context was open: nothing could be released */
};
typedef struct torchalloc_oom_detail {
  uint64_t struct_size;     /* sizeof(torchalloc_oom_detail) as the caller was compiled */
  uint64_t granule;         /* bytes expandable segments map at a time; 0: the device cannot */
  uint64_t free_granules;   /* free bytes lying in whole granules of segments that hold live blocks too */
  uint64_t free_segments;   /* bytes of segments with no live or pending block (gone after the retry, unless routing) */
  uint64_t pinned_free;     /* free bytes in segments that hold live blocks too */
  uint64_t pinning;         /* live bytes in those segments */
  uint64_t pinning_other;   /* of which allocated in a phase other than the request's */
  uint64_t other_bytes[TORCHALLOC_OOM_OTHER_PHASES]; /* the other phases pinning the most, most first */
  uint16_t other_phases[TORCHALLOC_OOM_OTHER_PHASES];
  uint16_t phase;           /* the request's phase */
  uint32_t pinned_segments; /* segments holding free memory and live blocks */
  uint8_t expandable;       /* the failing heap's expandable:N, 0 for off */
  uint8_t flags;            /* TORCHALLOC_OOM_PHASE_ARENAS | _FREES_TO_DEVICE | _ROUTING */
  uint8_t reserved_[2];     /* 96 bytes, no implicit padding (ctypes mirrors it) */
} torchalloc_oom_detail;

/* The last failure's detail on `device` (all zero but struct_size when there
 * was none). 0, or -1 for a bad device or a struct_size below 8. */
TORCHALLOC_API int torchalloc_last_oom_detail(int device, torchalloc_oom_detail *detail);

/* The advice for these numbers, one line each ("expandable:reclaim would have
 * served this request: ... [based on ...]"), the line a user should try
 * first first: the rule behind the failure's summary and report, and what
 * `torchalloc report` calls with the numbers it reads from a log.
 * `phase_names[i]` names phase i (i < nnames; NULL or missing: "phase i").
 * `detail` may be NULL (the advice then rests on the facts alone). Returns
 * the length (snprintf's convention), -1 when `facts` is NULL. */
TORCHALLOC_API int torchalloc_oom_advice(const torchalloc_oom_facts *facts, const torchalloc_oom_detail *detail,
                                         const char *const *phase_names, size_t nnames, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* TORCHALLOC_OOM_H */
