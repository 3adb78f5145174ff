/* The log's path: expanding the pattern, and claiming the file.
 *
 * A log path is a user's string, and the file it names may be anything: a
 * directory, /dev/null, a FIFO, a user's data, a log another process is
 * writing. Claiming it must never destroy what torchalloc did not create:
 * it creates the file, or reuses an empty file or an old torchalloc log no
 * one holds, and refuses everything else with the reason. A claimed file
 * is locked (flock, exclusive) for as long as it is open, so a second
 * process that names the same path is refused instead of truncating a file
 * the first has mapped (which would kill it with SIGBUS); a reader can tell
 * a log still being written from one whose writer died by the same lock.
 *
 * Below the file (log_file.c), which maps what this returns. */
#ifndef TA_LOG_PATH_H
#define TA_LOG_PATH_H

#include <stddef.h>

#include "base/common.h"

/* This process's rank in a distributed job: $RANK (torchrun and every
 * torch.distributed launcher set it), else $LOCAL_RANK (a launcher that sets
 * only that one), else -1. A value that is not a plain decimal number below
 * 2^31 counts as unset: %r puts it into a path, where "../x" must not go. */
ta_internal int ta_log_rank(void);

/* $WORLD_SIZE by the same rule; 0 when unset (a process not under a launcher). */
ta_internal int ta_log_world_size(void);

/* `pattern` with %p (pid), %r (ta_log_rank(), 0 without a launcher: a lone
 * process is rank 0 of a job of one) and %% expanded into `out`; -1 when it
 * does not fit. */
ta_internal int ta_log_path_expand(const char *pattern, char *out, size_t outlen);

/* Open `path` for a new log: an empty file, locked. *created says whether
 * this call created it (only then may ta_log_path_abandon delete it). The
 * fd, or -1 with a one-line reason in err. */
ta_internal int ta_log_path_claim(const char *path, int *created, char *err, size_t errlen);

/* Give up a claimed file after a failure: deleted when this process
 * created it, left as it is otherwise; unlocked and closed. */
ta_internal void ta_log_path_abandon(const char *path, int fd, int created);

/* Done with the file: unlock and close. */
ta_internal void ta_log_path_release(int fd);

#endif
