"""The numbers the C side writes into logs and stats, named once for all of Python.

Every module that reads a log record's kind, flags, policy or pool, or a
stats array's pool index, takes the number and its name from here; the log
decoder (`torchalloc.log`) re-exports them for users. The C sources are the
authority: ``enum ta_log_kind`` and the flag and status enums in
allocator/log/log_format.h, the policy list in policies/policy_list.h (its order is the policy
id a record carries), ``TORCHALLOC_POOL_*`` in include/torchalloc.h; the
file layout is docs/LOG_FORMAT.md.

Plain Python, no numpy: the runtime (stats) imports it too.
"""
from __future__ import annotations

# The first 8 bytes of every log (TA_LOG_MAGIC).
LOG_MAGIC = b"TALOG\0\0\0"

# ---------------------------------------------------------------------------
# Record kinds (enum ta_log_kind)
# ---------------------------------------------------------------------------

ALLOC = 1
FREE = 2
SEGMENT_ALLOC = 3
SEGMENT_FREE = 4
OOM = 5
TRIM = 6
PHASE_BEGIN = 7
PHASE_END = 8
MARKER = 9
TRUNCATED = 10
STRING = 11
FRAME = 12
STACK = 13
END = 14
OOM_DEVICE = 15
MODULE = 16
MODULE_NAME = 17
MODULE_TAG = 18
DEVICE = 19

KIND_NAMES: dict[int, str] = {
    ALLOC: "alloc",
    FREE: "free",
    SEGMENT_ALLOC: "segment_alloc",
    SEGMENT_FREE: "segment_free",
    OOM: "oom",
    TRIM: "trim",
    PHASE_BEGIN: "phase_begin",
    PHASE_END: "phase_end",
    MARKER: "marker",
    TRUNCATED: "truncated",
    STRING: "string",
    FRAME: "frame",
    STACK: "stack",
    END: "end",
    OOM_DEVICE: "oom_device",
    MODULE: "module",
    MODULE_NAME: "module_name",
    MODULE_TAG: "module_tag",
    DEVICE: "device",
}
KIND_IDS: dict[str, int] = {name: kind for kind, name in KIND_NAMES.items()}
MAX_KIND = max(KIND_NAMES)
# Records that only define what event records refer to (strings, frames, stacks).
METADATA_KINDS = (STRING, FRAME, STACK)
# Records whose `stack` field holds a string id (the label), not a stack id.
LABELLED_KINDS = (PHASE_BEGIN, PHASE_END, MARKER, MODULE_NAME)

# ---------------------------------------------------------------------------
# Flags and statuses
# ---------------------------------------------------------------------------

# Flag of a FREE record: other streams used the block; it is reused once their work completes.
FREE_DEFERRED = 1

# Flags of a SEGMENT_ALLOC / SEGMENT_FREE record: a run of an expandable segment's granules mapped / unmapped.
SEGMENT_EXPANDABLE = 1
SEGMENT_COMPACT = 2  # the expandable segment's policy ran in compact mode (expandable:2)
SEGMENT_RECLAIM = 4  # ... in reclaim mode (expandable:3); logs written before these flags have neither
# Flags of a TRIM record: what released the cached segments.
TRIM_REASONS = {0: "empty_cache", 1: "oom_retry", 2: "arena_trim"}
# flags of a MODULE_TAG record (TA_LOG_TAG_*): what the tagged block is to its module
TAG_PARAMETER = 1
TAG_GRADIENT = 2
TAG_OPTIMIZER_STATE = 3
TAG_NAMES = {TAG_PARAMETER: "parameter", TAG_GRADIENT: "gradient", TAG_OPTIMIZER_STATE: "optimizer state"}

# The header's status (and the flags of a TRUNCATED record).
STATUS_OPEN = 0  # being written, or the writer died
STATUS_CLOSED = 1  # closed cleanly: an END record is last
STATUS_LOG_MAX = 2  # log_max reached: a TRUNCATED record is last
STATUS_NO_SPACE = 3  # the file could not grow (disk full)
STATUS_NO_ADDRESS = 4  # the address-space reservation is used up
STATUS_NAMES = {
    STATUS_OPEN: "open",
    STATUS_CLOSED: "closed",
    STATUS_LOG_MAX: "log_max reached",
    STATUS_NO_SPACE: "file could not grow",
    STATUS_NO_ADDRESS: "address space used up",
}
# Statuses with which the writer stopped before the run ended.
STATUS_CUT_SHORT = (STATUS_LOG_MAX, STATUS_NO_SPACE, STATUS_NO_ADDRESS)

# ---------------------------------------------------------------------------
# Policies and pools
# ---------------------------------------------------------------------------

# Policy id -> name, in the order of the C policy registry (a record's `policy` field).
POLICY_NAMES = {0: "caching", 1: "exact", 2: "phase_arena"}

# TORCHALLOC_POOL_*: the index into every stat array, and a block or segment record's `pool`.
POOL_ALL, POOL_SMALL, POOL_LARGE = 0, 1, 2
# A record's pool; 0 means the record is not about a block or segment.
POOL_NAMES = {POOL_ALL: "", POOL_SMALL: "small", POOL_LARGE: "large"}
# The pool part of torch.cuda.memory_stats() keys, by stat array index.
STAT_POOL_KEYS = ("all", "small_pool", "large_pool")
