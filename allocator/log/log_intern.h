/* Interning for the block log: strings, frames and stacks get an id and are
 * written once, the first time they are seen (log_intern.c). Above the file
 * (it writes through log_file.h), below the records (log.c) and the stack
 * capture (pystack.c). */
#ifndef TA_LOG_INTERN_H
#define TA_LOG_INTERN_H

#include "log/log_file.h"

/* A Python frame as captured, before interning. */
typedef struct ta_log_frame_text {
  const char *file, *func;
  uint32_t line;
} ta_log_frame_text;

/* Interned ids, written to the log the first time they are seen; 0 when
 * the log is off. Take the file's mutex: not to be called with a heap lock
 * held. */
ta_internal uint32_t ta_log_string(const char *s);
ta_internal uint32_t ta_log_intern_stack(const ta_log_frame_text *frames, int n);
/* Write `r` with `label` interned into r->stack, both under one hold of the
 * file's mutex: a log reopened between interning and writing would give the
 * record an id of the other file (a marker named after a module path). */
ta_internal void ta_log_write_labelled(ta_log_record *r, const char *label);
/* The same, with the generation the id belongs to in *gen (see below). */
ta_internal uint32_t ta_log_intern_stack_in(const ta_log_frame_text *frames, int n, uint64_t *gen);
/* The interning generation: it changes whenever the ids are forgotten (a log
 * closed or opened), so a cache of ids (pystack.c) knows when its entries
 * are stale. Lock-free. */
ta_internal uint64_t ta_log_intern_generation(void);
/* Call `visit` for each frame of stack `stack`, innermost first (under the
 * file's mutex: `visit` must not log). Returns the frame count, 0 when the
 * id is unknown. */
typedef void (*ta_log_frame_visitor)(void *ctx, const char *file, const char *func, uint32_t line);
ta_internal int ta_log_intern_visit_stack(uint32_t stack, ta_log_frame_visitor visit, void *ctx);
/* Forget every interned id (a new file starts from nothing). Mutex held. */
ta_internal void ta_log_intern_reset(void);

#endif
