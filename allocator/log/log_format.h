/* The block log's on-disk format: the file header, record kinds, flags,
 * statuses, the 64-byte event record and the checksum every slot and the
 * header carry (docs/LOG_FORMAT.md says what each field means per kind).
 * The bottom of the log's layers: log_file.c writes records of this shape,
 * log_intern.c and log.c fill them, python/torchalloc/log/format.py mirrors them
 * and log/decode.py decodes them. */
#ifndef TA_LOG_FORMAT_H
#define TA_LOG_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the log format is little-endian and written in host order"
#endif

#define TA_LOG_MAGIC "TALOG\0\0\0"
/* 2: byte 62 of every slot and byte 60 of the header are checksums; 3: a device record before a device's first
 * segment (a version-2 reader would take it for the end of the data) */
#define TA_LOG_VERSION 3
#define TA_LOG_HEADER_SIZE 128
#define TA_LOG_RECORD_SIZE 64
#define TA_LOG_MIN_MAX_BYTES 4096 /* smallest log_max: the header and a few records */
#define TA_LOG_MAX_MAX_BYTES ((uint64_t)1 << 40) /* largest log_max (1 TiB, 16 G records): it is mapped whole */
#define TA_LOG_STRING_MAX 4095    /* longer strings are cut */
#define TA_LOG_CHECKSUM_OFFSET 62 /* of every slot */
#define TA_LOG_HEADER_PID_OFFSET 40
#define TA_LOG_HEADER_CHECKSUM_OFFSET 60
#define TA_LOG_HEADER_RANK_OFFSET 44
#define TA_LOG_HEADER_WORLD_SIZE_OFFSET 88

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
  TA_LOG_MODULE = 16,      /* the current nn.Module changed: records after it were made inside it */
  TA_LOG_MODULE_NAME = 17, /* a module id's path (model.layers.3.mlp), once per module */
  TA_LOG_MODULE_TAG = 18,  /* the block at an address belongs to a module as a parameter, gradient, state */
  TA_LOG_DEVICE = 19,      /* a device's memory (total, memory fraction), before its first segment in the file */
};

/* flags of a MODULE_TAG record: what the tagged block is to its module */
enum { TA_LOG_TAG_PARAMETER = 1, TA_LOG_TAG_GRADIENT = 2, TA_LOG_TAG_OPTIMIZER_STATE = 3 };

/* flags of an OOM_DEVICE record: the verdict (torchalloc_oom.h, TORCHALLOC_OOM_*) */

/* flags of a FREE record */
#define TA_LOG_FREE_DEFERRED 1 /* other streams used it: reused once their work completes */
/* flags of a SEGMENT_ALLOC / SEGMENT_FREE record */
#define TA_LOG_SEGMENT_EXPANDABLE 1 /* a range an expandable segment grew or shrank by */
#define TA_LOG_SEGMENT_COMPACT 2    /* ... of a policy in compact mode (expandable:2, and reclaim) */
#define TA_LOG_SEGMENT_RECLAIM 4    /* ... of a policy in reclaim mode (expandable:3): the replay names the variant */
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

/* The file header (docs/LOG_FORMAT.md, "File header"). */
typedef struct ta_log_header {
  char magic[8];
  uint32_t version, header_size, record_size, byte_order;
  uint64_t created_realtime_ns, created_monotonic_ns;
  uint32_t pid;
  int32_t rank;
  uint64_t max_bytes;
  uint32_t status;  /* TA_LOG_STATUS_*, stored atomically: the writer may be killed any time */
  uint8_t checksum; /* ta_log_header_checksum, refreshed whenever status or end_offset change */
  uint8_t reserved0[3];
  uint64_t end_offset; /* with status != OPEN: the bytes of valid data */
  char producer[16];
  int32_t world_size; /* $WORLD_SIZE, 0 when unset (and in logs written before the field: it was reserved) */
  uint8_t pad[36];
} ta_log_header;

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
  uint8_t checksum;    /* ta_log_fold of the slot's other 63 bytes; written with the kind */
  uint8_t kind;        /* written last: a non-zero kind means the record is complete */
} ta_log_record;

_Static_assert(sizeof(ta_log_record) == TA_LOG_RECORD_SIZE, "record layout");
_Static_assert(offsetof(ta_log_record, kind) == TA_LOG_RECORD_SIZE - 1, "kind is the commit byte");
_Static_assert(offsetof(ta_log_record, checksum) == TA_LOG_CHECKSUM_OFFSET, "checksum byte");
_Static_assert(sizeof(ta_log_header) == TA_LOG_HEADER_SIZE, "header layout");
_Static_assert(offsetof(ta_log_header, pid) == TA_LOG_HEADER_PID_OFFSET, "the pid a second writer reports");
_Static_assert(offsetof(ta_log_header, checksum) == TA_LOG_HEADER_CHECKSUM_OFFSET, "header checksum byte");
_Static_assert(offsetof(ta_log_header, rank) == TA_LOG_HEADER_RANK_OFFSET, "rank");
_Static_assert(offsetof(ta_log_header, world_size) == TA_LOG_HEADER_WORLD_SIZE_OFFSET, "world size");

/* ------------------------------------------------------------------------
 * Checksums. A slot's byte 62 is the XOR of its other 63 bytes folded to
 * one byte; said otherwise, the XOR of all 64 bytes folds to 0. XOR is the
 * cheapest sum that catches every single flipped bit (each bit of the file
 * lands in exactly one bit of the folded byte), and it lets a writer that
 * fills a slot field by field sum the words it stored as it stores them:
 * the slot's 8 little-endian words XOR'ed together, then folded.
 * ---------------------------------------------------------------------- */

static inline uint8_t ta_log_fold(uint64_t x) {
  x ^= x >> 32;
  x ^= x >> 16;
  x ^= x >> 8;
  return (uint8_t)x;
}

/* Word 7 of a record (bytes 56-63) with its checksum byte 0. */
static inline uint64_t ta_log_tail_word(uint16_t phase, int8_t device, uint8_t policy, uint8_t pool, uint8_t flags,
                                        uint8_t kind) {
  return (uint64_t)phase | (uint64_t)(uint8_t)device << 16 | (uint64_t)policy << 24 | (uint64_t)pool << 32 |
         (uint64_t)flags << 40 | (uint64_t)kind << 56;
}

/* The checksum of a 64-byte slot image whose byte 62 is ignored. */
static inline uint8_t ta_log_slot_checksum(const void *slot) {
  uint64_t w[8], x = 0;
  memcpy(w, slot, sizeof w);
  for (int i = 0; i < 8; i++) x ^= w[i];
  return (uint8_t)(ta_log_fold(x) ^ ((const uint8_t *)slot)[TA_LOG_CHECKSUM_OFFSET]);
}

/* The header's checksum: its 128 bytes but byte 60, folded the same way. */
static inline uint8_t ta_log_header_checksum(const ta_log_header *h) {
  uint64_t w[TA_LOG_HEADER_SIZE / 8], x = 0;
  memcpy(w, h, sizeof w);
  for (int i = 0; i < TA_LOG_HEADER_SIZE / 8; i++) x ^= w[i];
  return (uint8_t)(ta_log_fold(x) ^ h->checksum);
}

#endif
