/* TORCHALLOC_CONF: every option in one place, parsed once. */
#ifndef TA_CONFIG_H
#define TA_CONFIG_H

#include "base/common.h"
#include "context/roundup.h"

enum ta_backend_kind { TA_BACKEND_CUDA = 0, TA_BACKEND_SIM = 1 };

#define TA_NAME_MAX 32
#define TA_PATH_MAX 1024

typedef struct ta_config {
  char policy[TA_NAME_MAX];
  int backend;              /* enum ta_backend_kind */
  size_t sim_capacity;      /* bytes per simulated device */
  int sim_devices;
  uint64_t sim_fail_alloc;  /* fail the Nth device allocation; 0: never */
  int sim_event_polls;      /* sim events complete on their Nth query; 0: at once */
  size_t sim_held_elsewhere; /* bytes of each sim device another user holds (another process, say) */
  int warn;                 /* print misuse lines on stderr */
  char log_path[TA_PATH_MAX]; /* "" = no log */
  size_t log_max;           /* 0 = unlimited */
  int stacks;
  int stack_depth;
  int oom;                  /* enum ta_oom_action: what a failed torchalloc_malloc does */
  char oom_report[TA_PATH_MAX]; /* "": beside the log, else the working directory; "off"; or a directory */
  int expandable;           /* enum ta_expandable_mode: how caching and phase_arena use the device's virtual
                             * memory (where it has it; ordinary segments otherwise) */
  int sim_vmm;              /* the sim device has virtual memory (0: model one without, for tests) */
  uint64_t sim_lag;         /* ticks the sim device trails the host by (backend.h); 0: none */
  size_t large_handle;      /* bytes per physical handle of large-pool expandable segments */
  int large_handle_set;     /* `handle` was given: it holds under a memory fraction too */
  size_t run_bytes;         /* the most bytes a handle of warm-up growth may take (TA_DEFAULT_RUN); 0: none */
  int peers;                /* enum ta_peers_mode: which other devices may touch mapped memory */
  int time_calls;           /* count the host time of malloc and free in the stats (host_ns) */
  int move_time;            /* per mille of the host's time reclaim may spend moving memory while the device
                             * waits for the host (segments_moves.c); 0: no limit */
  size_t grow_below;        /* below this reserve reclaim grows instead of moving (segments_moves.c); 0: never */
  ta_roundup roundup;       /* roundup_power2_divisions (roundup.h); all 0: requests round to 512 B */
  int capture_reuse;        /* graph_capture_record_stream_reuse: during a capture, a block freed after
                             * record_stream is reused once the graph joined its streams (heap_streams.c) */
} ta_config;

/* `peers`: memory mapped with the driver's virtual memory calls is
 * reachable only from the devices its mapping names, so a copy from
 * another GPU fails ("invalid argument") unless access was granted.
 * `all` (the default) grants it to every device with a peer-to-peer path
 * that the process allocates on, from its first allocation (runtime.h,
 * devices_in_use): the plain pluggable route never hears PyTorch ask for
 * peer access, so it must grant it up front; a torchrun rank that uses one
 * GPU of the node grants nothing. `asked` grants a device only when
 * torchalloc_enable_peer_access is called, as PyTorch's enablePeerAccess
 * calls it on the bridge route (before the first copy between two
 * devices); install() picks it on the bridge route. */
enum ta_peers_mode { TA_PEERS_ALL = 0, TA_PEERS_ASKED = 1 };

/* `handle`: large-pool expandable segments map memory in physical handles
 * of this size (rounded up to the device's granule). Why 8 MiB: the
 * driver's calls cost per handle, not per byte (bench/vmm_costs.c, H100:
 * 2 MiB handles cost ~40 ms a GiB to make and map, 8 MiB ones ~7), and
 * reclaim moves memory a handle at a time; larger handles leave more free
 * memory stuck inside handles partly in use (replay of the bundled traces:
 * 1.007x allocated at 4 MiB, 1.009x at 8, 1.012x at 16). The small pool
 * keeps the device's granule. Under a memory fraction, unless `handle` is
 * set, segments made from then on use the device's granule too: under a
 * cap every MiB counts, and free memory stuck in 8 MiB handles partly in
 * use is what made a run that fits in 2 MiB handles run out (H100, the
 * Llama decoder of python/tests/test_oom_advice_gpu.py under 9000 MiB). */
#define TA_DEFAULT_LARGE_HANDLE ((size_t)8 << 20) /* the `handle` row's default in config.c says it too */
#define TA_MIN_LARGE_HANDLE ((size_t)2 << 20) /* the granule of the GPUs torchalloc runs on */
#define TA_MAX_LARGE_HANDLE ((size_t)1 << 30)

/* `run`: while the reserve grows past the most it ever was in the first
 * ramp (the warm-up: until allocated bytes first fall below half their
 * most), new memory of the large pool is made in handles of this many bytes, each
 * a run of granules (segments_runs.c; what is left over, a granule each): the driver's calls cost per handle,
 * so GPT-2's 15 GiB warm-up in 8 MiB handles took about 1,900 creates,
 * maps and access grants (bench/vmm_costs.c, H200: 5.4 ms a GiB in 8 MiB
 * handles, 2.5 in 64 MiB ones). Why 32 MiB: a run is moved and given back
 * only whole, and runs made in the first ramp can stay partly in use
 * (gradients allocated where activations were), so their size is what the
 * reserve pays for the warm-up's time. 64 MiB runs of the first ramp,
 * without the 1/64 share of segments_runs.c, made the mixture-of-experts
 * decoder reserve 1.020x its peak allocated (1.006x without runs); with
 * the share, 1.011x. 32 MiB runs with the share (BENCHMARKS.md, four
 * H200s, 2026-11-28, rounds in turned orders): the mean step over all
 * steps x native's moe 1.031 (1.044 without runs; its first ten steps 79 ms
 * above native's instead of 251), GPT-2 1.020 (1.052), at 1.010x and
 * 1.006x reserved (1.007, 1.004). */
#define TA_DEFAULT_RUN ((size_t)32 << 20) /* the `run` row's default in config.c says it too */

/* `expandable`: 0 ordinary segments (PyTorch's, byte for byte); 1 grow one
 * expandable segment per stream and pool; 2 compact (and before reserving
 * past the most ever reserved, give back free granules, after a device
 * synchronize); 3 reclaim, the default: as compact, but free granules move
 * where memory is needed as per-stream markers show the device is past
 * them, never synchronizing (policy.h's TA_POLICY_RECLAIM). */
enum ta_expandable_mode {
  TA_EXPANDABLE_OFF = 0,
  TA_EXPANDABLE_GROW = 1,
  TA_EXPANDABLE_COMPACT = 2,
  TA_EXPANDABLE_RECLAIM = 3,
};

/* "off", "on", "compact", "reclaim": the names of the modes, by number. */
ta_internal const char *ta_expandable_name(int mode);

/* A failed torchalloc_malloc (size > 0): PyTorch's plain pluggable route
 * builds a tensor on a NULL pointer and the next kernel kills the CUDA
 * context, so on the real device the default is to print the reason and
 * stop the process. The C++ bridge never stops it (it raises
 * OutOfMemoryError instead); C programs and the simulated device get NULL. */
enum ta_oom_action { TA_OOM_AUTO = 0, TA_OOM_ABORT = 1, TA_OOM_NULL = 2 };

/* TA_OOM_ABORT or TA_OOM_NULL, `auto` resolved by the backend. */
static inline int ta_config_oom_action(const ta_config *c) {
  if (c->oom != TA_OOM_AUTO) return c->oom;
  return c->backend == TA_BACKEND_CUDA ? TA_OOM_ABORT : TA_OOM_NULL;
}

ta_internal void ta_config_defaults(ta_config *c);

/* Parse `text` (the TORCHALLOC_CONF syntax) over `c`. Returns 0, or -1 with a
 * message naming the offending key in `err`. `c` is unchanged on error. */
ta_internal int ta_config_parse(ta_config *c, const char *text, char *err, size_t errlen);

/* For a `text` that ta_config_parse refused: apply only its keys that say
 * how a failure is answered (oom, backend), those that parse; the rest is
 * ignored. A process whose configuration is wrong still gets NULL back
 * under oom:null instead of being stopped. */
ta_internal void ta_config_salvage(ta_config *c, const char *text);

/* "80GiB", "512MB", "1048576" -> bytes. Returns 0 or -1. */
ta_internal int ta_parse_bytes(const char *text, size_t *out);

/* The keys, space-separated, in the table's order (torchalloc_config_keys). */
ta_internal const char *ta_config_key_list(void);

/* One line per key, "key\tvalues\tdefault\thelp\n" (torchalloc_config_help). */
ta_internal const char *ta_config_help(void);

#endif
