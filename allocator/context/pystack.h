/* Python source locations for the block log (TORCHALLOC_CONF stacks:1).
 *
 * CPython's functions are looked up at run time (dlsym), so the library
 * loads and works in a process without Python; there every capture is 0.
 * A capture takes the GIL: call it only with no allocator lock held. */
#ifndef TA_PYSTACK_H
#define TA_PYSTACK_H

#include "base/common.h"

/* The calling thread's Python stack, innermost frame first, at most
 * `depth` frames, interned in the log. 0: no Python in this process, a
 * thread without Python frames (the autograd engine's), or no log open. */
ta_internal uint32_t ta_pystack_capture(int depth);

/* fork(): hold the stack cache's lock across it (runtime.c's fork handler). */
ta_internal void ta_pystack_fork_prepare(void);
ta_internal void ta_pystack_fork_release(void);

#endif
