/* Capturing the Python stack with CPython's C API, found at run time.
 *
 * Only functions of the 3.10+ API are used (no struct layouts): frames via
 * PyThreadState_GetFrame / PyFrame_GetBack, their code objects' co_filename
 * and co_name via getattr. The GIL is held for the walk only: names are
 * copied out, the GIL is released, and then they are interned, so Python
 * threads never wait on the log's mutex through us.
 *
 * A training loop allocates from the same few thousand places step after
 * step, so each capture first walks the frames for their keys only (code
 * object and instruction offset: a few C calls per frame, no strings) and
 * looks the stack up in a cache of interned ids. Only a stack not seen yet
 * pays for the names (two getattrs, UTF-8 copies, hashing) and the log's
 * mutex. A code object named by a cached key is kept alive (pinned: one
 * reference, never dropped), so its address cannot be reused by another
 * code object while the key stands; ids are checked against the interning
 * generation (log_intern.h), so a reopened log is never given stale ids. */
#include "context/pystack.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/lock.h"
#include "log/log_intern.h"

#define TEXT_BYTES 16384 /* file and function names of one capture */
#define NAME_MAX_BYTES 1024

typedef void pyobj; /* PyObject, PyFrameObject, PyThreadState: opaque here */

static struct {
  int ok; /* every required symbol was found */
  int (*IsInitialized)(void);
  int (*IsFinalizing)(void); /* optional */
  pyobj *(*GILState_GetThisThreadState)(void);
  int (*GILState_Ensure)(void);
  void (*GILState_Release)(int);
  pyobj *(*ThreadState_Get)(void);
  pyobj *(*ThreadState_GetFrame)(pyobj *);
  pyobj *(*Frame_GetCode)(pyobj *);
  int (*Frame_GetLineNumber)(pyobj *);
  pyobj *(*Frame_GetBack)(pyobj *);
  pyobj *(*Object_GetAttrString)(pyobj *, const char *);
  const char *(*Unicode_AsUTF8)(pyobj *);
  void (*DecRef)(pyobj *);
  void (*Err_Fetch)(pyobj **, pyobj **, pyobj **);
  void (*Err_Restore)(pyobj *, pyobj *, pyobj *);
  void (*IncRef)(pyobj *);
  int (*GILState_Check)(void); /* optional: skip Ensure/Release when the GIL is held */
  int (*Frame_GetLasti)(pyobj *); /* optional (3.11+): a cheaper key than the line */
} py;

static pthread_once_t resolved = PTHREAD_ONCE_INIT;

#define FIND(field, name) ((*(void **)(&py.field) = dlsym(RTLD_DEFAULT, name)) != NULL)

static void resolve(void) {
  py.ok = FIND(IsInitialized, "Py_IsInitialized") && FIND(GILState_GetThisThreadState, "PyGILState_GetThisThreadState") &&
          FIND(GILState_Ensure, "PyGILState_Ensure") && FIND(GILState_Release, "PyGILState_Release") &&
          FIND(ThreadState_Get, "PyThreadState_Get") && FIND(ThreadState_GetFrame, "PyThreadState_GetFrame") &&
          FIND(Frame_GetCode, "PyFrame_GetCode") && FIND(Frame_GetLineNumber, "PyFrame_GetLineNumber") &&
          FIND(Frame_GetBack, "PyFrame_GetBack") && FIND(Object_GetAttrString, "PyObject_GetAttrString") &&
          FIND(Unicode_AsUTF8, "PyUnicode_AsUTF8") && FIND(DecRef, "Py_DecRef") && FIND(Err_Fetch, "PyErr_Fetch") &&
          FIND(Err_Restore, "PyErr_Restore") && FIND(IncRef, "Py_IncRef");
  (void)FIND(GILState_Check, "PyGILState_Check");
  (void)FIND(Frame_GetLasti, "PyFrame_GetLasti");
  /* Public from 3.13; private before. Without it, a thread racing interpreter
   * shutdown could block in PyGILState_Ensure. */
  if (!FIND(IsFinalizing, "Py_IsFinalizing")) (void)FIND(IsFinalizing, "_Py_IsFinalizing");
}

/* Copy the UTF-8 text of attribute `attr` of `code` into the text buffer. */
static const char *copy_attr(pyobj *code, const char *attr, char *text, size_t *used) {
  pyobj *o = py.Object_GetAttrString(code, attr);
  const char *s = o ? py.Unicode_AsUTF8(o) : NULL;
  if (!s) s = "?";
  size_t len = strnlen(s, NAME_MAX_BYTES);
  const char *out = NULL;
  if (*used + len + 1 <= TEXT_BYTES) {
    out = text + *used;
    memcpy(text + *used, s, len);
    text[*used + len] = '\0';
    *used += len + 1;
  }
  if (o) py.DecRef(o);
  return out;
}

/* Walk the frames (GIL held). Returns the number captured. */
static int walk(ta_log_frame_text *frames, int depth, char *text) {
  size_t used = 0;
  int n = 0;
  pyobj *f = py.ThreadState_GetFrame(py.ThreadState_Get());
  while (f && n < depth) {
    pyobj *code = py.Frame_GetCode(f);
    ta_log_frame_text *fr = &frames[n];
    fr->line = (uint32_t)py.Frame_GetLineNumber(f);
    fr->file = code ? copy_attr(code, "co_filename", text, &used) : NULL;
    fr->func = code ? copy_attr(code, "co_name", text, &used) : NULL;
    if (code) py.DecRef(code);
    if (!fr->file || !fr->func) break; /* text buffer full: keep the frames so far */
    n++;
    pyobj *back = py.Frame_GetBack(f);
    py.DecRef(f);
    f = back;
  }
  if (f) py.DecRef(f);
  return n;
}

/* ------------------------------------------------------------------------
 * The cache: stack keys -> interned stack id
 * ---------------------------------------------------------------------- */

#define CACHE_SLOTS 8192 /* direct-mapped; a collision replaces the older stack */
#define PIN_LIMIT 65536  /* code objects kept alive at most; past it, no new cache entries */

typedef struct cached_stack {
  uint64_t hash, generation;
  uint32_t id;
  int n, depth;
  uint64_t *keys; /* 2 n words: code object address, instruction offset (or line) */
} cached_stack;

static struct {
  ta_lock lock; /* the cache and the pins (never held while waiting for the GIL) */
  cached_stack slots[CACHE_SLOTS];
  uintptr_t *pins; /* open-addressing set of pinned code objects */
  size_t pin_cap, npins;
} C;

static uint64_t hash_keys(const uint64_t *keys, int n, int depth) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)depth;
  for (int i = 0; i < 2 * n; i++) h = (h ^ keys[i]) * 0xff51afd7ed558ccdull;
  return h ^ h >> 29;
}

static uint32_t cache_get(uint64_t hash, const uint64_t *keys, int n, int depth, uint64_t generation) {
  cached_stack *c = &C.slots[hash & (CACHE_SLOTS - 1)];
  ta_lock_acquire(&C.lock);
  uint32_t id = c->hash == hash && c->generation == generation && c->n == n && c->depth == depth &&
                        memcmp(c->keys, keys, (size_t)n * 2 * sizeof *keys) == 0
                    ? c->id
                    : 0;
  ta_lock_release(&C.lock);
  return id;
}

static void cache_put(uint64_t hash, const uint64_t *keys, int n, int depth, uint64_t generation, uint32_t id) {
  uint64_t *copy = malloc((size_t)n * 2 * sizeof *keys);
  if (!copy) return;
  memcpy(copy, keys, (size_t)n * 2 * sizeof *keys);
  cached_stack *c = &C.slots[hash & (CACHE_SLOTS - 1)];
  ta_lock_acquire(&C.lock);
  uint64_t *old = c->keys;
  *c = (cached_stack){.hash = hash, .generation = generation, .id = id, .n = n, .depth = depth, .keys = copy};
  ta_lock_release(&C.lock);
  free(old);
}

/* Add `code` to the pinned set, taking a reference the first time (GIL and
 * C.lock held). 0 when the set is full or host memory runs out. */
static int pin(uintptr_t code) {
  if (2 * (C.npins + 1) > C.pin_cap) {
    size_t cap = C.pin_cap ? C.pin_cap * 2 : 1024;
    if (cap > 2 * PIN_LIMIT) return 0;
    uintptr_t *pins = calloc(cap, sizeof *pins);
    if (!pins) return 0;
    for (size_t i = 0; i < C.pin_cap; i++) {
      if (!C.pins[i]) continue;
      size_t j = (size_t)(C.pins[i] >> 4) & (cap - 1);
      while (pins[j]) j = (j + 1) & (cap - 1);
      pins[j] = C.pins[i];
    }
    free(C.pins);
    C.pins = pins;
    C.pin_cap = cap;
  }
  size_t j = (size_t)(code >> 4) & (C.pin_cap - 1);
  while (C.pins[j] && C.pins[j] != code) j = (j + 1) & (C.pin_cap - 1);
  if (!C.pins[j]) {
    C.pins[j] = code;
    C.npins++;
    py.IncRef((pyobj *)code);
  }
  return 1;
}

/* Pin every code object of a stack (GIL held): 1 when all are. */
static int pin_all(const uint64_t *keys, int n) {
  int ok = 1;
  ta_lock_acquire(&C.lock);
  for (int i = 0; ok && i < n; i++) ok = pin((uintptr_t)keys[2 * i]);
  ta_lock_release(&C.lock);
  return ok;
}

/* The keys of the innermost `depth` frames (GIL held): the code object's
 * address and where in it the frame is. No strings, nothing allocated once
 * the frames' objects exist. Returns the number of frames. */
static int walk_keys(uint64_t *keys, int depth) {
  int n = 0;
  pyobj *f = py.ThreadState_GetFrame(py.ThreadState_Get());
  while (f && n < depth) {
    pyobj *code = py.Frame_GetCode(f);
    if (!code) break;
    keys[2 * n] = (uint64_t)(uintptr_t)code; /* the frame holds the code while we hold the frame */
    keys[2 * n + 1] = (uint64_t)(uint32_t)(py.Frame_GetLasti ? py.Frame_GetLasti(f) : py.Frame_GetLineNumber(f));
    py.DecRef(code);
    n++;
    pyobj *back = py.Frame_GetBack(f);
    py.DecRef(f);
    f = back;
  }
  if (f) py.DecRef(f);
  return n;
}

uint32_t ta_pystack_capture(int depth) {
  pthread_once(&resolved, resolve);
  if (!py.ok || depth <= 0 || !py.IsInitialized() || (py.IsFinalizing && py.IsFinalizing())) return 0;
  /* A thread that never ran Python (the autograd engine's) has no frames;
   * taking the GIL there would only create and destroy a thread state. */
  if (!py.GILState_GetThisThreadState()) return 0;
  if (depth > 64) depth = 64;
  uint64_t keys[2 * 64];
  /* torch.empty calls the allocator with the GIL held: no Ensure/Release then. */
  int held = py.GILState_Check && py.GILState_Check();
  int g = held ? 0 : py.GILState_Ensure();
  pyobj *type, *value, *tb; /* a free may run while an exception is being raised */
  py.Err_Fetch(&type, &value, &tb);
  int n = walk_keys(keys, depth);
  uint64_t hash = hash_keys(keys, n, depth);
  uint32_t id = n ? cache_get(hash, keys, n, depth, ta_log_intern_generation()) : 0;
  if (id) {
    py.Err_Restore(type, value, tb);
    if (!held) py.GILState_Release(g);
    return id;
  }
  /* Not seen yet: the names, then interning with the GIL released. */
  ta_log_frame_text frames[64];
  char text[TEXT_BYTES];
  int named = walk(frames, depth, text);
  int cacheable = named == n && n > 0 && pin_all(keys, n);
  py.Err_Restore(type, value, tb);
  if (!held) py.GILState_Release(g);
  uint64_t generation = 0;
  id = ta_log_intern_stack_in(frames, named, &generation);
  if (id && cacheable) cache_put(hash, keys, n, depth, generation, id);
  return id;
}

/* The lock is a leaf (nothing is taken while it is held), so the fork
 * handler takes it last; parent and child both just release it (held
 * across fork(), which the analysis cannot follow). */
TA_NO_THREAD_SAFETY_ANALYSIS void ta_pystack_fork_prepare(void) { ta_lock_acquire(&C.lock); }
TA_NO_THREAD_SAFETY_ANALYSIS void ta_pystack_fork_release(void) { ta_lock_release(&C.lock); }
