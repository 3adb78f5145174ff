/* The phase stack and names (phase.h). */
#include "context/phase.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "log/log.h"

#define STACK_MAX 64

_Atomic uint64_t ta_phase_word = TA_PHASE_DEFAULT;
_Atomic uint32_t ta_phase_open_epoch[TA_MAX_PHASES];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char names[TA_MAX_PHASES][TORCHALLOC_PHASE_NAME_MAX + 1] = {"default"};
static _Atomic int count = 1;
static uint32_t epochs[TA_MAX_PHASES];
static int64_t ended[TA_MAX_PHASES];
static int stack[STACK_MAX];
static uint32_t stack_epoch[STACK_MAX]; /* each open frame's occurrence: a phase open twice has two */
static int depth;

static int valid_name(const char *name) {
  return name && *name && strlen(name) <= TORCHALLOC_PHASE_NAME_MAX;
}

static void set_name_error(void) { ta_set_error("phase name must be 1 to %d bytes", TORCHALLOC_PHASE_NAME_MAX); }

static int intern_locked(const char *name) {
  int n = atomic_load(&count);
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  if (n == TA_MAX_PHASES) return -1;
  snprintf(names[n], sizeof names[n], "%s", name);
  atomic_store(&count, n + 1);
  return n;
}

static void publish_locked(void) {
  int id = depth ? stack[depth - 1] : TA_PHASE_DEFAULT;
  atomic_store(&ta_phase_word, (uint64_t)epochs[id] << 16 | (uint64_t)id);
}

int ta_phase_intern(const char *name) {
  if (!valid_name(name)) {
    set_name_error();
    return -1;
  }
  pthread_mutex_lock(&lock);
  int id = intern_locked(name);
  pthread_mutex_unlock(&lock);
  if (id < 0) ta_set_error("too many distinct phase names (limit %d)", TA_MAX_PHASES);
  return id;
}

int ta_phase_push(const char *name, uint32_t *epoch) {
  if (!valid_name(name)) {
    set_name_error();
    return -1;
  }
  pthread_mutex_lock(&lock);
  /* Depth first: a begin refused for depth must not take a name slot. */
  if (depth == STACK_MAX) {
    pthread_mutex_unlock(&lock);
    ta_set_error("phases nested deeper than %d", STACK_MAX);
    return -1;
  }
  int id = intern_locked(name);
  if (id < 0) {
    pthread_mutex_unlock(&lock);
    ta_set_error("too many distinct phase names (limit %d)", TA_MAX_PHASES);
    return -1;
  }
  if (++epochs[id] == 0) epochs[id] = 1; /* 0 means "closed" */
  stack_epoch[depth] = epochs[id];
  stack[depth++] = id;
  if (epoch) *epoch = epochs[id];
  atomic_store(&ta_phase_open_epoch[id], epochs[id]);
  /* Logged before it becomes current: records tagged with it follow it. */
  ta_log_phase(TA_LOG_PHASE_BEGIN, id, epochs[id], names[id]);
  publish_locked();
  pthread_mutex_unlock(&lock);
  return id;
}

/* Remove frame `at` from the stack (lock held): logged, the innermost of
 * what remains made current. */
static void remove_frame_locked(int at, ta_phase_ended *out) {
  int id = stack[at];
  out->id = id;
  out->epoch = stack_epoch[at]; /* the frame's own occurrence: a phase open twice has two */
  ended[id]++;
  depth--;
  memmove(&stack[at], &stack[at + 1], (size_t)(depth - at) * sizeof stack[0]);
  memmove(&stack_epoch[at], &stack_epoch[at + 1], (size_t)(depth - at) * sizeof stack_epoch[0]);
  out->reopen = 0;
  for (int i = 0; i < depth; i++)
    if (stack[i] == id) out->reopen = stack_epoch[i]; /* the innermost frame of the same phase */
  publish_locked();
  ta_log_phase(TA_LOG_PHASE_END, id, out->epoch, names[id]);
}

int ta_phase_pop(const char *name, ta_phase_ended *out) {
  pthread_mutex_lock(&lock);
  if (depth == 0) {
    pthread_mutex_unlock(&lock);
    ta_set_error("phase_end(%s) without a matching phase_begin", name ? name : "");
    return -1;
  }
  int id = stack[depth - 1];
  if (name && strcmp(name, names[id]) != 0) {
    pthread_mutex_unlock(&lock);
    ta_set_error("phase_end('%s') but the innermost phase is '%s'", name, names[id]);
    return -1;
  }
  remove_frame_locked(depth - 1, out);
  pthread_mutex_unlock(&lock);
  return 0;
}

int ta_phase_remove(int id, uint32_t epoch, ta_phase_ended *out) {
  pthread_mutex_lock(&lock);
  int at = depth - 1;
  while (at >= 0 && !(stack[at] == id && stack_epoch[at] == epoch)) at--;
  if (at < 0) {
    const char *name = id >= 0 && id < atomic_load(&count) ? names[id] : "?";
    pthread_mutex_unlock(&lock);
    ta_set_error("phase '%s' (occurrence %u) is not open: it was left already, or the token is not one that "
                 "torchalloc_phase_enter returned", name, (unsigned)epoch);
    return -1;
  }
  remove_frame_locked(at, out);
  pthread_mutex_unlock(&lock);
  return 0;
}

int ta_phase_open_log(const char *pattern, size_t max_bytes, char *err, size_t errlen) {
  pthread_mutex_lock(&lock);
  int rc = ta_log_open(pattern, max_bytes, err, errlen);
  for (int i = 0; rc == 0 && i < depth; i++)
    ta_log_phase(TA_LOG_PHASE_BEGIN, stack[i], stack_epoch[i], names[stack[i]]);
  pthread_mutex_unlock(&lock);
  return rc;
}

/* Only if no frame of the phase was entered since: a new occurrence stays open. */
void ta_phase_retire(const ta_phase_ended *e) {
  uint32_t expected = e->epoch;
  atomic_compare_exchange_strong(&ta_phase_open_epoch[e->id], &expected, e->reopen);
}

int64_t ta_phase_occurrences(int phase) {
  pthread_mutex_lock(&lock);
  int64_t n = ended[phase];
  pthread_mutex_unlock(&lock);
  return n;
}

int ta_phase_count(void) { return atomic_load(&count); }

const char *ta_phase_name(int id) { return id >= 0 && id < atomic_load(&count) ? names[id] : NULL; }

void ta_phase_reset(void) {
  pthread_mutex_lock(&lock);
  depth = 0;
  atomic_store(&count, 1);
  memset(epochs, 0, sizeof epochs);
  memset(ended, 0, sizeof ended);
  for (int i = 0; i < TA_MAX_PHASES; i++) atomic_store(&ta_phase_open_epoch[i], 0);
  publish_locked();
  pthread_mutex_unlock(&lock);
}

void ta_phase_fork_prepare(void) { pthread_mutex_lock(&lock); }
void ta_phase_fork_release(void) { pthread_mutex_unlock(&lock); }
