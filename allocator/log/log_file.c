/* The block log's file (log_file.h): open, reserve, grow, truncate, close.
 *
 * Layout and rules are in docs/LOG_FORMAT.md. The design in three lines:
 * - the whole file is mapped once into a large address-space reservation,
 *   so the mapping never moves and writers need no lock to use it;
 * - a writer reserves its slot with one fetch_add on the write offset, and
 *   the slot index is the record's sequence number;
 * - the file grows in 16 MiB steps with posix_fallocate (not ftruncate: a
 *   sparse file on a full disk would SIGBUS the writer), under a mutex that
 *   only the writer that crosses the current end takes;
 * - a helper thread keeps the file allocated and its pages mapped ahead of
 *   the writers, who would otherwise take a page fault every 64 records;
 * - every slot carries a checksum (byte 62, log_format.h), computed from
 *   the values a writer stores, so a bit flipped on disk is caught, not
 *   decoded as a different number.
 * Which file may be used, and its lock, are log_path.c's. */
#include "log/log_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log/log_clock.h"
#include "log/log_guard.h"
#include "log/log_path.h"

#define HDR TA_LOG_HEADER_SIZE
#define REC TA_LOG_RECORD_SIZE
#define GROW_CHUNK (16 * (uint64_t)TA_MiB)
#define RESERVE_DEFAULT ((uint64_t)64 << 30) /* 1 G records; a log that fills it is TRUNCATED */
#define RESERVE_MIN (256 * (uint64_t)TA_MiB)
#define AHEAD (32 * (uint64_t)TA_MiB) /* the helper keeps this much ready past the write offset */
#define POKE (4 * (uint64_t)TA_MiB)   /* writers wake the helper each time they cross a multiple */
#define STEP (2 * (uint64_t)TA_MiB)   /* the helper's unit of work */
#define BEHIND (32 * (uint64_t)TA_MiB) /* written pages this far behind the write offset leave the writer's RSS */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

atomic_int ta_log_enabled;

static struct {
  pthread_mutex_t mu;      /* open/close, interning, writers that hold no heap lock */
  pthread_mutex_t grow_mu; /* growing the file */
  int fd;
  char *base;              /* mapping of the whole reservation; NULL when closed */
  uint64_t reserve;        /* bytes of address space mapped */
  uint64_t file_max;       /* the file never grows past this */
  uint64_t limit;          /* ordinary records end at or before it; one slot stays for TRUNCATED */
  uint32_t limit_status;   /* why the limit is where it is: CAP or NO_ADDRESS */
  _Atomic uint64_t next;   /* file offset of the next free slot */
  _Atomic uint64_t size;   /* file length: every slot below it is writable */
  _Atomic uint64_t stop_end; /* non-zero once writing stopped early: end of the valid data */
  int inherited;           /* fork child: the file is the parent's, never touch it */
  int created;             /* this open created the file: only then may a failure delete it */
  pthread_mutex_t helper_mu; /* the prefault helper's wake-ups */
  pthread_cond_t helper_cv;
  pthread_t helper;
  int helper_running, helper_stop;
  char path[4096];
} L = {.mu = PTHREAD_MUTEX_INITIALIZER, .grow_mu = PTHREAD_MUTEX_INITIALIZER, .fd = -1,
       .helper_mu = PTHREAD_MUTEX_INITIALIZER, .helper_cv = PTHREAD_COND_INITIALIZER};

/* The path torchalloc_log_path() hands out. A caller on another thread
 * may read it while this one opens or closes a log, so it is never
 * rewritten: each path is copied once into a string of its own, kept for
 * the life of the process (reopening a path reuses its copy), and the
 * current one is published with one atomic store. */
typedef struct published_path {
  struct published_path *next;
  char text[];
} published_path;
static published_path *published; /* every path published so far (under L.mu) */
static _Atomic(const char *) current_path;

static void publish_path(const char *path) {
  published_path *p = published;
  while (p && strcmp(p->text, path) != 0) p = p->next;
  if (!p) {
    size_t len = strlen(path);
    p = malloc(sizeof *p + len + 1);
    if (!p) return; /* no host memory: the log works, its path is not told */
    memcpy(p->text, path, len + 1);
    p->next = published;
    published = p;
  }
  atomic_store_explicit(&current_path, p->text, memory_order_release);
}

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint32_t thread_id(void) {
  static _Thread_local uint32_t tid;
  if (ta_unlikely(!tid)) tid = (uint32_t)syscall(SYS_gettid);
  return tid;
}

static ta_log_header *header(void) { return (ta_log_header *)L.base; }

/* After status or end_offset change: the header's checksum follows them. */
static void refresh_header_checksum(void) {
  ta_log_header *h = header();
  h->checksum = ta_log_header_checksum(h);
}

/* ------------------------------------------------------------------------
 * Stopping early, growing, reserving
 * ---------------------------------------------------------------------- */

/* Writing ends at `end` for `status`: later reservations are dropped. The
 * header says so at once, for a reader of a killed process's file. */
static void stop_writing(uint32_t status, uint64_t end) {
  atomic_store_explicit(&ta_log_enabled, 0, memory_order_relaxed);
  uint64_t none = 0;
  if (!atomic_compare_exchange_strong(&L.stop_end, &none, end)) return; /* someone stopped first */
  __atomic_store_n(&header()->end_offset, end, __ATOMIC_RELAXED);
  __atomic_store_n(&header()->status, status, __ATOMIC_RELEASE);
  refresh_header_checksum();
}

/* The file is allocated up to `end`: writers may use it (grow_mu held). */
static void publish_size(uint64_t end) {
  if (end > atomic_load_explicit(&L.size, memory_order_relaxed))
    atomic_store_explicit(&L.size, end, memory_order_release);
}

static ta_noinline int grow(uint64_t need) {
  pthread_mutex_lock(&L.grow_mu);
  uint64_t size = atomic_load_explicit(&L.size, memory_order_relaxed);
  int ok = need <= size;
  if (!ok && !atomic_load(&L.stop_end)) {
    uint64_t target = ta_align_up(need, GROW_CHUNK);
    if (target > L.file_max) target = L.file_max;
    int e = ta_log_guard_grow(L.fd, size, target, TA_LOG_MAGIC);
    if (e == 0) {
      publish_size(target);
      ok = 1;
    } else if (e > 0) { /* -1: cut short by another program, the guard said so and stopped the log */
      stop_writing(TA_LOG_STATUS_NO_SPACE, size);
      fprintf(stderr, "torchalloc: warning: the log %s cannot grow past %llu bytes (%s); logging stopped\n",
              L.path, (unsigned long long)size, strerror(e));
    }
  }
  pthread_mutex_unlock(&L.grow_mu);
  return ok;
}

/* ------------------------------------------------------------------------
 * Prefault helper: a fresh page of the file costs its first writer a fault
 * of about a microsecond, ~20 ns a record. This thread allocates the file
 * and maps its pages (MADV_POPULATE_WRITE, which leaves their contents
 * alone) AHEAD bytes past the write offset, so writers fault only when they
 * outrun it. Where the kernel lacks MADV_POPULATE_WRITE it just stops.
 * Behind the writers it drops the pages written BEHIND bytes ago from the
 * process (MADV_DONTNEED on a shared file mapping: their data stays in the
 * page cache and the file, a late writer's store just maps the page again),
 * so the writer's resident memory does not grow with the log: job killers
 * and cgroup accounting read RSS.
 * ---------------------------------------------------------------------- */

/* Drop [*released, next - BEHIND) from the process, in whole steps. */
static void release_behind(uint64_t *released) {
  uint64_t next = atomic_load_explicit(&L.next, memory_order_relaxed);
  if (next < BEHIND + STEP) return;
  uint64_t until = (next - BEHIND) / STEP * STEP;
  if (until <= *released) return;
  if (madvise(L.base + *released, until - *released, MADV_DONTNEED) == 0) *released = until;
}

static void *helper_main(void *arg) {
  (void)arg;
  uint64_t populated = 0, released = 0;
  int can_populate = 1; /* MADV_POPULATE_WRITE is Linux 5.14+: without it, only the file's growth and release */
  pthread_mutex_lock(&L.helper_mu);
  while (!L.helper_stop) {
    /* In whole steps: madvise wants page-aligned starts. */
    uint64_t want = ta_align_up(atomic_load_explicit(&L.next, memory_order_relaxed) + AHEAD, STEP);
    if (want > L.file_max) want = L.file_max;
    if (populated >= want || atomic_load(&L.stop_end)) {
      pthread_cond_wait(&L.helper_cv, &L.helper_mu);
      continue;
    }
    pthread_mutex_unlock(&L.helper_mu);
    uint64_t end = populated + STEP < want ? populated + STEP : want;
    uint64_t size = atomic_load_explicit(&L.size, memory_order_acquire);
    int ok = end <= size || ta_log_guard_grow(L.fd, size, end, TA_LOG_MAGIC) == 0;
    if (ok && end > size) {
      pthread_mutex_lock(&L.grow_mu);
      publish_size(end);
      pthread_mutex_unlock(&L.grow_mu);
    }
    if (ok && can_populate && madvise(L.base + populated, end - populated, MADV_POPULATE_WRITE) != 0) {
      if (errno == EINVAL) can_populate = 0; /* advice unknown to this kernel: go on without it */
      else ok = 0;                           /* a fault on the range: the writers report what went wrong */
    }
    populated = end;
    release_behind(&released);
    pthread_mutex_lock(&L.helper_mu);
    if (!ok) break; /* writers grow the file themselves and report what went wrong */
  }
  pthread_mutex_unlock(&L.helper_mu);
  return NULL;
}

static ta_noinline void poke_helper(void) {
  pthread_mutex_lock(&L.helper_mu);
  pthread_cond_signal(&L.helper_cv);
  pthread_mutex_unlock(&L.helper_mu);
}

static void helper_start(void) {
  L.helper_stop = 0;
  L.helper_running = pthread_create(&L.helper, NULL, helper_main, NULL) == 0;
}

static void helper_stop(void) {
  if (!L.helper_running) return;
  pthread_mutex_lock(&L.helper_mu);
  L.helper_stop = 1;
  pthread_cond_signal(&L.helper_cv);
  pthread_mutex_unlock(&L.helper_mu);
  pthread_join(L.helper, NULL);
  L.helper_running = 0;
}

/* The one reservation that contains the limit writes TRUNCATED in its first
 * slot (the limit keeps room for it); every later one finds nothing. */
static ta_noinline void past_limit(uint64_t off) {
  if (off > L.limit || !grow(off + REC)) return;
  ta_log_record r = {.time_ns = ta_log_now_ns(), .seq = (off - HDR) / REC, .size = L.file_max,
                     .tid = thread_id(), .device = -1, .flags = (uint8_t)L.limit_status};
  ta_log_commit(L.base + off, &r, TA_LOG_TRUNCATED);
  stop_writing(L.limit_status, off + REC);
}

static inline char *reserve(uint32_t nslots, uint64_t *seq) {
  uint64_t len = (uint64_t)nslots * REC;
  uint64_t off = atomic_fetch_add_explicit(&L.next, len, memory_order_relaxed);
  if (ta_unlikely(off + len > L.limit)) {
    past_limit(off);
    return NULL;
  }
  if (ta_unlikely(((off + len) & (POKE - 1)) < len)) poke_helper();
  if (ta_unlikely(off + len > atomic_load_explicit(&L.size, memory_order_acquire)) && !grow(off + len)) return NULL;
  *seq = (off - HDR) / REC;
  return L.base + off;
}

char *ta_log_reserve(uint32_t nslots, uint64_t *seq) { return reserve(nslots, seq); }

/* The kind goes last, with release: a reader that sees it sees the rest.
 * The checksum is taken over the copy as it will be on disk. */
void ta_log_commit(char *slot, const void *body, uint8_t kind) {
  unsigned char image[REC];
  memcpy(image, body, REC - 1);
  image[REC - 1] = kind;
  image[TA_LOG_CHECKSUM_OFFSET] = 0;
  image[TA_LOG_CHECKSUM_OFFSET] = ta_log_slot_checksum(image);
  memcpy(slot, image, REC - 1);
  __atomic_store_n((uint8_t *)slot + REC - 1, kind, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------------
 * Writers
 * ---------------------------------------------------------------------- */

void ta_log_write(ta_log_record *r) {
  uint64_t seq;
  char *p = reserve(1, &seq);
  if (ta_unlikely(!p)) return;
  r->time_ns = ta_log_now_ns();
  r->seq = seq;
  r->tid = thread_id();
  ta_log_commit(p, r, r->kind);
}

ta_log_record *ta_log_begin(uint64_t *sum) {
  uint64_t seq;
  ta_log_record *s = (ta_log_record *)reserve(1, &seq);
  if (ta_likely(s != NULL)) {
    uint64_t now = ta_log_now_ns();
    uint32_t tid = thread_id();
    s->time_ns = now;
    s->seq = seq;
    s->tid = tid;
    *sum = now ^ seq ^ tid; /* words 0, 1 and the low half of word 6 */
  }
  return s;
}

void ta_log_write_unlocked(ta_log_record *r) {
  pthread_mutex_lock(&L.mu);
  if (ta_log_on()) ta_log_write(r);
  pthread_mutex_unlock(&L.mu);
}

/* ------------------------------------------------------------------------
 * Open / close
 * ---------------------------------------------------------------------- */

/* Map as much address space as the system grants, at most `want`. */
static char *map_reservation(int fd, uint64_t want, uint64_t *got) {
  for (uint64_t size = want;; size /= 2) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      *got = size;
      return p;
    }
    if (size / 2 < RESERVE_MIN || size / 2 < want / 1024) return NULL;
  }
}

static void unmap_locked(void) {
  atomic_store_explicit(&current_path, NULL, memory_order_release);
  ta_log_guard_disarm();
  if (L.base) munmap(L.base, L.reserve);
  ta_log_path_release(L.fd); /* a forked child has closed its copy already (ta_log_fork_child) */
  L.base = NULL;
  L.fd = -1;
  L.path[0] = '\0';
}

static void close_locked(void) {
  atomic_store(&ta_log_enabled, 0);
  if (!L.base) return;
  helper_stop(); /* before the file is cut: it could grow it again */
  if (ta_log_guard_tripped() && !L.inherited)
    fprintf(stderr, "torchalloc: warning: the log %s was cut short by another program while open; it holds what "
            "that program left\n", L.path);
  else if (!L.inherited) {
    ta_log_record end = {.device = -1, .kind = TA_LOG_END};
    ta_log_write(&end); /* past the limit this becomes TRUNCATED, like any record */
    uint64_t stop = atomic_load(&L.stop_end);
    uint64_t len = stop ? stop : atomic_load(&L.next);
    if (!stop) {
      __atomic_store_n(&header()->end_offset, len, __ATOMIC_RELAXED);
      __atomic_store_n(&header()->status, (uint32_t)TA_LOG_STATUS_CLOSED, __ATOMIC_RELEASE);
      refresh_header_checksum();
    }
    if (ftruncate(L.fd, (off_t)len) != 0)
      fprintf(stderr, "torchalloc: warning: cannot trim the log %s to %llu bytes: %s\n", L.path,
              (unsigned long long)len, strerror(errno));
  }
  unmap_locked();
  L.inherited = 0;
}

/* A forked child (a DataLoader worker) inherits the mapping; if it wrote,
 * parent and child would claim the same slots. It logs nothing and leaves
 * the parent's file alone. It closes its copy of the descriptor at once
 * (never unlocking it: the lock belongs to the parent's open file too), so
 * a child that outlives its parent does not keep the lock, and a reader
 * can tell that the parent died. The runtime's fork handler (runtime.c)
 * calls these in its lock order, after the heap and phase locks. */
void ta_log_fork_prepare(void) {
  pthread_mutex_lock(&L.mu);
  pthread_mutex_lock(&L.grow_mu);
  pthread_mutex_lock(&L.helper_mu);
}
void ta_log_fork_parent(void) {
  pthread_mutex_unlock(&L.helper_mu);
  pthread_mutex_unlock(&L.grow_mu);
  pthread_mutex_unlock(&L.mu);
}
void ta_log_fork_child(void) {
  atomic_store(&ta_log_enabled, 0);
  L.inherited = L.base != NULL;
  if (L.fd >= 0) close(L.fd);
  L.fd = -1;
  L.helper_running = 0; /* the helper thread was not forked */
  pthread_mutex_unlock(&L.helper_mu);
  pthread_mutex_unlock(&L.grow_mu);
  pthread_mutex_unlock(&L.mu);
}

static int open_locked(const char *pattern, size_t max_bytes, char *err, size_t errlen) {
  if (max_bytes && (max_bytes < TA_LOG_MIN_MAX_BYTES || max_bytes > TA_LOG_MAX_MAX_BYTES)) {
    snprintf(err, errlen, "log_max %zu is outside %d bytes to 1 TiB", max_bytes, TA_LOG_MIN_MAX_BYTES);
    return -1;
  }
  if (ta_log_path_expand(pattern, L.path, sizeof L.path)) {
    snprintf(err, errlen, "log path '%s' is too long once expanded", pattern);
    L.path[0] = '\0';
    return -1;
  }
  L.fd = ta_log_path_claim(L.path, &L.created, err, errlen);
  if (L.fd < 0) {
    L.path[0] = '\0';
    return -1;
  }
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t want = max_bytes ? ta_align_up(max_bytes, page) : RESERVE_DEFAULT;
  L.base = map_reservation(L.fd, want, &L.reserve);
  L.file_max = max_bytes && max_bytes <= L.reserve ? max_bytes : L.reserve;
  L.limit_status = max_bytes && max_bytes <= L.reserve ? TA_LOG_STATUS_CAP : TA_LOG_STATUS_NO_ADDRESS;
  uint64_t first = GROW_CHUNK < L.file_max ? GROW_CHUNK : L.file_max;
  int e = L.base ? ta_log_guard_fallocate(L.fd, 0, (off_t)first) : ENOMEM;
  if (e) {
    /* Refused here, at open (install() raises it), rather than later by every allocation. */
    if (!L.base)
      snprintf(err, errlen, "cannot map the log %s: %s (no address space for %llu bytes)", L.path, strerror(e),
               (unsigned long long)want);
    else
      snprintf(err, errlen, "cannot write the first %llu bytes of the log %s: %s%s", (unsigned long long)first,
               L.path, strerror(e),
               e == ENOSPC || e == EFBIG || e == EDQUOT ? " (is the disk full or a file size limit set?)" : "");
    if (L.base) munmap(L.base, L.reserve);
    L.base = NULL;
    ta_log_path_abandon(L.path, L.fd, L.created);
    L.fd = -1;
    L.path[0] = '\0';
    return -1;
  }
  L.limit = HDR + ((L.file_max - HDR) / REC - 1) * REC;
  atomic_store(&L.next, HDR);
  atomic_store(&L.size, first);
  atomic_store(&L.stop_end, 0);
  ta_log_header *h = header();
  memcpy(h->magic, TA_LOG_MAGIC, 8);
  h->version = TA_LOG_VERSION;
  h->header_size = HDR;
  h->record_size = REC;
  h->byte_order = 0x01020304u;
  h->created_realtime_ns = clock_ns(CLOCK_REALTIME);
  ta_log_clock_start();
  h->created_monotonic_ns = ta_clock_gettime_ns();
  h->pid = (uint32_t)getpid();
  h->rank = ta_log_rank(); /* the rank %r named the file after (-1 here, 0 there, without a launcher) */
  h->world_size = ta_log_world_size();
  h->max_bytes = max_bytes;
  h->status = TA_LOG_STATUS_OPEN;
  snprintf(h->producer, sizeof h->producer, "torchalloc");
  refresh_header_checksum();
  ta_log_guard_arm(L.base, L.reserve, &ta_log_enabled, L.fd, &L.size);
  helper_start();
  publish_path(L.path);
  atomic_store_explicit(&ta_log_enabled, 1, memory_order_release);
  return 0;
}

int ta_log_file_open(const char *pattern, size_t max_bytes, char *err, size_t errlen) {
  if (!pattern || !*pattern) {
    snprintf(err, errlen, "the log path is empty");
    return -1;
  }
  pthread_mutex_lock(&L.mu);
  close_locked();
  int rc = open_locked(pattern, max_bytes, err, errlen);
  pthread_mutex_unlock(&L.mu);
  return rc;
}

int ta_log_stop(void) {
  pthread_mutex_lock(&L.mu);
  int was_open = L.base != NULL;
  atomic_store(&ta_log_enabled, 0);
  pthread_mutex_unlock(&L.mu);
  return was_open;
}

void ta_log_file_close(void) {
  pthread_mutex_lock(&L.mu);
  close_locked();
  pthread_mutex_unlock(&L.mu);
}

const char *ta_log_path(void) { return atomic_load_explicit(&current_path, memory_order_acquire); }

int ta_log_file_is_ours(void) {
  pthread_mutex_lock(&L.mu);
  int ours = L.base != NULL && !L.inherited;
  pthread_mutex_unlock(&L.mu);
  return ours;
}

void ta_log_lock(void) { pthread_mutex_lock(&L.mu); }
void ta_log_unlock(void) { pthread_mutex_unlock(&L.mu); }
