/* The block log's on-disk format: record kinds, flags, statuses and the
 * 64-byte event record (docs/LOG_FORMAT.md says what each field means per
 * kind). The bottom of the log's layers: log_file.c writes records of this
 * shape, log_intern.c and log.c fill them, the decoder in
 * python/torchalloc/log.py reads them. */
#ifndef TA_LOG_FORMAT_H
#define TA_LOG_FORMAT_H

#include <stddef.h>
#include <stdint.h>

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
  TA_LOG_OOM_DEVICE = 15, /* follows every OOM: what the device and the diagnosis said */
};

/* flags of an OOM_DEVICE record: the verdict (torchalloc.h, TORCHALLOC_OOM_*) */

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

#endif
