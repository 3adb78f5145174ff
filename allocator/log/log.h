/* The block log's records: every allocator event as a fixed-size binary
 * record (format: log_format.h, docs/LOG_FORMAT.md), written by the layers
 * that see it. The top of the log's layers: above the file (log_file.h) and
 * the interning of strings and stacks (log_intern.h); below the segments,
 * the phases and the heap, which call it and are never called back. */
#ifndef TA_LOG_H
#define TA_LOG_H

#include "block/block.h"
#include "log/log_file.h"
#include "torchalloc_oom.h"

/* Open the log (log_file.h: ta_log_file_open) with fresh interning tables.
 * The caller makes sure no writer is in flight when a log is already open
 * (ta_log_stop, then each heap lock once). */
ta_internal int ta_log_open(const char *pattern, size_t max_bytes, char *err, size_t errlen);
/* Close it (END record, file cut to length) and forget every interned id. */
ta_internal void ta_log_close(void);

/* Records the heap and the segment layer write (caller holds the heap lock
 * and saw ta_log_on()). An alloc also stores the call's stack id in the block. */
ta_internal void ta_log_alloc(int device, ta_block *b);
ta_internal void ta_log_free(int device, const ta_block *b, int phase, uint8_t flags);
/* [addr, addr + size) of segment `s` became device memory or stopped being it. */
/* `flags`: TA_LOG_SEGMENT_* */
ta_internal void ta_log_segment(uint8_t kind, int device, const ta_segment *s, uintptr_t addr, size_t size, int phase,
                                uint8_t flags);
/* OOM and its OOM_DEVICE record (the numbers and the verdict behind it,
 * and the handle size the advice counted whole free granules in, so that
 * `torchalloc report` gives the same advice). */
ta_internal void ta_log_oom(int device, const torchalloc_oom_facts *facts, cudaStream_t stream, int phase,
                            int verdict, size_t granule);
/* DEVICE: `device` has `total` bytes, `limit` of them allowed (a memory
 * fraction; 0: none). Written once per device and file, before the
 * device's first segment, by whoever ta_log_device_untold answered 1 first:
 * plans and replays of the log then know the recording GPU's memory. */
ta_internal int ta_log_device_untold(int device);
ta_internal void ta_log_device(int device, size_t total, size_t limit);
ta_internal void ta_log_trim(int device, size_t released, int phase, uint8_t reason);
/* PHASE_BEGIN / PHASE_END of occurrence `epoch` of `phase` (no heap lock). */
ta_internal void ta_log_phase(uint8_t kind, int phase, uint32_t epoch, const char *name);
/* A MARKER carrying `label` (interned) and `phase` (no heap lock). */
ta_internal void ta_log_marker(const char *label, int phase);
/* MODULE (current module `id`), MODULE_NAME (`id` is `path`, interned),
 * MODULE_TAG (the block at `addr` is `id`'s, as `role`); no heap lock. */
ta_internal void ta_log_module(uint32_t id, int phase);
ta_internal void ta_log_module_name(uint32_t id, const char *path);
ta_internal void ta_log_module_tag(uintptr_t addr, uint32_t id, uint8_t role, int phase);

/* The stack id the entry point captured for the call in flight on this
 * thread (0: none); the heap reads it when it writes the record. */
ta_internal extern _Thread_local uint32_t ta_log_call_stack;

#endif
