/* The log's path (log_path.h): pattern expansion, and claiming the file
 * without destroying anything torchalloc did not create. */
#include "log/log_path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log/log_format.h"

/* The decimal value of $name, or -1 when unset, empty, signed, too long or
 * not all digits (strtol would take " 3" and "3x"; a path must not). */
static int env_number(const char *name) {
  const char *text = getenv(name);
  if (!text || !*text || strlen(text) > 9) return -1;
  int value = 0;
  for (const char *c = text; *c; c++) {
    if (*c < '0' || *c > '9') return -1;
    value = value * 10 + (*c - '0');
  }
  return value;
}

int ta_log_rank(void) {
  int rank = env_number("RANK");
  return rank >= 0 ? rank : env_number("LOCAL_RANK");
}

int ta_log_world_size(void) {
  int size = env_number("WORLD_SIZE");
  return size > 0 ? size : 0;
}

/* %p: pid; %r: the rank the launcher exports (0 without one); %%: %. */
int ta_log_path_expand(const char *pattern, char *out, size_t outlen) {
  char rank[16];
  snprintf(rank, sizeof rank, "%d", ta_log_rank() >= 0 ? ta_log_rank() : 0);
  size_t n = 0;
  for (const char *c = pattern; *c; c++) {
    char piece[32];
    const char *add = piece;
    if (c[0] == '%' && c[1] == 'p') snprintf(piece, sizeof piece, "%ld", (long)getpid()), c++;
    else if (c[0] == '%' && c[1] == 'r') add = rank, c++;
    else if (c[0] == '%' && c[1] == '%') add = "%", c++;
    else piece[0] = *c, piece[1] = '\0';
    size_t len = strlen(add);
    if (n + len >= outlen) return -1;
    memcpy(out + n, add, len);
    n += len;
  }
  out[n] = '\0';
  return 0;
}

static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/* Why an existing file may not be trusted as this process's log, or NULL:
 * another user's file, or one others may write, could be read, cut or
 * swapped under the writer (a file planted in /tmp for the next pid). */
static const char *untrusted(const struct stat *st) {
  if (st->st_uid != geteuid()) return "is owned by another user";
  if (st->st_mode & (S_IWGRP | S_IWOTH)) return "may be written by other users";
  return NULL;
}

/* An existing path: open it only if it is this user's own regular file,
 * named directly (a symbolic link is refused: another user could point it
 * anywhere). lstat() first, so a device is never opened (opening some has
 * effects: a tape rewinds, a watchdog starts); O_NOFOLLOW and fstat()
 * after, in case it changed in between. */
static int open_existing(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    snprintf(err, errlen, "cannot use the log path %s: %s", path, strerror(errno));
    return -1;
  }
  if (S_ISLNK(st.st_mode)) {
    snprintf(err, errlen, "the log path %s is a symbolic link; refusing to follow it (give the file's own path)",
             path);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "the log path %s is %s, not a regular file; refusing to write a log there", path,
             file_kind(st.st_mode));
    return -1;
  }
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open the log %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat now;
  const char *why = NULL;
  if (fstat(fd, &now) != 0 || !S_ISREG(now.st_mode))
    snprintf(err, errlen, "the log path %s is %s, not a regular file; refusing to write a log there", path,
             file_kind(now.st_mode));
  else if ((why = untrusted(&now)) != NULL)
    snprintf(err, errlen, "the log path %s %s; refusing to use it as a log (remove it or choose another path)",
             path, why);
  else return fd;
  close(fd);
  return -1;
}

/* The header's pid when the file is a torchalloc log, else 0. */
static uint32_t writer_pid(int fd) {
  char magic[8];
  uint32_t pid = 0;
  if (pread(fd, magic, sizeof magic, 0) != (ssize_t)sizeof magic || memcmp(magic, TA_LOG_MAGIC, sizeof magic))
    return 0;
  if (pread(fd, &pid, sizeof pid, TA_LOG_HEADER_PID_OFFSET) != (ssize_t)sizeof pid) return 0;
  return pid;
}

/* Exclusive and held while the log is open. A file system without locks
 * (ENOLCK, some network mounts) gets no guard rather than no log. */
static int lock_or_explain(int fd, const char *path, char *err, size_t errlen) {
  if (flock(fd, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK) return 0;
  uint32_t pid = writer_pid(fd);
  if (pid)
    snprintf(err, errlen,
             "the log %s is in use by process %u; each process needs its own log (put %%p, the pid, in the path)",
             path, (unsigned)pid);
  else
    snprintf(err, errlen, "the log %s is in use by another process; each process needs its own log (put %%p, the pid, "
             "in the path)", path);
  return -1;
}

/* What may be overwritten: nothing, or an old torchalloc log. */
static int check_reusable(int fd, const char *path, char *err, size_t errlen) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "cannot use the log %s: %s", path, strerror(errno));
    return -1;
  }
  char magic[8];
  if (st.st_size == 0 ||
      (pread(fd, magic, sizeof magic, 0) == (ssize_t)sizeof magic && memcmp(magic, TA_LOG_MAGIC, sizeof magic) == 0))
    return 0;
  snprintf(err, errlen,
           "the log path %s holds a file that is not a torchalloc log (%lld bytes); refusing to overwrite it: move "
           "it or choose another path", path, (long long)st.st_size);
  return -1;
}

int ta_log_path_claim(const char *path, int *created, char *err, size_t errlen) {
  *created = 0;
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0644);
  if (fd >= 0) {
    *created = 1;
  } else if (errno != EEXIST) {
    snprintf(err, errlen, "cannot create the log %s: %s", path, strerror(errno));
    return -1;
  } else if ((fd = open_existing(path, err, errlen)) < 0) {
    return -1;
  }
  /* Locked before it is looked at or cut: a log another process is
   * writing is refused here, whoever created it. */
  if (lock_or_explain(fd, path, err, errlen)) {
    close(fd);
    return -1;
  }
  if (*created) return fd;
  if (check_reusable(fd, path, err, errlen)) {
    ta_log_path_release(fd);
    return -1;
  }
  if (ftruncate(fd, 0) != 0) {
    snprintf(err, errlen, "cannot empty the old log %s: %s", path, strerror(errno));
    ta_log_path_release(fd);
    return -1;
  }
  return fd;
}

void ta_log_path_abandon(const char *path, int fd, int created) {
  struct stat named, ours;
  /* Only the file this process made, and only if the name still leads to it. */
  if (created && stat(path, &named) == 0 && fstat(fd, &ours) == 0 && named.st_dev == ours.st_dev &&
      named.st_ino == ours.st_ino)
    unlink(path);
  ta_log_path_release(fd);
}

void ta_log_path_release(int fd) {
  if (fd < 0) return;
  flock(fd, LOCK_UN);
  close(fd);
}
