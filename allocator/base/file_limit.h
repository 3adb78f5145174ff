/* Writing files under a file-size limit (ulimit -f, RLIMIT_FSIZE) without
 * dying of it (file_limit.c). Growing a file past the limit sends the
 * writing thread SIGXFSZ, whose default kills the process (Python ignores
 * it; C and C++ hosts do not). The log and the OOM report hold the signal
 * back around their writes, so the call fails with EFBIG instead and they
 * stop as on a full disk. */
#ifndef TA_FILE_LIMIT_H
#define TA_FILE_LIMIT_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/common.h"

/* posix_fallocate with SIGXFSZ held back: 0, or its error (EFBIG past the limit). */
ta_internal int ta_fallocate_within_limit(int fd, off_t offset, off_t len);
/* All `len` bytes of `buf` written to `fd`, SIGXFSZ held back: 0, or the
 * errno of the write that failed (EFBIG past the limit). */
ta_internal int ta_write_within_limit(int fd, const void *buf, size_t len);

#endif
