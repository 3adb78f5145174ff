/* The block log's file: a memory-mapped reservation that records are
 * appended to without a lock (log_file.c says how).
 *
 * One log per process. A record costs a fetch_add on the write offset, a
 * clock read and a 64-byte copy into the mapping: no syscall, no malloc, no
 * shared lock. The file's pages live in the page cache from the moment they
 * are written, so a process killed with SIGKILL leaves every complete record
 * behind; a record is complete once its last byte (the kind) is stored.
 *
 * Who may write, and why closing is safe: records about blocks are written
 * under the heap lock of their device; everything else (phases, markers,
 * strings, stacks) under this file's mutex (ta_log_lock). Closing turns
 * logging off (ta_log_stop), then the runtime takes each heap lock once, so
 * no writer is inside the mapping when it goes away. */
#ifndef TA_LOG_FILE_H
#define TA_LOG_FILE_H

#include <stdatomic.h>

#include "base/common.h"
#include "log/log_format.h"

ta_internal extern atomic_int ta_log_enabled;

/* The only cost when logging is off. Acquire: a writer that sees the log on
 * also sees the mapping it was opened with. */
static inline int ta_log_on(void) { return atomic_load_explicit(&ta_log_enabled, memory_order_acquire); }

/* Create `pattern` (%p: pid, %r: $RANK or $LOCAL_RANK or 0, %%: %), closing
 * the open file first. max_bytes caps the file (0: no cap). 0, or -1 with
 * the reason in err: the path is not ours to use (log_path.h says which
 * are), or another process is writing it. */
ta_internal int ta_log_file_open(const char *pattern, size_t max_bytes, char *err, size_t errlen);
/* Turn logging off; returns 1 when a file was open. */
ta_internal int ta_log_stop(void);
/* Write the END record, cut the file to what was written, unmap it. */
ta_internal void ta_log_file_close(void);
/* The expanded path of the open file, or NULL. Safe on any thread while
 * others open and close logs: the string is never changed or freed. */
ta_internal const char *ta_log_path(void);
/* 1 when this process has a log open that it writes (not one a forked
 * child inherited from its parent). */
ta_internal int ta_log_file_is_ours(void);

/* fork(): take the file's mutexes before, release them after in the parent;
 * in the child also stop logging (the file is the parent's). Called by the
 * runtime's fork handler only, in its lock order (runtime.c). */
ta_internal void ta_log_fork_prepare(void);
ta_internal void ta_log_fork_parent(void);
ta_internal void ta_log_fork_child(void);

/* The file's mutex: writers that hold no heap lock, and interning. */
ta_internal void ta_log_lock(void);
ta_internal void ta_log_unlock(void);

/* Stamp time, sequence number and thread id into `r` and append it. Call
 * with the heap lock held (records about blocks) or the file's mutex. */
ta_internal void ta_log_write(ta_log_record *r);
/* The same for writers that hold neither: takes the mutex. */
ta_internal void ta_log_write_unlocked(ta_log_record *r);

/* The hot records are filled in place: a reserved slot is fresh file space,
 * all zeros, so only the non-zero fields are stored, then the kind with
 * ta_log_end. NULL when the log is full or stopped. The checksum is
 * computed from the values stored, not read back: *sum starts as the XOR
 * of the words ta_log_begin stored (time, seq, tid), the writer XORs in
 * each 8-byte word it fills (log_format.h: word 7 by ta_log_tail_word with
 * kind 0), and ta_log_end adds the kind, folds, and publishes. */
ta_internal ta_log_record *ta_log_begin(uint64_t *sum);
static inline void ta_log_end(ta_log_record *r, uint64_t sum, uint8_t kind) {
  r->checksum = ta_log_fold(sum ^ (uint64_t)kind << 56);
  __atomic_store_n(&r->kind, kind, __ATOMIC_RELEASE);
}

/* For records longer than one slot (strings, stacks): `nslots` consecutive
 * slots, or NULL; *seq is the first slot's sequence number. ta_log_commit
 * copies the first 63 bytes of `body` into `slot`, then publishes `kind`. */
ta_internal char *ta_log_reserve(uint32_t nslots, uint64_t *seq);
ta_internal void ta_log_commit(char *slot, const void *body, uint8_t kind);

#endif
