/* The block log: every allocator event as a fixed-size binary record in a
 * memory-mapped file (format: docs/LOG_FORMAT.md).
 *
 * One log per process. A record costs a fetch_add on the write offset, a
 * clock read and a 64-byte copy into the mapping: no syscall, no malloc, no
 * shared lock. The file's pages live in the page cache from the moment they
 * are written, so a process killed with SIGKILL leaves every complete record
 * behind; a record is complete once its last byte (the kind) is stored.
 *
 * Who may write, and why close is safe: records about blocks are written
 * under the heap lock of their device; everything else (phases, markers,
 * strings, stacks) under the log's own mutex. Closing turns logging off,
 * then takes each of those locks once (ta_log_quiesce's callers do the heap
 * locks), so no writer is inside the mapping when it goes away. */
#ifndef TA_LOG_H
#define TA_LOG_H

#include <stdatomic.h>

#include "block.h"
#include "common.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the log format is little-endian and written in host order"
#endif

#define TA_LOG_MAGIC "TALOG\0\0\0"
#define TA_LOG_VERSION 1
#define TA_LOG_HEADER_SIZE 128
#define TA_LOG_RECORD_SIZE 64
#define TA_LOG_MIN_MAX_BYTES 4096 /* smallest log_max: the header and a few records */
#define TA_LOG_STRING_MAX 4095    /* longer strings are cut */

enum ta_log_kind {
  TA_LOG_NONE = 0, /* slot reserved, record not (yet) complete */
  TA_LOG_ALLOC = 1,
  TA_LOG_FREE = 2,
  TA_LOG_SEGMENT_ALLOC = 3,
  TA_LOG_SEGMENT_FREE = 4,
  TA_LOG_OOM = 5,
  TA_LOG_TRIM = 6,
  TA_LOG_PHASE_BEGIN = 7,
  TA_LOG_PHASE_END = 8,
  TA_LOG_MARKER = 9,
  TA_LOG_TRUNCATED = 10,
  TA_LOG_STRING = 11,
  TA_LOG_FRAME = 12,
  TA_LOG_STACK = 13,
  TA_LOG_END = 14,
};

/* flags of a FREE record */
#define TA_LOG_FREE_DEFERRED 1 /* other streams used it: reused once their work completes */
/* flags of a TRIM record: what released the cached segments */
enum { TA_LOG_TRIM_EMPTY_CACHE = 0, TA_LOG_TRIM_OOM_RETRY = 1, TA_LOG_TRIM_ARENA = 2 };
/* flags of a TRUNCATED record, and the header's status */
enum {
  TA_LOG_STATUS_OPEN = 0,      /* being written, or the writer died */
  TA_LOG_STATUS_CLOSED = 1,    /* closed cleanly: an END record is last */
  TA_LOG_STATUS_CAP = 2,       /* log_max reached: a TRUNCATED record is last */
  TA_LOG_STATUS_NO_SPACE = 3,  /* the file could not grow (disk full): writing stopped */
  TA_LOG_STATUS_NO_ADDRESS = 4 /* the address-space reservation is used up */
};

/* The event record. Field meanings per kind are in docs/LOG_FORMAT.md. */
typedef struct ta_log_record {
  uint64_t time_ns;    /* CLOCK_MONOTONIC */
  uint64_t seq;        /* slot index: contiguous over the whole file */
  uint64_t addr;
  uint64_t size;       /* requested bytes (alloc, free, oom); segment/released bytes; phase epoch */
  uint64_t block_size; /* block bytes (alloc, free); segment bytes; reserved bytes at an OOM */
  uint64_t stream;
  uint32_t tid;
  uint32_t stack;      /* stack id (alloc, free, oom) or string id (phase, marker): "label" */
  uint16_t phase;
  int8_t device;       /* -1: not about one device */
  uint8_t policy;
  uint8_t pool;
  uint8_t flags;
  uint8_t reserved;
  uint8_t kind;        /* written last: a non-zero kind means the record is complete */
} ta_log_record;

_Static_assert(sizeof(ta_log_record) == TA_LOG_RECORD_SIZE, "record layout");
_Static_assert(offsetof(ta_log_record, kind) == TA_LOG_RECORD_SIZE - 1, "kind is the commit byte");

/* A Python frame as captured, before interning. */
typedef struct ta_log_frame_text {
  const char *file, *func;
  uint32_t line;
} ta_log_frame_text;

ta_internal extern atomic_int ta_log_enabled;

/* The only cost when logging is off. Acquire: a writer that sees the log on
 * also sees the mapping it was opened with. */
static inline int ta_log_on(void) { return atomic_load_explicit(&ta_log_enabled, memory_order_acquire); }

/* Open `pattern` (%p: pid, %r: $RANK or $LOCAL_RANK or 0, %%: %), closing
 * any open log first. max_bytes caps the file (0: no cap). 0, or -1 with
 * the reason in err. The caller makes sure no writer is in flight when a
 * log is already open (see ta_log_stop). */
ta_internal int ta_log_open(const char *pattern, size_t max_bytes, char *err, size_t errlen);
/* Turn logging off; returns 1 when a log was open. The caller then takes
 * each heap lock once before ta_log_close, so writers still inside finish. */
ta_internal int ta_log_stop(void);
/* Write the END record, cut the file to what was written, unmap it. */
ta_internal void ta_log_close(void);
/* The expanded path of the open log, or NULL. */
ta_internal const char *ta_log_path(void);

/* Stamp time, sequence number and thread id into `r` and append it.
 * Call with the heap lock held (records about blocks). */
ta_internal void ta_log_write(ta_log_record *r);
/* The same for writers that hold no heap lock (phases, markers). */
ta_internal void ta_log_write_unlocked(ta_log_record *r);

/* Interned ids, written to the log the first time they are seen; 0 when
 * the log is off. Not to be called with a heap lock held. */
ta_internal uint32_t ta_log_string(const char *s);
ta_internal uint32_t ta_log_intern_stack(const ta_log_frame_text *frames, int n);

/* Records the heap writes (caller holds the heap lock and saw ta_log_on()).
 * An alloc also stores the call's stack id in the block. */
ta_internal void ta_log_alloc(int device, ta_block *b);
ta_internal void ta_log_free(int device, const ta_block *b, int phase, uint8_t flags);
ta_internal void ta_log_segment(uint8_t kind, int device, const ta_segment *s, int phase);
ta_internal void ta_log_oom(int device, size_t size, cudaStream_t stream, int phase, size_t reserved);
ta_internal void ta_log_trim(int device, size_t released, int phase, uint8_t reason);
/* PHASE_BEGIN / PHASE_END of occurrence `epoch` of `phase` (no heap lock). */
ta_internal void ta_log_phase(uint8_t kind, int phase, uint32_t epoch, const char *name);

/* The stack id the entry point captured for the call in flight on this
 * thread (0: none); the heap reads it when it writes the record. */
ta_internal extern _Thread_local uint32_t ta_log_call_stack;

#endif
