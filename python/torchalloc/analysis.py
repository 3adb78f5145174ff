"""Explain a torchalloc event log: what was live, when, and why it was freed when it was.

Input: the decoded log (`torchalloc.log.read_log`), turned by `table_from_log`
into an `EventTable` -- parallel numpy arrays (kind, time_ns, addr, size,
block_size, stream, tid, stack, phase, device, seq, flags) plus the interned
strings, stacks and phase names. Everything else here reads only that table,
so the log format can change behind one adapter, and tests build tables by
hand (`EventTable.from_rows`).

What comes out (`analyze` returns an `Analysis`):

- blocks: one row per block (alloc paired with its free by address, in log
  order), with both stacks, phases, phase occurrences and threads;
- the timeline: allocated and reserved bytes after every event (numpy
  cumsum), allocated split by the phase that allocated each block, the peak;
- peak anatomy: the blocks live at the peak (or at a marker, or a time),
  grouped by allocation site and phase, largest first;
- lifetimes: per allocation site and reason, count, bytes, typical lifetime
  and a sentence saying why the block was freed when it was;
- phase summary: per phase, allocated / freed / peak / reserved growth and
  what stayed (persistent), was handed on, or was transient, in a sentence;
- categories: parameters, gradients, optimizer state, optimizer
  intermediates, activations, temporaries, library workspaces -- the terms of
  the usual estimate params + optimizer state + max(grads + optimizer
  intermediates, activations), measured.

Allocation site
---------------
A stack is a list of Python frames (file, line, function), innermost first.
A frame is *library* when its file is in torch, functorch, triton or
torchalloc (installed, or a torch source tree), in the Python standard
library, or frozen (`is_library_frame`). The *user suffix* of a stack starts
at its innermost non-library frame (the whole stack when every frame is
library). The *site* of a block is the first frame of its allocation
stack's user suffix: the user's line that made it, e.g. ``y = model(x)``
rather than a line inside torch.nn.

Why a block was freed (`Reason`), in this order of precedence
-------------------------------------------------------------
Let A be the user suffix of the allocation stack and F that of the free
stack.

1. persistent -- never freed by the end of the log. Sub-labelled by its
   category (parameters, gradients, optimizer state, library workspace...).
2. saved for backward -- allocated outside backward and freed during
   backward. "During backward" means a phase whose name says backward
   (``torchalloc.phase("backward")``), or, without such phases, a free on a
   thread without Python frames (autograd's engine) while a Python thread
   is inside ``Tensor.backward``/``torch.autograd.backward`` (seen as
   records whose stacks hold those frames).
3. Stack rules (both stacks recorded):

   - temporary -- F == A: freed by the same line, in the same chain of
     calls, that made it (``x + 1`` whose result is dropped; the
     intermediate of ``(x + 1) * 2``; a whole no_grad forward's activations
     seen from the ``model(x)`` line). Invisible to before/after
     measurements of that line, but part of its peak.
   - freed when its function returned -- F is a proper outer suffix of A:
     F == A[k:] for some k >= 1. CPython unlinks a returning frame before it
     clears its locals, so a local freed at return is freed with the
     *caller* as the current frame, at the line that made the call. The
     report names the returning user function (the outermost user frame in
     A[:k]) and the caller's line (F[0]).
   - freed on rebinding -- A and F share their outer frames up to one frame
     of the same function (same file and function name) at a different
     line, and that frame is F's innermost: the name holding the block was
     assigned again (or deleted) at that later line (``x = x + 1`` at top
     level frees the old ``x`` on that line). A block returned from a
     deeper call and dropped later by its caller counts here too.
   - other -- anything else (freed inside a call it was passed to, freed on
     another thread, freed from a different call path); the free site is
     shown.

4. Without stacks (logged without ``stacks:1``), rules 1 and 2 still apply;
   the rest falls back to phases: "freed within its phase" (the same
   occurrence of the phase that allocated it) or "freed in a later phase".
   The report says that stacks were missing.

The same line run again in a loop (``for ...: x = x + 1`` where the loop
header allocates nothing) frees the previous value on the very line that
made it, and reads as temporary: stacks carry lines, not iterations.
A block whose F equals A but where another line of the same function
allocated between its alloc and its free is therefore called "freed on
rebinding" (the line ran again later), not temporary.

Phase roles
-----------
Phase names are the user's. A name is taken as forward-like when it matches
``forward|fwd``, backward-like for ``backward|bwd``, optimizer-like for
``optim|adam|sgd|step|update`` and setup-like for
``init|setup|load|model|build|param|create`` (case-insensitive; see
`phase_role`). Roles drive "saved for backward", the categories and the
phase sentences; a log without phases still gets every stack-based answer.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

# Record kinds (docs/LOG_FORMAT.md).
ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM, TRIM = 1, 2, 3, 4, 5, 6
PHASE_BEGIN, PHASE_END, MARKER, TRUNCATED, END = 7, 8, 9, 10, 14
FREE_DEFERRED = 1

NEVER = np.iinfo(np.int64).max  # free index of a block never freed


class Frame(NamedTuple):
    """One Python frame, as the log records it."""

    filename: str
    line: int
    function: str

    def short(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.line} {self.function}"

    def long(self) -> str:
        return f"{self.filename}:{self.line} in {self.function}"


Stack = tuple[Frame, ...]


class Reason(str, enum.Enum):
    """Why a block was freed when it was (see the module docstring)."""

    TEMPORARY = "temporary"
    FUNCTION_RETURNED = "freed when its function returned"
    REBINDING = "freed on rebinding"
    SAVED_FOR_BACKWARD = "saved for backward"
    PERSISTENT = "persistent"
    SAME_PHASE = "freed within its phase"  # no stacks: fallback
    LATER_PHASE = "freed in a later phase"  # no stacks: fallback
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


class Category(str, enum.Enum):
    """What a block was for, in the terms of the usual memory estimate."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer state"
    OPTIMIZER_INTERMEDIATES = "optimizer intermediates"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    BACKWARD_TEMPORARIES = "backward temporaries"
    WORKSPACE = "library workspace"
    BEFORE_LOG = "allocated before the log began"
    OTHER_PERSISTENT = "other persistent (inputs, caches...)"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


# cuBLAS workspaces torch allocates through the current allocator, per
# (handle, stream), at the first matmul of each thread, never freed:
# 4096 KiB x 8 on sm_90/sm_100, else 4096 KiB x 2 + 16 KiB x 8; cuBLASLt's
# 1 MiB in some versions. CUBLAS_WORKSPACE_CONFIG changes them.
WORKSPACE_SIZES = frozenset({4096 * 1024 * 8, 4096 * 1024 * 2 + 16 * 1024 * 8, 4096 * 1024, 1024 * 1024})


def _workspace_sizes() -> frozenset[int]:
    """The known workspace sizes plus the one $CUBLAS_WORKSPACE_CONFIG (":KIB:COUNT...") gives."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    nums = [int(n) for n in re.findall(r"\d+", config)]
    extra = sum(nums[i] * 1024 * nums[i + 1] for i in range(0, len(nums) - 1, 2))
    return WORKSPACE_SIZES | ({extra} if extra else set())


# ---------------------------------------------------------------------------
# Library frames and sites
# ---------------------------------------------------------------------------

_PACKAGE_DIR = str(Path(__file__).resolve().parent).replace("\\", "/") + "/"
_LIBRARY_PACKAGES = r"(?:torch|torchalloc|functorch|triton|torchgen)"
_INSTALLED_RE = re.compile(r"/(?:site|dist)-packages/" + _LIBRARY_PACKAGES + r"(?:/|\.py$)")
# A torch source tree (pip install -e): its well-known subpackages and modules.
_TORCH_TREE_RE = re.compile(
    r"/torch/(?:nn|autograd|optim|utils|cuda|amp|distributed|fx|_dynamo|_inductor|_functorch|_prims|_refs|"
    r"_decomp|_higher_order_ops|_library|_subclasses|testing|jit|func|_tensor\.py|functional\.py|"
    r"overrides\.py|_ops\.py|serialization\.py|random\.py|__init__\.py|_jit_internal\.py)"
)
_STDLIB_RE = re.compile(r"/lib/python3\.\d+/[^/]+(?:\.py|/)")


def is_library_frame(filename: str) -> bool:
    """Whether a frame belongs to torch & co., torchalloc, the stdlib or frozen modules (not the user's)."""
    f = filename.replace("\\", "/")
    if f.startswith("<frozen") or f.startswith(_PACKAGE_DIR):
        return True
    if _INSTALLED_RE.search(f) or _TORCH_TREE_RE.search(f):
        return True
    return bool(_STDLIB_RE.search(f)) and "-packages/" not in f


def user_suffix(stack: Stack) -> Stack:
    """The stack from its innermost user frame outward (the whole stack if none is the user's)."""
    for i, frame in enumerate(stack):
        if not is_library_frame(frame.filename):
            return stack[i:]
    return stack


def _has_frame(stack: Stack, pattern: re.Pattern[str]) -> bool:
    return any(pattern.search(f"{f.filename.replace(chr(92), '/')}::{f.function}") for f in stack)


_BACKWARD_FRAME = re.compile(r"(?:/torch/_tensor\.py::backward|/torch/autograd/[^:]*::(?:backward|grad|_engine_run_backward))$")
_OPTIM_FRAME = re.compile(r"/torch/optim/")
_NN_INIT_FRAME = re.compile(
    r"/torch/nn/(?:modules/module\.py::(?:_apply|to|cuda|_load_from_state_dict|load_state_dict|register_\w+)"
    r"|init\.py::|parameter\.py::|modules/[^:]*::(?:__init__|reset_parameters))"
)


# ---------------------------------------------------------------------------
# Phase roles
# ---------------------------------------------------------------------------

_ROLE_PATTERNS = (
    ("backward", re.compile(r"backward|bwd", re.I)),
    ("forward", re.compile(r"forward|fwd", re.I)),
    ("optimizer", re.compile(r"optim|adam|sgd|(?:^|[_\W])step(?:$|[_\W])|update", re.I)),
    ("setup", re.compile(r"init|setup|load|model|build|param|create", re.I)),
)


def phase_role(name: str) -> str | None:
    """"forward", "backward", "optimizer", "setup" or None, from a phase's name."""
    for role, pattern in _ROLE_PATTERNS:
        if pattern.search(name):
            return role
    return None


# ---------------------------------------------------------------------------
# The event table: the one adapter between the log format and the analysis
# ---------------------------------------------------------------------------

_COLUMNS: dict[str, Any] = {
    "kind": np.uint8,
    "time_ns": np.int64,
    "addr": np.uint64,
    "size": np.int64,
    "block_size": np.int64,
    "stream": np.uint64,
    "tid": np.int64,
    "stack": np.int64,
    "phase": np.int32,
    "device": np.int16,
    "seq": np.int64,
    "flags": np.uint8,
}


@dataclasses.dataclass
class EventTable:
    """Event records as parallel arrays, plus what they refer to.

    `stack` holds a stack id for alloc/free/oom records and a string id (the
    label) for phase and marker records. `stacks` maps stack ids to frames,
    innermost first; `strings` string ids to text.
    """

    kind: np.ndarray
    time_ns: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    block_size: np.ndarray
    stream: np.ndarray
    tid: np.ndarray
    stack: np.ndarray
    phase: np.ndarray
    device: np.ndarray
    seq: np.ndarray
    flags: np.ndarray
    strings: dict[int, str] = dataclasses.field(default_factory=dict)
    stacks: dict[int, Stack] = dataclasses.field(default_factory=dict)
    phase_names: dict[int, str] = dataclasses.field(default_factory=lambda: {0: "default"})
    start_ns: int | None = None  # CLOCK_MONOTONIC when the log was opened
    wall_offset_ns: int = 0  # add to time_ns for Unix time
    path: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[dict[str, Any]],
        *,
        strings: dict[int, str] | None = None,
        stacks: dict[int, Sequence[Sequence[Any]]] | None = None,
        phase_names: dict[int, str] | None = None,
        **extra: Any,
    ) -> "EventTable":
        """A table from dicts (tests, other tools); missing columns are 0, time_ns and seq default to the row index."""
        rows = list(rows)
        cols: dict[str, np.ndarray] = {}
        for name, dtype in _COLUMNS.items():
            default = None if name in ("time_ns", "seq") else 0
            values = [r.get(name, i * 1000 if name == "time_ns" else i if name == "seq" else default) for i, r in enumerate(rows)]
            cols[name] = np.array(values, dtype=dtype) if rows else np.zeros(0, dtype=dtype)
        names = {0: "default"}
        names.update(phase_names or {})
        frames = {int(k): tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in v) for k, v in (stacks or {}).items()}
        return cls(**cols, strings=dict(strings or {}), stacks=frames, phase_names=names, **extra)

    def select(self, mask: np.ndarray) -> "EventTable":
        """The rows where mask is true, with the same dictionaries."""
        cols = {name: getattr(self, name)[mask] for name in _COLUMNS}
        return dataclasses.replace(self, **cols)

    def label(self, i: int) -> str:
        return self.strings.get(int(self.stack[i]), "")

    def stack_of(self, stack_id: int) -> Stack:
        return self.stacks.get(int(stack_id), ())


def table_from_log(log: Any) -> EventTable:
    """The adapter: a `torchalloc.log.Log` (read_log's result) as an EventTable."""
    r = log.records
    cols = {name: np.asarray(r[name]).astype(dtype) for name, dtype in _COLUMNS.items()}
    stacks = {int(k): tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in v) for k, v in log.stacks.items()}
    header = getattr(log, "header", None)
    start = getattr(header, "created_monotonic_ns", None)
    wall = (header.created_realtime_ns - header.created_monotonic_ns) if header is not None else 0
    notes = list(getattr(log, "warnings", []))
    if getattr(log, "truncated", False):
        notes.append("the log was truncated (log_max reached or the disk filled): events after that are missing")
    elif header is not None and getattr(header, "status", 1) == 0:
        notes.append("the log was not closed (the process was killed or is still running): it ends at the last complete record")
    return EventTable(
        **cols,
        strings=dict(log.strings),
        stacks=stacks,
        phase_names=dict(log.phase_names),
        start_ns=start,
        wall_offset_ns=int(wall),
        path=str(getattr(log, "path", "")),
        notes=notes,
    )


def load(path: str | os.PathLike[str]) -> EventTable:
    """Read a torchalloc log file into an EventTable."""
    from .log import read_log

    return table_from_log(read_log(path))


def devices_in(table: EventTable) -> list[int]:
    """Devices with alloc records, most allocations first."""
    allocs = table.device[table.kind == ALLOC]
    if allocs.size == 0:
        return sorted({int(d) for d in table.device if d >= 0})
    values, counts = np.unique(allocs, return_counts=True)
    return [int(v) for v in values[np.argsort(-counts, kind="stable")]]


# ---------------------------------------------------------------------------
# Blocks: alloc/free pairing
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Blocks:
    """One row per block. alloc_i/free_i index the (device's) event table; alloc_i is -1 for a
    block allocated before the log began, free_i is NEVER for one still live at the end."""

    alloc_i: np.ndarray
    free_i: np.ndarray
    addr: np.ndarray
    size: np.ndarray  # requested bytes
    block_size: np.ndarray
    stream: np.ndarray
    alloc_phase: np.ndarray
    free_phase: np.ndarray  # -1 when never freed
    alloc_stack: np.ndarray
    free_stack: np.ndarray
    alloc_tid: np.ndarray
    free_tid: np.ndarray
    alloc_t: np.ndarray  # ns
    free_t: np.ndarray  # ns, -1 when never freed
    deferred: np.ndarray  # bool: freed with the record_stream flag

    def __len__(self) -> int:
        return int(self.alloc_i.shape[0])

    @property
    def persistent(self) -> np.ndarray:
        return self.free_i == NEVER


def pair_blocks(t: EventTable) -> tuple[Blocks, dict[str, int]]:
    """Pair each alloc with the next free of its address (log order). Returns the blocks and counts
    of oddities: frees of blocks allocated before the log, allocs over a still-live address."""
    n = len(t)
    rel = np.flatnonzero((t.kind == ALLOC) | (t.kind == FREE))
    counts = {"before_log": 0, "lost_frees": 0}
    if rel.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Blocks(*(empty.copy() for _ in range(14)), np.zeros(0, dtype=bool)), counts
    order = rel[np.lexsort((rel, t.addr[rel]))]
    is_alloc = t.kind[order] == ALLOC
    same_next = np.zeros(order.size, dtype=bool)
    same_next[:-1] = t.addr[order[1:]] == t.addr[order[:-1]]
    next_kind_free = np.zeros(order.size, dtype=bool)
    next_kind_free[:-1] = t.kind[order[1:]] == FREE
    # alloc -> its free (the next event on the address, when a free)
    paired = is_alloc & same_next & next_kind_free
    # alloc followed by another alloc on the address: its free was lost; end it there
    lost = is_alloc & same_next & ~next_kind_free
    counts["lost_frees"] = int(lost.sum())
    # a free whose previous event on the address is not an alloc: allocated before the log
    prev_is_alloc = np.zeros(order.size, dtype=bool)
    prev_is_alloc[1:] = is_alloc[:-1] & same_next[:-1]
    orphan_free = ~is_alloc & ~prev_is_alloc
    counts["before_log"] = int(orphan_free.sum())

    alloc_pos = np.flatnonzero(is_alloc)
    alloc_i = order[alloc_pos]
    free_i = np.full(alloc_i.size, NEVER, dtype=np.int64)
    has_next = alloc_pos + 1 < order.size
    nxt = np.where(has_next, order[np.minimum(alloc_pos + 1, order.size - 1)], NEVER)
    ends = paired[alloc_pos] | lost[alloc_pos]
    free_i[ends] = nxt[ends]
    real_free = paired[alloc_pos]

    orphan_i = order[orphan_free]
    all_alloc = np.concatenate([np.full(orphan_i.size, -1, dtype=np.int64), alloc_i])
    all_free = np.concatenate([orphan_i, free_i])
    src = np.concatenate([orphan_i, alloc_i])  # where size/addr/stream come from
    real = np.concatenate([np.ones(orphan_i.size, dtype=bool), real_free])
    sort = np.argsort(all_alloc, kind="stable")
    all_alloc, all_free, src, real = all_alloc[sort], all_free[sort], src[sort], real[sort]
    freed = all_free != NEVER
    fi = np.where(freed, all_free, 0)
    before = all_alloc < 0
    ai = np.where(before, 0, all_alloc)
    blocks = Blocks(
        alloc_i=all_alloc,
        free_i=all_free,
        addr=t.addr[src],
        size=t.size[src],
        block_size=t.block_size[src],
        stream=t.stream[src],
        alloc_phase=np.where(before, -1, t.phase[ai]).astype(np.int32),
        free_phase=np.where(freed, t.phase[fi], -1).astype(np.int32),
        alloc_stack=np.where(before, 0, t.stack[ai]),
        free_stack=np.where(freed & real, t.stack[fi], 0),
        alloc_tid=np.where(before, -1, t.tid[ai]),
        free_tid=np.where(freed, t.tid[fi], -1),
        alloc_t=np.where(before, t.time_ns[0] if n else 0, t.time_ns[ai]),
        free_t=np.where(freed, t.time_ns[fi], -1),
        deferred=np.where(freed & real, (t.flags[fi] & FREE_DEFERRED) != 0, False),
    )
    return blocks, counts


# ---------------------------------------------------------------------------
# Phase occurrences
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Occurrences:
    """Each occurrence of each phase: [begin_i, end_i) in the event table (end_i = n if open at the end)."""

    phase: np.ndarray
    epoch: np.ndarray
    begin_i: np.ndarray
    end_i: np.ndarray

    def of(self, phase: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The occurrence (row here) of `phase` current at event `index`; -1 where none (phase 0, no begin)."""
        out = np.full(np.shape(index), -1, dtype=np.int64)
        for p in np.unique(phase):
            rows = np.flatnonzero(self.phase == p)
            if rows.size == 0:
                continue
            sel = phase == p
            k = np.searchsorted(self.begin_i[rows], index[sel], side="right") - 1
            out[sel] = np.where(k >= 0, rows[np.maximum(k, 0)], -1)
        return out


def phase_occurrences(t: EventTable) -> Occurrences:
    n = len(t)
    begins = np.flatnonzero(t.kind == PHASE_BEGIN)
    ends = np.flatnonzero(t.kind == PHASE_END)
    end_of: dict[tuple[int, int], int] = {}
    for i in ends.tolist():
        end_of.setdefault((int(t.phase[i]), int(t.size[i])), i)
    phase = t.phase[begins].astype(np.int64)
    epoch = t.size[begins].astype(np.int64)
    end_i = np.array([end_of.get((int(p), int(e)), n) for p, e in zip(phase, epoch)], dtype=np.int64)
    return Occurrences(phase, epoch, begins.astype(np.int64), end_i)


# ---------------------------------------------------------------------------
# Backward detection
# ---------------------------------------------------------------------------


def backward_mask(t: EventTable, occ: Occurrences) -> tuple[np.ndarray, str]:
    """Per event: whether it happened during backward. Returns the mask and how it was found."""
    n = len(t)
    mask = np.zeros(n, dtype=bool)
    roles = {p: phase_role(name) for p, name in t.phase_names.items()}
    backward_phases = [p for p, r in roles.items() if r == "backward"]
    if backward_phases:
        mask |= np.isin(t.phase, backward_phases)
        return mask, "phase"
    # No backward phase: Python threads inside Tensor.backward mark spans; frees on
    # threads without Python inside those spans happen during backward.
    with_stack = np.flatnonzero(((t.kind == ALLOC) | (t.kind == FREE)) & (t.stack != 0))
    if with_stack.size == 0:
        return mask, "none"
    flag_of_stack = {sid: _has_frame(t.stack_of(sid), _BACKWARD_FRAME) for sid in np.unique(t.stack[with_stack]).tolist()}
    in_bw = np.array([flag_of_stack[int(s)] for s in t.stack[with_stack]], dtype=bool)
    if not in_bw.any():
        return mask, "none"
    for tid in np.unique(t.tid[with_stack]).tolist():
        sel = t.tid[with_stack] == tid
        idx, flags = with_stack[sel], in_bw[sel]
        # a span starts at a flagged event and lasts until the next unflagged event of the thread
        starts = np.flatnonzero(flags & np.concatenate(([True], ~flags[:-1])))
        for s in starts.tolist():
            rest = np.flatnonzero(~flags[s:])
            end = idx[s + rest[0]] if rest.size else n
            mask[idx[s]:end] = True
    # only Python-less threads' events (and the flagged ones) count as backward
    no_python = np.ones(n, dtype=bool)
    python_tids = np.unique(t.tid[with_stack])
    no_python[np.isin(t.tid, python_tids) & (t.stack == 0)] = False
    flagged = np.zeros(n, dtype=bool)
    flagged[with_stack[in_bw]] = True
    mask &= (t.stack == 0) | flagged
    return mask, "stacks"


# ---------------------------------------------------------------------------
# Lifetime classification
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StackVerdict:
    """The stack rule's answer for one (alloc stack, free stack) pair."""

    reason: Reason
    site: Frame | None  # where it was allocated (user frame)
    free_site: Frame | None  # where it was freed (user frame), None when no Python
    returned: str | None = None  # the function whose return freed it
    same_frame_line: bool = False  # temporary candidate: F == A


def classify_stacks(alloc: Stack, free: Stack) -> StackVerdict:
    """Apply the stack rules (module docstring, rule 3) to one alloc/free stack pair."""
    a, f = user_suffix(alloc), user_suffix(free)
    site = a[0] if a else None
    if not a or not f:
        return StackVerdict(Reason.OTHER, site, f[0] if f else None)
    if a == f:
        return StackVerdict(Reason.TEMPORARY, site, f[0], same_frame_line=True)
    if len(f) < len(a) and a[len(a) - len(f):] == f:
        inner = a[: len(a) - len(f)]
        users = [fr for fr in inner if not is_library_frame(fr.filename)]
        returned = (users[-1] if users else inner[-1]).function
        return StackVerdict(Reason.FUNCTION_RETURNED, site, f[0], returned=returned)
    common = 0
    while common < min(len(a), len(f)) and a[-1 - common] == f[-1 - common]:
        common += 1
    if common < len(a) and common < len(f):
        xa, xf = a[len(a) - common - 1], f[len(f) - common - 1]
        if (xa.filename, xa.function) == (xf.filename, xf.function) and len(f) == common + 1:
            returned = None
            if len(a) > common + 1:  # it was made deeper and returned to xa's frame
                users = [fr for fr in a[: len(a) - common - 1] if not is_library_frame(fr.filename)]
                returned = (users[-1] if users else a[len(a) - common - 2]).function
            return StackVerdict(Reason.REBINDING, site, xf, returned=returned)
    return StackVerdict(Reason.OTHER, site, f[0])


