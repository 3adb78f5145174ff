/* Between the log's file (log.c) and its interning tables (log_intern.c);
 * nothing else includes this. */
#ifndef TA_LOG_INTERN_H
#define TA_LOG_INTERN_H

#include "log.h"

/* `nslots` consecutive slots, or NULL when the log is full or stopped;
 * *seq is the first slot's sequence number. */
ta_internal char *ta_log_reserve(uint32_t nslots, uint64_t *seq);
/* Copy the first 63 bytes of `body` into `slot`, then publish `kind`. */
ta_internal void ta_log_commit(char *slot, const void *body, uint8_t kind);
/* The log's mutex: interning holds it. */
ta_internal void ta_log_lock(void);
ta_internal void ta_log_unlock(void);
/* Forget every interned id (a new file starts from nothing). Mutex held. */
ta_internal void ta_log_intern_reset(void);

#endif
