/* The log's guards against the world outside the process (log_guard.c):
 * a log file cut short by another program while it is mapped, and a
 * file-size limit (ulimit -f), must stop logging, never kill the program
 * that is training. */
#ifndef TA_LOG_GUARD_H
#define TA_LOG_GUARD_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/common.h"

/* From now on a write into [base, base + len) (the log's mapping of `fd`)
 * that faults because the file was truncated lands in anonymous memory
 * instead, `*enabled` (the log's on switch) turns 0 and
 * ta_log_guard_tripped() says so. `*file_size` is the file's length as this
 * process grew it: a SIGBUS raised again without its address (by a handler
 * installed over the guard) is the log's when the file is shorter. SIGBUS
 * elsewhere goes to whatever handled it before. */
ta_internal void ta_log_guard_arm(char *base, uint64_t len, atomic_int *enabled, int fd,
                                  const _Atomic uint64_t *file_size);
/* Before the mapping goes away. */
ta_internal void ta_log_guard_disarm(void);
/* 1 once a truncation was caught since the last arm. */
ta_internal int ta_log_guard_tripped(void);
/* posix_fallocate with SIGXFSZ held back: past a file-size limit it
 * returns EFBIG instead of the signal killing the process. */
ta_internal int ta_log_guard_fallocate(int fd, off_t offset, off_t len);
/* The file grown from `size` (the length this process gave it) to
 * `target`, checked before (shorter than `size`, it was cut since: growing
 * it would fill the cut with a hole and carry on writing a log whose start
 * is gone) and after (its first bytes must still be `magic`). 0 grown; -1
 * cut short by another program, before or during the growth (the cut is
 * put back and the guard trips); else the growth's errno (ENOSPC, EFBIG). */
ta_internal int ta_log_guard_grow(int fd, uint64_t size, uint64_t target, const char magic[8]);

#endif
