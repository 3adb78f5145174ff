/* torchalloc: the simulated device (TORCHALLOC_CONF backend:sim) as tests
 * and fuzzers drive it: its models of CUDA stream capture, of a device that
 * runs behind the host (the lag model) and of peer access, and its physical
 * memory. Exported by libtorchalloc.so beside the plug-in API (torchalloc.h). */
#ifndef TORCHALLOC_SIM_H
#define TORCHALLOC_SIM_H

#include "torchalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The capture model: while `stream` of sim device `device` is capturing, any
 * synchronize, event record, event query or device free is a violation
 * (each would invalidate a real capture) and is counted. -1 when the
 * backend is not sim. */
TORCHALLOC_API int torchalloc_sim_capture(int device, cudaStream_t stream, int capturing);
/* `waiter` waits for the work queued on `waited` so far (an event recorded
 * on `waited`, then cudaStreamWaitEvent on `waiter`). In a capture the sim
 * models its topology: a kernel reported with torchalloc_sim_use on a
 * capturing stream is a node after that stream's last ones, and a wait adds
 * `waited`'s last nodes to `waiter`'s (a stream outside the capture joins
 * it: a fork; a stream waiting for a forked one: a join). -1 when the
 * backend is not sim. */
TORCHALLOC_API int torchalloc_sim_stream_wait(int device, cudaStream_t waiter, cudaStream_t waited);
/* Violations so far on `device` (and the last one's description in `buf`):
 * the capture ones, and those of the lag model below. */
TORCHALLOC_API int64_t torchalloc_sim_capture_violations(int device, char *buf, size_t len);
/* The lag model (TORCHALLOC_CONF sim_lag:N): the simulated device runs N
 * ticks behind the host. The program says what its kernels touch: each
 * call is one kernel launched on `stream` touching [ptr, ptr + size), one
 * tick of the clock; it is done N ticks later, as is an event recorded
 * when it was launched. A violation is counted when a kernel touches
 * unmapped memory, touches physical memory that a kernel of another stream
 * may still be using (memory handed out too early; two addresses of one
 * physical granule are the same memory), or when memory is unmapped while
 * a kernel queued on it may still run. -1 when the backend is not sim. */
TORCHALLOC_API int torchalloc_sim_use(int device, cudaStream_t stream, const void *ptr, size_t size);
/* `ticks` of host time pass on sim device `device` without kernels. */
TORCHALLOC_API int torchalloc_sim_advance(int device, uint64_t ticks);
/* The physical memory behind `ptr` on sim device `device` (a number unique
 * among the memory mapped now: aliases of one granule give the same); -1
 * when it is not mapped or the backend is not sim. */
TORCHALLOC_API int torchalloc_sim_physical(int device, const void *ptr, uint64_t *phys);
/* Called when sim device `device` copies `size` bytes of physical memory
 * (torchalloc_sim_physical's numbers) from `src` to `dst`: the out-of-memory
 * path moves live bytes into smaller handles, and a test that keeps data
 * by physical memory moves it with them. NULL: none. */
typedef void (*torchalloc_sim_copy_fn)(int device, uint64_t dst, uint64_t src, size_t size);
TORCHALLOC_API void torchalloc_sim_on_copy(torchalloc_sim_copy_fn fn);

/* The simulated device's peer access: a copy or kernel of device `peer`
 * touches [ptr, ptr + size) of sim device `device`. 0 when allowed, 1 (a
 * counted violation, see torchalloc_sim_capture_violations) when that
 * memory grants `peer` no access, -1 when the backend is not sim. */
TORCHALLOC_API int torchalloc_sim_peer_use(int device, int peer, const void *ptr, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* TORCHALLOC_SIM_H */
