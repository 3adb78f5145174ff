/* Writes that a file-size limit fails rather than kills (file_limit.h).
 *
 * SIGXFSZ is blocked on the calling thread around the call; a write past
 * the limit then returns EFBIG and the signal stays pending. It is drained
 * (sigtimedwait with a zero timeout) before the mask is put back, unless
 * the caller had it blocked already: then it is the caller's to handle. */
#include "base/file_limit.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static void hold(sigset_t *xfsz, sigset_t *old) {
  sigemptyset(xfsz);
  sigaddset(xfsz, SIGXFSZ);
  pthread_sigmask(SIG_BLOCK, xfsz, old);
}

static void release(const sigset_t *xfsz, const sigset_t *old, int error) {
  if (error == EFBIG && !sigismember(old, SIGXFSZ)) {
    const struct timespec now = {0, 0};
    while (sigtimedwait(xfsz, NULL, &now) == SIGXFSZ) {} /* the limit's signal, answered by EFBIG already */
  }
  pthread_sigmask(SIG_SETMASK, old, NULL);
}

int ta_fallocate_within_limit(int fd, off_t offset, off_t len) {
  sigset_t xfsz, old;
  hold(&xfsz, &old);
  int e = posix_fallocate(fd, offset, len);
  release(&xfsz, &old, e);
  return e;
}

int ta_write_within_limit(int fd, const void *buf, size_t len) {
  sigset_t xfsz, old;
  hold(&xfsz, &old);
  const char *at = buf;
  int e = 0;
  while (len && !e) {
    ssize_t w = write(fd, at, len);
    if (w > 0) at += w, len -= (size_t)w;
    else if (w < 0 && errno != EINTR) e = errno;
    else if (w == 0) e = EIO;
  }
  release(&xfsz, &old, e);
  return e;
}
