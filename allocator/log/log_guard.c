/* Guards of the log against the world outside the process (log_guard.h).
 *
 * Truncation. The log is a shared mapping of its file; when anyone cuts
 * the file (truncate -s 0, logrotate's copytruncate, `: > run.talog`), a
 * store to a page past the new end raises SIGBUS, whose default kills the
 * training process. The handler here owns only faults inside the armed
 * range: it maps anonymous memory over the whole range (MAP_FIXED, so the
 * faulting store and every later one land there, harmlessly), turns
 * logging off and says so on stderr; the file is left as the other program
 * left it. mmap and write are system calls, safe in a handler. Any other
 * SIGBUS goes to the previous handler, or, when there was none, kills the
 * process as it would have.
 *
 * A handler installed over this one (Python's faulthandler, which every
 * torchrun rank using @record enables) takes the fault first; faulthandler
 * then puts this handler back and raises the signal again with raise(),
 * which carries no fault address (si_code SI_TKILL). Such a SIGBUS is the
 * log's when the log's file is now shorter than the part this process gave
 * it (fstat, also safe in a handler): exactly when a store into the
 * mapping faults. The guard trips, returns, and the faulting store, tried
 * again, lands in the anonymous memory. Were the fault another one after
 * all, trying it again faults again, now with its address, and goes to the
 * previous handler; a SIGBUS raised while the log is whole is never taken.
 *
 * File-size limits. Growing past RLIMIT_FSIZE sends the growing thread
 * SIGXFSZ, whose default also kills (Python ignores it; C and C++ hosts do
 * not). The log's posix_fallocate holds it back (base/file_limit.c), so
 * the call reports EFBIG and the log stops as on a full disk. */
#include "log/log_guard.h"

#include "base/file_limit.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static _Atomic(char *) armed_base;
static _Atomic uint64_t armed_len;
static atomic_int tripped;
static atomic_int *armed_enabled; /* the log's on switch, turned off when the guard trips */
static atomic_int armed_fd = -1;  /* the log's file */
static _Atomic(const _Atomic uint64_t *) armed_size; /* its length as this process grew it */
static struct sigaction previous;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;

/* A signal the process sent itself (raise, kill), not a fault the kernel raised. */
static int raised_by_this_process(const siginfo_t *info) {
  return info && info->si_code <= 0 && info->si_pid == getpid();
}

static void chain(int sig, siginfo_t *info, void *context) {
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) previous.sa_sigaction(sig, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
    return;
  }
  int sent = info && info->si_code <= 0;
  if (previous.sa_handler == SIG_IGN && sent) return;
  /* No handler before ours: the default action. A fault meets it when the
   * store is tried again; a sent signal happens once, so it is sent again
   * (held until this handler returns). */
  signal(sig, SIG_DFL);
  if (sent) raise(sig);
}

/* The armed log's file is shorter than this process made it: another
 * program cut it. */
static int file_was_cut(void) {
  const _Atomic uint64_t *size = atomic_load(&armed_size);
  int fd = atomic_load(&armed_fd);
  struct stat st;
  return size && fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size < atomic_load(size);
}

/* The file was cut short: anonymous memory over the whole mapping (later
 * stores land there), logging off, said once. Only system calls: it runs
 * in the SIGBUS handler too. 0, or -1 when the mapping could not be
 * replaced. */
static int trip(char *base, uint64_t len) {
  atomic_store_explicit(armed_enabled, 0, memory_order_relaxed);
  if (mmap(base, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) ==
      MAP_FAILED)
    return -1;
  if (!atomic_exchange(&tripped, 1)) {
    static const char msg[] = "torchalloc: warning: the log file was cut short by another program while it was "
                              "being written; logging stopped (training goes on)\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
  }
  return 0;
}

static void on_sigbus(int sig, siginfo_t *info, void *context) {
  char *base = atomic_load(&armed_base);
  uint64_t len = atomic_load(&armed_len);
  int saved = errno;
  int ours;
  if (raised_by_this_process(info)) { /* a handler over ours raised it again, without the address */
    ours = base && file_was_cut();
  } else {
    char *addr = info ? (char *)info->si_addr : NULL;
    ours = base && addr && addr >= base && addr < base + len;
  }
  if (!ours || trip(base, len) != 0) chain(sig, info, context);
  errno = saved;
}

static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &previous);
}

void ta_log_guard_arm(char *base, uint64_t len, atomic_int *enabled, int fd, const _Atomic uint64_t *file_size) {
  pthread_once(&install_once, install);
  armed_enabled = enabled;
  atomic_store(&armed_size, file_size);
  atomic_store(&armed_fd, fd);
  atomic_store(&tripped, 0);
  atomic_store(&armed_len, len);
  atomic_store(&armed_base, base);
}

void ta_log_guard_disarm(void) {
  atomic_store(&armed_base, NULL);
  atomic_store(&armed_len, 0);
  atomic_store(&armed_fd, -1);
}

int ta_log_guard_tripped(void) { return atomic_load(&tripped); }

/* Before growing: 1 when the file is shorter than `size` (the length this
 * process gave it), handled as the fault would be. */
static int cut_before_growth(int fd, uint64_t size) {
  char *base = atomic_load(&armed_base);
  struct stat st;
  if (atomic_load(&tripped)) return 1;
  if (!base || fstat(fd, &st) != 0 || (uint64_t)st.st_size >= size) return 0;
  trip(base, atomic_load(&armed_len));
  return 1;
}

int ta_log_guard_fallocate(int fd, off_t offset, off_t len) { return ta_fallocate_within_limit(fd, offset, len); }

/* Why read the header back: a cut between cut_before_growth and the
 * growth is undone by the growth, which extends the shorter file from
 * `size` on and leaves a hole where the log was; writers then store into
 * the hole and never fault (one run in about 150 of test_log_hostile's
 * cut, under load). The log's first bytes are its magic, written at open:
 * read from the file, not the mapping, they tell. The cut is put back at
 * the first hole (where the other program's cut left the file, with
 * whatever it wrote since), else at 0, and the guard trips. */
int ta_log_guard_grow(int fd, uint64_t size, uint64_t target, const char magic[8]) {
  if (cut_before_growth(fd, size)) return -1;
  int e = ta_fallocate_within_limit(fd, (off_t)size, (off_t)(target - size));
  if (e) return e;
  char head[8];
  if (pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head && memcmp(head, magic, sizeof head) == 0) return 0;
  off_t hole = lseek(fd, 0, SEEK_HOLE);
  if (ftruncate(fd, hole >= 0 && (uint64_t)hole < size ? hole : 0) != 0) { /* the guard trips all the same */
  }
  char *base = atomic_load(&armed_base);
  if (base) trip(base, atomic_load(&armed_len));
  return -1;
}
