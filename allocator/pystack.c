/* Capturing the Python stack with CPython's C API, found at run time.
 *
 * Only functions of the 3.10+ API are used (no struct layouts): frames via
 * PyThreadState_GetFrame / PyFrame_GetBack, their code objects' co_filename
 * and co_name via getattr. The GIL is held for the walk only: names are
 * copied out, the GIL is released, and then they are interned, so Python
 * threads never wait on the log's mutex through us. */
#include "pystack.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "log_intern.h"

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
          FIND(Err_Restore, "PyErr_Restore");
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

uint32_t ta_pystack_capture(int depth) {
  pthread_once(&resolved, resolve);
  if (!py.ok || depth <= 0 || !py.IsInitialized() || (py.IsFinalizing && py.IsFinalizing())) return 0;
  /* A thread that never ran Python (the autograd engine's) has no frames;
   * taking the GIL there would only create and destroy a thread state. */
  if (!py.GILState_GetThisThreadState()) return 0;
  if (depth > 64) depth = 64;
  ta_log_frame_text frames[64];
  char text[TEXT_BYTES];
  int g = py.GILState_Ensure();
  pyobj *type, *value, *tb; /* a free may run while an exception is being raised */
  py.Err_Fetch(&type, &value, &tb);
  int n = walk(frames, depth, text);
  py.Err_Restore(type, value, tb);
  py.GILState_Release(g);
  return ta_log_intern_stack(frames, n);
}
