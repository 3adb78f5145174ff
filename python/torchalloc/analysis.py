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

from ._records import (  # noqa: F401  (the kinds are re-exported: tests and tools build tables with them)
    ALLOC,
    END,
    FREE,
    FREE_DEFERRED,
    MARKER,
    OOM,
    PHASE_BEGIN,
    PHASE_END,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    STATUS_CLOSED,
    STATUS_OPEN,
    TRIM,
    TRUNCATED,
)
from .units import fmt_bytes

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
# 4096 KiB x 8 on sm_90/sm_100, else 4096 KiB x 2 + 16 KiB x 8.
# CUBLAS_WORKSPACE_CONFIG changes them. (Smaller round sizes such as 1 or
# 4 MiB are left out on purpose: too many tensors have them.)
WORKSPACE_SIZES = frozenset({4096 * 1024 * 8, 4096 * 1024 * 2 + 16 * 1024 * 8})


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
    elif header is not None and getattr(header, "status", STATUS_CLOSED) == STATUS_OPEN:
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
    phase_mask = np.isin(t.phase, backward_phases) if backward_phases else mask.copy()
    how = "phase" if backward_phases else "none"
    # Python threads inside Tensor.backward mark spans; events on threads without
    # Python inside those spans happen during backward (also outside backward phases,
    # e.g. a warm-up step)
    with_stack = np.flatnonzero(((t.kind == ALLOC) | (t.kind == FREE)) & (t.stack != 0))
    if with_stack.size == 0:
        return phase_mask, how
    flag_of_stack = {sid: _has_frame(t.stack_of(sid), _BACKWARD_FRAME) for sid in np.unique(t.stack[with_stack]).tolist()}
    in_bw = np.array([flag_of_stack[int(s)] for s in t.stack[with_stack]], dtype=bool)
    if not in_bw.any():
        return phase_mask, how
    for tid in np.unique(t.tid[with_stack]).tolist():
        sel = t.tid[with_stack] == tid
        idx, flags = with_stack[sel], in_bw[sel]
        # a span starts at a flagged event and lasts until the next unflagged event of the thread
        starts = np.flatnonzero(flags & np.concatenate(([True], ~flags[:-1])))
        for s in starts.tolist():
            rest = np.flatnonzero(~flags[s:])
            end = idx[s + rest[0]] if rest.size else n
            mask[idx[s]:end] = True
    # only events without Python (autograd's threads) and the flagged ones count as backward
    flagged = np.zeros(n, dtype=bool)
    flagged[with_stack[in_bw]] = True
    mask &= (t.stack == 0) | flagged
    return phase_mask | mask, "phase+stacks" if backward_phases else "stacks"


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


# ---------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------


class Site(NamedTuple):
    """Where a block was allocated: the user's frame, or a stand-in when there is none."""

    label: str  # short: "train.py:42 main"
    location: str  # long: "/path/train.py:42 in main"
    frame: Frame | None


NO_PYTHON = Site("(no Python stack)", "a thread without Python frames (autograd's engine, a C++ thread)", None)
BEFORE_LOG = Site("(before the log began)", "allocated before the log was opened", None)
NO_STACKS = Site("(no stacks recorded)", "the log was written without stacks:1", None)


def _site_of_frame(frame: Frame) -> Site:
    return Site(frame.short(), frame.long(), frame)


class _Sites:
    """Interns sites; ids are indices into `.sites`."""

    def __init__(self) -> None:
        self.sites: list[Site] = []
        self._ids: dict[Any, int] = {}

    def id(self, site: Site) -> int:
        key = site.frame if site.frame is not None else site.label
        if key not in self._ids:
            self._ids[key] = len(self.sites)
            self.sites.append(site)
        return self._ids[key]

    def of_frame(self, frame: Frame | None) -> int:
        return -1 if frame is None else self.id(_site_of_frame(frame))


# ---------------------------------------------------------------------------
# Classification of every block
# ---------------------------------------------------------------------------

REASONS: tuple[Reason, ...] = tuple(Reason)
CATEGORIES: tuple[Category, ...] = tuple(Category)
_R = {r: i for i, r in enumerate(REASONS)}
_C = {c: i for i, c in enumerate(CATEGORIES)}


@dataclasses.dataclass
class Classified:
    """Per block: reason and category codes (indices into REASONS / CATEGORIES), site ids, details."""

    reason: np.ndarray
    category: np.ndarray
    site: np.ndarray  # allocation site id
    free_site: np.ndarray  # free site id, -1 when none
    returned: np.ndarray  # index into `functions`, -1 when not applicable
    rerun: np.ndarray  # bool: REBINDING because the same line ran again
    alloc_occ: np.ndarray  # occurrence row of the alloc phase, -1 if none
    functions: list[str]


def _stack_rule_pairs(t: EventTable, blocks: Blocks, idx: np.ndarray, sites: _Sites) -> tuple[np.ndarray, ...]:
    """classify_stacks for the blocks `idx`, once per distinct (alloc stack, free stack) pair."""
    reason = np.full(idx.size, _R[Reason.OTHER], dtype=np.int8)
    free_site = np.full(idx.size, -1, dtype=np.int64)
    returned = np.full(idx.size, -1, dtype=np.int64)
    functions: list[str] = []
    fn_ids: dict[str, int] = {}
    if idx.size == 0:
        return reason, free_site, returned, functions
    pairs = np.stack([blocks.alloc_stack[idx], blocks.free_stack[idx]], axis=1)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    u_reason = np.empty(len(uniq), dtype=np.int8)
    u_free = np.empty(len(uniq), dtype=np.int64)
    u_ret = np.empty(len(uniq), dtype=np.int64)
    for k, (a_id, f_id) in enumerate(_progress(uniq.tolist(), "classifying stacks")):
        v = classify_stacks(t.stack_of(a_id), t.stack_of(f_id))
        u_reason[k] = _R[v.reason]
        u_free[k] = sites.of_frame(v.free_site)
        if v.returned is None:
            u_ret[k] = -1
        else:
            u_ret[k] = fn_ids.setdefault(v.returned, len(functions))
            if u_ret[k] == len(functions):
                functions.append(v.returned)
    return u_reason[inverse], u_free[inverse], u_ret[inverse], functions


def _chain_and_line(t: EventTable, stack_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per alloc stack id: an id of its frame chain (user suffix minus the innermost line) and that line."""
    uniq, inverse = np.unique(stack_ids, return_inverse=True)
    chains: dict[Any, int] = {}
    u_chain = np.empty(uniq.size, dtype=np.int64)
    u_line = np.empty(uniq.size, dtype=np.int64)
    for k, sid in enumerate(uniq.tolist()):
        a = user_suffix(t.stack_of(sid))
        if not a:
            u_chain[k], u_line[k] = -1, -1
            continue
        key = ((a[0].filename, a[0].function), a[1:])
        u_chain[k] = chains.setdefault(key, len(chains))
        u_line[k] = a[0].line
    return u_chain[inverse.reshape(-1)], u_line[inverse.reshape(-1)]


def _line_ran_again(t: EventTable, blocks: Blocks, candidates: np.ndarray) -> np.ndarray:
    """For F == A candidates: did another line of the same frame chain allocate between the
    block's alloc and its free? Then the line ran again (a loop), so this is a rebinding."""
    out = np.zeros(candidates.size, dtype=bool)
    if candidates.size == 0:
        return out
    with_stack = np.flatnonzero((blocks.alloc_stack != 0) & (blocks.alloc_i >= 0))
    chain, line = _chain_and_line(t, blocks.alloc_stack[with_stack])
    pos_of_block = np.full(len(blocks), -1, dtype=np.int64)
    pos_of_block[with_stack] = np.arange(with_stack.size)
    cand_pos = pos_of_block[candidates]
    for c in np.unique(chain[cand_pos]).tolist():
        if c < 0:
            continue
        members = with_stack[chain == c]  # blocks of this chain, in alloc order (blocks are sorted by alloc_i)
        idx = blocks.alloc_i[members]
        lines = line[chain == c]
        change = np.flatnonzero(lines[1:] != lines[:-1]) + 1  # positions where the line differs from the one before
        mine = np.flatnonzero(chain[cand_pos] == c)
        me = np.searchsorted(idx, blocks.alloc_i[candidates[mine]])
        until = np.searchsorted(idx, blocks.free_i[candidates[mine]])  # allocs before the free
        nxt = np.searchsorted(change, me, side="right")  # the first line change after the block's alloc
        first_change = np.full(me.size, idx.size, dtype=np.int64)
        has = nxt < change.size
        first_change[has] = change[nxt[has]]
        out[mine] = first_change < until
    return out


def classify(t: EventTable, blocks: Blocks, occ: Occurrences, in_backward: np.ndarray, sites: _Sites) -> Classified:
    """Reason and category for every block (module docstring)."""
    nb = len(blocks)
    n = len(t)
    reason = np.full(nb, _R[Reason.OTHER], dtype=np.int8)
    free_site = np.full(nb, -1, dtype=np.int64)
    returned = np.full(nb, -1, dtype=np.int64)
    rerun = np.zeros(nb, dtype=bool)
    functions: list[str] = []

    before = blocks.alloc_i < 0
    persistent = blocks.persistent
    freed = ~persistent
    ai = np.where(before, 0, blocks.alloc_i)
    fi = np.where(freed, blocks.free_i, 0)
    alloc_bw = ~before & in_backward[ai] if n else np.zeros(nb, dtype=bool)
    free_bw = freed & in_backward[fi] if n else np.zeros(nb, dtype=bool)

    # allocation sites
    site = np.empty(nb, dtype=np.int64)
    has_stacks = bool(np.any(blocks.alloc_stack != 0))
    uniq, inverse = np.unique(blocks.alloc_stack, return_inverse=True)
    u_site = np.empty(uniq.size, dtype=np.int64)
    for k, sid in enumerate(uniq.tolist()):
        a = user_suffix(t.stack_of(sid))
        u_site[k] = sites.of_frame(a[0]) if a else sites.id(NO_PYTHON if has_stacks else NO_STACKS)
    site[:] = u_site[inverse.reshape(-1)]
    site[before] = sites.id(BEFORE_LOG)

    reason[persistent] = _R[Reason.PERSISTENT]
    # saved for backward: made outside backward, freed during it (by autograd: no Python
    # stack, or a stack inside Tensor.backward)
    free_by_autograd = np.ones(nb, dtype=bool)
    if has_stacks:
        fs_uniq, fs_inv = np.unique(blocks.free_stack, return_inverse=True)
        ok = np.array([sid == 0 or _has_frame(t.stack_of(sid), _BACKWARD_FRAME) for sid in fs_uniq.tolist()], dtype=bool)
        free_by_autograd = ok[fs_inv.reshape(-1)]
    saved = freed & ~before & free_bw & ~alloc_bw & free_by_autograd
    reason[saved] = _R[Reason.SAVED_FOR_BACKWARD]

    alloc_occ = occ.of(blocks.alloc_phase.astype(np.int64), ai)
    alloc_occ[before] = -1
    rest = np.flatnonzero(freed & ~saved & ~before)
    if has_stacks:
        r, fsite, ret, functions = _stack_rule_pairs(t, blocks, rest, sites)
        reason[rest], free_site[rest], returned[rest] = r, fsite, ret
        temp = rest[r == _R[Reason.TEMPORARY]]
        again = _line_ran_again(t, blocks, temp)
        reason[temp[again]] = _R[Reason.REBINDING]
        rerun[temp[again]] = True
    else:
        end_of_occ = np.where(alloc_occ[rest] >= 0, occ.end_i[np.maximum(alloc_occ[rest], 0)], -1)
        within = np.where(alloc_occ[rest] >= 0, blocks.free_i[rest] < end_of_occ,
                          blocks.free_phase[rest] == blocks.alloc_phase[rest])
        reason[rest] = np.where(within, _R[Reason.SAME_PHASE], _R[Reason.LATER_PHASE])

    category = _categorize(t, blocks, occ, alloc_bw, free_bw, reason, alloc_occ, has_stacks)
    return Classified(reason, category, site, free_site, returned, rerun, alloc_occ, functions)


def _categorize(
    t: EventTable,
    blocks: Blocks,
    occ: Occurrences,
    alloc_bw: np.ndarray,
    free_bw: np.ndarray,
    reason: np.ndarray,
    alloc_occ: np.ndarray,
    has_stacks: bool,
) -> np.ndarray:
    """Category codes (Category) per block: what it was for, from phases, stacks and sizes."""
    nb = len(blocks)
    cat = np.full(nb, _C[Category.OTHER], dtype=np.int8)
    roles = {p: phase_role(name) for p, name in t.phase_names.items()}
    role_of = np.array([roles.get(int(p)) or "" for p in blocks.alloc_phase.tolist()], dtype=object) if nb else np.zeros(0, dtype=object)
    before = blocks.alloc_i < 0
    persistent = blocks.persistent

    def stack_flag(pattern: re.Pattern[str]) -> np.ndarray:
        uniq, inv = np.unique(blocks.alloc_stack, return_inverse=True)
        flags = np.array([_has_frame(t.stack_of(s), pattern) for s in uniq.tolist()], dtype=bool)
        return flags[inv.reshape(-1)] if nb else np.zeros(0, dtype=bool)

    nn_init = stack_flag(_NN_INIT_FRAME)
    optim = (role_of == "optimizer") | stack_flag(_OPTIM_FRAME)
    setup = role_of == "setup"
    # before anything ran: allocated before the first forward/backward/optimizer phase began
    active_phases = [p for p, r in roles.items() if r in ("forward", "backward", "optimizer")]
    first_active = occ.begin_i[np.isin(occ.phase, active_phases)].min() if np.isin(occ.phase, active_phases).any() else None
    early = (blocks.alloc_i < first_active) if first_active is not None else np.zeros(nb, dtype=bool)
    ws = np.isin(blocks.block_size, list(_workspace_sizes())) | np.isin(blocks.size, list(_workspace_sizes()))
    end_of_occ = np.where(alloc_occ >= 0, occ.end_i[np.maximum(alloc_occ, 0)] if len(occ.end_i) else NEVER, NEVER)
    within_occ = blocks.free_i < end_of_occ

    # without stacks, what was allocated before the first forward/backward/optimizer phase
    # stands for the parameters; with stacks, torch.nn frames say so
    early_guess = early if not has_stacks else np.zeros(nb, dtype=bool)
    params = nn_init | ((setup | early_guess) & ~optim)
    # A library workspace is allocated inside an op, next to that op's own output: an
    # adjacent allocation of the same thread carries the same stack (a 32 MiB tensor made
    # on its own line does not), and its size is no parameter's (a .grad would match one).
    by_thread = np.argsort(blocks.alloc_tid, kind="stable")  # blocks are in alloc order already
    same = np.zeros(nb, dtype=bool)
    if nb > 1:
        tid_s, stack_s = blocks.alloc_tid[by_thread], blocks.alloc_stack[by_thread]
        pair = (tid_s[1:] == tid_s[:-1]) & (stack_s[1:] == stack_s[:-1])
        same[by_thread[1:][pair]] = True
        same[by_thread[:-1][pair]] = True
    param_sizes = np.unique(blocks.block_size[params & persistent])
    ws &= same & ~(alloc_bw & np.isin(blocks.block_size, param_sizes))
    # persistent blocks
    p = persistent & ~before
    cat[p] = _C[Category.OTHER_PERSISTENT]
    cat[p & params] = _C[Category.PARAMETERS]
    cat[p & ~params & alloc_bw] = _C[Category.GRADIENTS]
    cat[p & ~params & optim] = _C[Category.OPTIMIZER_STATE]
    cat[p & ~params & ~optim & ws & ~setup] = _C[Category.WORKSPACE]
    # freed blocks
    f = ~persistent & ~before
    cat[f] = _C[Category.TEMPORARIES]
    cat[f & alloc_bw] = _C[Category.BACKWARD_TEMPORARIES]
    cat[f & alloc_bw & ~free_bw] = _C[Category.GRADIENTS]  # outlived backward: .grad, freed by zero_grad
    cat[f & optim] = np.where(within_occ[f & optim], _C[Category.OPTIMIZER_INTERMEDIATES], _C[Category.OPTIMIZER_STATE])
    cat[f & (reason == _R[Reason.SAVED_FOR_BACKWARD])] = _C[Category.ACTIVATIONS]
    cat[f & params & ~alloc_bw & ~optim] = _C[Category.PARAMETERS]
    cat[before] = _C[Category.BEFORE_LOG]
    return cat


# ---------------------------------------------------------------------------
# Progress (tqdm when available and the work is big)
# ---------------------------------------------------------------------------

_PROGRESS = {"enabled": False}


def _progress(items: Sequence[Any], desc: str) -> Iterable[Any]:
    if not _PROGRESS["enabled"] or len(items) < 20000:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False, unit="stack")


# ---------------------------------------------------------------------------
# Timeline
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Timeline:
    """Allocated and reserved bytes over time, sampled for drawing (every event when few)."""

    t_s: np.ndarray  # seconds since the start of the log
    index: np.ndarray  # event index of each sample
    allocated: np.ndarray
    reserved: np.ndarray
    by_phase: dict[str, np.ndarray]  # allocated, split by the phase that allocated each block
    phase_spans: list[tuple[str, float, float]]
    markers: list[tuple[float, str, str]]  # (t_s, label, phase)
    peak_t: float
    peak_allocated: int
    peak_index: int
    peak_reserved_t: float
    peak_reserved: int
    ooms: list[tuple[float, int]]  # (t_s, requested)
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_s": _round_list(self.t_s),
            "allocated": self.allocated.tolist(),
            "reserved": self.reserved.tolist(),
            "by_phase": {k: v.tolist() for k, v in self.by_phase.items()},
            "phase_spans": [{"phase": n, "start_s": round(a, 6), "end_s": round(b, 6)} for n, a, b in self.phase_spans],
            "markers": [{"t_s": round(t, 6), "label": lab, "phase": ph} for t, lab, ph in self.markers],
            "peak": {"t_s": round(self.peak_t, 6), "allocated": self.peak_allocated},
            "peak_reserved": {"t_s": round(self.peak_reserved_t, 6), "reserved": self.peak_reserved},
            "ooms": [{"t_s": round(t, 6), "requested": s} for t, s in self.ooms],
            "duration_s": round(self.duration_s, 6),
        }


def _round_list(a: np.ndarray) -> list[float]:
    return [round(float(x), 6) for x in a]


def time_base_ns(t: EventTable) -> int:
    """Time zero of the report: when the log was opened (else the first event)."""
    if not len(t):
        return 0
    first = int(t.time_ns[0])
    if t.start_ns is not None and 0 <= first - int(t.start_ns) < 3600 * 10**9:
        return int(t.start_ns)
    return first


def _levels(t: EventTable, blocks: Blocks) -> tuple[np.ndarray, np.ndarray, int]:
    """Allocated and reserved bytes after every event, and the allocated bytes before the first."""
    n = len(t)
    delta = np.zeros(n, dtype=np.int64)
    known = blocks.alloc_i >= 0
    delta[blocks.alloc_i[known]] += blocks.block_size[known]
    freed = ~blocks.persistent
    delta[blocks.free_i[freed]] -= blocks.block_size[freed]
    initial = int(blocks.block_size[~known].sum())
    allocated = initial + np.cumsum(delta)
    seg = np.zeros(n, dtype=np.int64)
    seg[t.kind == SEGMENT_ALLOC] = t.size[t.kind == SEGMENT_ALLOC]
    seg[t.kind == SEGMENT_FREE] = -t.size[t.kind == SEGMENT_FREE]
    reserved = np.cumsum(seg)
    # A log opened mid-run does not know the segments made before it: the smallest initial
    # reserved that keeps reserved >= allocated and >= 0 throughout.
    if n:
        reserved += max(0, int(np.max(allocated - reserved)), int(-reserved.min()))
    return allocated, reserved, initial


def _sample(time_s: np.ndarray, values: np.ndarray, max_points: int, must: Sequence[int]) -> np.ndarray:
    """Event indices to draw: per time bucket the highest and the last event, plus `must`."""
    n = values.size
    if n <= max_points:
        return np.arange(n)
    span = float(time_s[-1] - time_s[0]) or 1.0
    buckets = max(1, max_points // 2)
    b = np.minimum(((time_s - time_s[0]) / span * buckets).astype(np.int64), buckets - 1)
    order = np.lexsort((values, b))  # by bucket, then value: the last of each bucket is its max
    last_of_bucket = np.flatnonzero(np.concatenate((b[order][1:] != b[order][:-1], [True])))
    highs = order[last_of_bucket]
    lasts = np.flatnonzero(np.concatenate((b[1:] != b[:-1], [True])))
    picks = np.concatenate((highs, lasts, [0, n - 1], np.asarray(must, dtype=np.int64)))
    return np.unique(picks[(picks >= 0) & (picks < n)])


def build_timeline(
    t: EventTable, blocks: Blocks, occ: Occurrences, allocated: np.ndarray, reserved: np.ndarray, max_points: int = 1500
) -> Timeline:
    n = len(t)
    time_s = (t.time_ns - time_base_ns(t)) / 1e9
    if n == 0:
        z = np.zeros(0)
        return Timeline(z, z.astype(np.int64), z.astype(np.int64), z.astype(np.int64), {}, [], [], 0.0, 0, 0, 0.0, 0, [], 0.0)
    peak_i = int(np.argmax(allocated))
    rpeak_i = int(np.argmax(reserved))
    idx = _sample(time_s, allocated, max_points, [peak_i, rpeak_i])
    by_phase: dict[str, np.ndarray] = {}
    known = blocks.alloc_i >= 0
    phases = sorted(set(blocks.alloc_phase[known].tolist()))
    for p in phases:
        delta = np.zeros(n, dtype=np.int64)
        sel = known & (blocks.alloc_phase == p)
        delta[blocks.alloc_i[sel]] += blocks.block_size[sel]
        fsel = sel & ~blocks.persistent
        delta[blocks.free_i[fsel]] -= blocks.block_size[fsel]
        curve = np.cumsum(delta)[idx]
        name = t.phase_names.get(int(p), f"phase {p}")
        by_phase[name] = by_phase.get(name, 0) + curve
    if (~known).any():
        delta = np.zeros(n, dtype=np.int64)
        pre = ~known & ~blocks.persistent
        delta[blocks.free_i[pre]] -= blocks.block_size[pre]
        by_phase[BEFORE_LOG.label] = int(blocks.block_size[~known].sum()) + np.cumsum(delta)[idx]
    spans = []
    for p, b, e in zip(occ.phase.tolist(), occ.begin_i.tolist(), occ.end_i.tolist()):
        spans.append((t.phase_names.get(p, f"phase {p}"), float(time_s[b]), float(time_s[min(e, n - 1)])))
    markers = [
        (float(time_s[i]), t.label(i), t.phase_names.get(int(t.phase[i]), "")) for i in np.flatnonzero(t.kind == MARKER).tolist()
    ]
    ooms = [(float(time_s[i]), int(t.size[i])) for i in np.flatnonzero(t.kind == OOM).tolist()]
    return Timeline(
        t_s=time_s[idx],
        index=idx,
        allocated=allocated[idx],
        reserved=reserved[idx],
        by_phase=by_phase,
        phase_spans=spans,
        markers=markers,
        peak_t=float(time_s[peak_i]),
        peak_allocated=int(allocated[peak_i]),
        peak_index=peak_i,
        peak_reserved_t=float(time_s[rpeak_i]),
        peak_reserved=int(reserved[rpeak_i]),
        ooms=ooms,
        duration_s=float(time_s[-1]),
    )


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class AnatomyRow:
    site: str
    location: str
    phase: str
    category: str
    reason: str
    count: int
    bytes: int
    requested: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Anatomy:
    """The blocks live at one moment, grouped by allocation site and phase, largest first."""

    at: str  # "peak", "marker 'x'", "t=1.2s", "oom"
    index: int
    t_s: float
    allocated: int
    reserved: int
    rows: list[AnatomyRow]
    by_category: dict[str, int]
    by_phase: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rows"] = [r.to_dict() for r in self.rows]
        return d


@dataclasses.dataclass
class LifetimeRow:
    site: str
    location: str
    reason: str
    category: str
    phases: list[str]
    count: int
    bytes: int  # block bytes, summed over the blocks
    largest: int
    typical_lifetime_s: float  # median; -1 for blocks never freed
    free_site: str | None
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PhaseRow:
    phase: str
    role: str | None
    occurrences: int
    allocated: int
    allocated_count: int
    freed: int
    freed_count: int
    peak: int  # highest allocated while this phase was current
    peak_over_start: int  # highest rise above the level at the start of an occurrence
    reserved_growth: int  # segments made minus segments released while current
    persistent: int  # allocated here, still live at the end
    handed_on: int  # outlived the occurrence, freed later
    transient: int  # freed within the occurrence that made it
    persistent_by_category: dict[str, int]
    handed_on_to: dict[str, int]
    first_occurrence_persistent: int
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def cells(self) -> tuple[Any, ...]:
        """The phase table's row, formatted as every report shows it: phase, occurrences,
        allocated, freed, peak, reserved growth, persistent, handed on, transient."""
        return (self.phase, self.occurrences, fmt_bytes(self.allocated), fmt_bytes(self.freed), fmt_bytes(self.peak),
                fmt_bytes(self.reserved_growth), fmt_bytes(self.persistent), fmt_bytes(self.handed_on),
                fmt_bytes(self.transient))


@dataclasses.dataclass
class Estimate:
    """The usual estimate's terms, measured: each is the peak of that category's live bytes."""

    parameters: int
    gradients: int
    optimizer_state: int
    optimizer_intermediates: int
    activations: int
    gradients_plus_intermediates: int  # peak of their sum (not the sum of peaks)
    temporaries: int
    workspace: int
    other: int
    estimate: int  # parameters + optimizer_state + max(gradients + intermediates, activations)
    measured_peak: int
    at_peak: dict[str, int]
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def rows(self) -> list[tuple[str, int]]:
        """(term, bytes) in the order every report shows them."""
        return [
            ("parameters", self.parameters),
            ("optimizer state", self.optimizer_state),
            ("gradients", self.gradients),
            ("optimizer intermediates", self.optimizer_intermediates),
            ("gradients + intermediates (peak together)", self.gradients_plus_intermediates),
            ("activations (saved for backward)", self.activations),
            ("temporaries (not in the estimate)", self.temporaries),
            ("library workspaces (not in the estimate)", self.workspace),
            ("estimate", self.estimate),
            ("measured peak allocated", self.measured_peak),
        ]


@dataclasses.dataclass
class OomRow:
    t_s: float
    requested: int
    reserved: int
    allocated: int
    free_in_reserved: int
    largest_free_range: int
    segments: int
    phase: str
    site: str
    fragmentation: bool
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Analysis:
    """Everything derived from one device's events. Build with `analyze`."""

    table: EventTable
    device: int
    blocks: Blocks
    occ: Occurrences
    classified: Classified
    sites: list[Site]
    allocated: np.ndarray  # after every event
    reserved: np.ndarray
    timeline: Timeline
    has_stacks: bool
    backward_from: str  # "phase", "stacks" or "none"
    notes: list[str]

    # -- helpers ----------------------------------------------------------
    def phase_name(self, p: int) -> str:
        if p < 0:
            return BEFORE_LOG.label
        return self.table.phase_names.get(int(p), f"phase {p}")

    def _time_s(self, i: int) -> float:
        t = self.table
        if not len(t):
            return 0.0
        return (int(t.time_ns[min(max(i, 0), len(t) - 1)]) - time_base_ns(t)) / 1e9

    def explanation(self, b: int) -> str:
        """Why block b was freed when it was, in words."""
        c = self.classified
        reason = REASONS[c.reason[b]]
        site = self.sites[c.site[b]].label
        free_site = self.sites[c.free_site[b]].label if c.free_site[b] >= 0 else None
        fn = c.functions[c.returned[b]] if c.returned[b] >= 0 else None
        phase = self.phase_name(int(self.blocks.alloc_phase[b]))
        free_phase = self.phase_name(int(self.blocks.free_phase[b])) if self.blocks.free_phase[b] >= 0 else ""
        category = CATEGORIES[c.category[b]]
        rows = np.flatnonzero(self.occ.phase == self.blocks.alloc_phase[b])
        if rows.size > 1 and c.alloc_occ[b] == rows[0]:
            phase = f"the first occurrence of {phase}"
        return _explain(reason, category, site, free_site, fn, phase, free_phase, bool(c.rerun[b]), self.has_stacks)

    # -- anatomy ----------------------------------------------------------
    def index_at(self, at: str | float | int | None = None) -> tuple[int, str]:
        """The event index for "peak" (default), "peak_reserved", "end", "oom", a marker label, or a time in seconds."""
        t = self.table
        n = len(t)
        if n == 0:
            return 0, "empty log"
        if at is None or at == "peak":
            return self.timeline.peak_index, "peak"
        if at == "peak_reserved":
            return int(np.argmax(self.reserved)), "peak reserved"
        if at == "end":
            return n - 1, "end"
        if at == "oom":
            ooms = np.flatnonzero(t.kind == OOM)
            if not ooms.size:
                raise ValueError("the log has no OOM record")
            return int(ooms[0]), "OOM"
        if isinstance(at, str):
            marks = [i for i in np.flatnonzero(t.kind == MARKER).tolist() if t.label(i) == at]
            if marks:
                return marks[0], f"marker '{at}'"
            try:
                at = float(at.rstrip("s"))
            except ValueError:
                labels = sorted({t.label(i) for i in np.flatnonzero(t.kind == MARKER).tolist()})
                raise ValueError(f"no marker {at!r}; markers: {', '.join(labels) or 'none'}; or give a time in seconds") from None
        target = float(at)
        rel = (t.time_ns - time_base_ns(t)) / 1e9
        i = int(np.searchsorted(rel, target, side="right")) - 1
        return max(0, min(i, n - 1)), f"t={target:g}s"

    def live_at(self, i: int) -> np.ndarray:
        """Indices of the blocks live just after event i."""
        b = self.blocks
        return np.flatnonzero((b.alloc_i <= i) & (b.free_i > i))

    def anatomy(self, at: str | float | int | None = None, top: int | None = None) -> Anatomy:
        i, label = self.index_at(at)
        live = self.live_at(i)
        c = self.classified
        groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for b, s, p, r in zip(live.tolist(), c.site[live].tolist(), self.blocks.alloc_phase[live].tolist(),
                              c.reason[live].tolist()):
            groups[(s, p, r)].append(b)
        rows = []
        for (s, p, _r), members in groups.items():
            m = np.array(members)
            size = self.blocks.block_size[m]
            cat = _dominant(c.category[m], size, CATEGORIES)
            reason = _dominant(c.reason[m], size, REASONS)
            rows.append(AnatomyRow(self.sites[s].label, self.sites[s].location, self.phase_name(p), str(cat), str(reason),
                                   int(m.size), int(size.sum()), int(self.blocks.size[m].sum())))
        rows.sort(key=lambda r: (-r.bytes, r.site))
        by_cat = _sum_by(c.category[live], self.blocks.block_size[live], CATEGORIES)
        by_phase: dict[str, int] = defaultdict(int)
        for p, s in zip(self.blocks.alloc_phase[live].tolist(), self.blocks.block_size[live].tolist()):
            by_phase[self.phase_name(p)] += s
        n = len(self.table)
        return Anatomy(label, i, self._time_s(i), int(self.allocated[i]) if n else 0, int(self.reserved[i]) if n else 0,
                       rows[:top] if top else rows, by_cat, dict(sorted(by_phase.items(), key=lambda kv: -kv[1])))

    # -- lifetimes --------------------------------------------------------
    def lifetimes(self, top: int | None = None) -> list[LifetimeRow]:
        """Per allocation site and reason: count, bytes, typical lifetime, and why it was freed then."""
        c, b = self.classified, self.blocks
        key = np.stack([c.site, c.reason.astype(np.int64), c.free_site, c.returned, c.rerun.astype(np.int64),
                        c.category.astype(np.int64)], axis=1)
        if key.shape[0] == 0:
            return []
        uniq, inverse = np.unique(key, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        bounds = np.flatnonzero(np.concatenate(([True], inverse[order][1:] != inverse[order][:-1], [True])))
        life = np.where(b.persistent, -1.0, (b.free_t - b.alloc_t) / 1e9)
        rows = []
        for g in range(len(uniq)):
            members = order[bounds[g]:bounds[g + 1]]
            first = int(members[0])
            sizes = b.block_size[members]
            phases = sorted({self.phase_name(int(p)) for p in b.alloc_phase[members].tolist()})
            fs = int(c.free_site[first])
            lifes = life[members]
            typical = float(np.median(lifes)) if (lifes >= 0).all() else -1.0
            rows.append(LifetimeRow(
                site=self.sites[c.site[first]].label,
                location=self.sites[c.site[first]].location,
                reason=str(REASONS[c.reason[first]]),
                category=str(CATEGORIES[c.category[first]]),
                phases=phases,
                count=int(members.size),
                bytes=int(sizes.sum()),
                largest=int(sizes.max()),
                typical_lifetime_s=typical,
                free_site=self.sites[fs].label if fs >= 0 else None,
                explanation=self.explanation(first) if len(phases) == 1 else self.explanation(first).replace(
                    f"in {self.phase_name(int(b.alloc_phase[first]))}", f"in {', '.join(phases)}"),
            ))
        rows.sort(key=lambda r: (-r.bytes, r.site, r.reason))
        return rows[:top] if top else rows

    # -- phases -----------------------------------------------------------
    def phases(self) -> list[PhaseRow]:
        """Per phase: allocated, freed, peak, reserved growth, persistent/handed on/transient, a sentence."""
        t, b, c, occ = self.table, self.blocks, self.classified, self.occ
        n = len(t)
        params = self._category_total(Category.PARAMETERS)
        rows = []
        phase_ids = sorted(set(b.alloc_phase[b.alloc_i >= 0].tolist()) | set(occ.phase.tolist())
                           | set(t.phase[(t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE)].tolist()))
        seg_delta = np.where(t.kind == SEGMENT_ALLOC, t.size, np.where(t.kind == SEGMENT_FREE, -t.size, 0))
        for p in phase_ids:
            mine = (b.alloc_phase == p) & (b.alloc_i >= 0)
            occ_rows = np.flatnonzero(occ.phase == p)
            freed_here = (b.free_phase == p) & ~b.persistent
            ev = t.phase == p
            alloc_ev = ev & ((t.kind == ALLOC) | (t.kind == FREE) | (t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE))
            peak = int(self.allocated[alloc_ev].max()) if alloc_ev.any() else 0
            rises = []
            for r in occ_rows.tolist():
                lo, hi = int(occ.begin_i[r]), min(int(occ.end_i[r]), n - 1)
                rises.append(int(self.allocated[lo:hi + 1].max() - self.allocated[lo]))
            persistent = mine & b.persistent
            if occ_rows.size:
                ends = np.where(c.alloc_occ >= 0, occ.end_i[np.maximum(c.alloc_occ, 0)], NEVER)
                transient = mine & ~b.persistent & (b.free_i < ends)
            else:
                transient = mine & ~b.persistent & (b.free_phase == p)
            handed = mine & ~b.persistent & ~transient
            by_cat = _sum_by(c.category[persistent], b.block_size[persistent], CATEGORIES)
            handed_to: dict[str, int] = defaultdict(int)
            for fp, s in zip(b.free_phase[handed].tolist(), b.block_size[handed].tolist()):
                handed_to[self.phase_name(fp)] += s
            first_occ = occ_rows[0] if occ_rows.size else -1
            first_persist = int(b.block_size[persistent & (c.alloc_occ == first_occ)].sum()) if first_occ >= 0 else int(b.block_size[persistent].sum())
            row = PhaseRow(
                phase=self.phase_name(p),
                role=phase_role(self.phase_name(p)),
                occurrences=int(occ_rows.size),
                allocated=int(b.block_size[mine].sum()),
                allocated_count=int(mine.sum()),
                freed=int(b.block_size[freed_here].sum()),
                freed_count=int(freed_here.sum()),
                peak=peak,
                peak_over_start=max(rises) if rises else 0,
                reserved_growth=int(seg_delta[ev].sum()),
                persistent=int(b.block_size[persistent].sum()),
                handed_on=int(b.block_size[handed].sum()),
                transient=int(b.block_size[transient].sum()),
                persistent_by_category=by_cat,
                handed_on_to=dict(sorted(handed_to.items(), key=lambda kv: -kv[1])),
                first_occurrence_persistent=first_persist,
                sentence="",
            )
            row.sentence = _phase_sentence(row, params, self.classified, self)
            rows.append(row)
        return rows

    def _category_total(self, category: Category) -> int:
        sel = self.classified.category == _C[category]
        return int(self.blocks.block_size[sel & self.blocks.persistent].sum()) or int(self._category_peak([category]))

    def _category_peak(self, categories: Sequence[Category]) -> int:
        """Peak over time of the live bytes of the given categories together."""
        b = self.blocks
        sel = np.isin(self.classified.category, [_C[x] for x in categories])
        n = len(self.table)
        if not sel.any() or n == 0:
            return 0
        delta = np.zeros(n, dtype=np.int64)
        known = sel & (b.alloc_i >= 0)
        delta[b.alloc_i[known]] += b.block_size[known]
        fr = sel & ~b.persistent
        delta[b.free_i[fr]] -= b.block_size[fr]
        initial = int(b.block_size[sel & (b.alloc_i < 0)].sum())
        return int(max(initial, (initial + np.cumsum(delta)).max()))

    # -- the estimate -----------------------------------------------------
    def estimate(self) -> Estimate:
        P = self._category_peak([Category.PARAMETERS])
        G = self._category_peak([Category.GRADIENTS])
        O = self._category_peak([Category.OPTIMIZER_STATE])
        I = self._category_peak([Category.OPTIMIZER_INTERMEDIATES])
        A = self._category_peak([Category.ACTIVATIONS])
        GI = self._category_peak([Category.GRADIENTS, Category.OPTIMIZER_INTERMEDIATES])
        T = self._category_peak([Category.TEMPORARIES, Category.BACKWARD_TEMPORARIES])
        W = self._category_peak([Category.WORKSPACE])
        other = self._category_peak([Category.OTHER_PERSISTENT, Category.OTHER, Category.BEFORE_LOG])
        est = P + O + max(GI, A)
        peak = self.timeline.peak_allocated
        at_peak = self.anatomy("peak").by_category if len(self.table) else {}
        gap = peak - est
        parts = [f"parameters {fmt_bytes(P)}", f"optimizer state {fmt_bytes(O)}"]
        if O and P:
            parts[-1] += f" ({O / P:.1f} × parameters)"
        which = "gradients + optimizer intermediates" if GI >= A else "activations"
        sentence = (
            f"Estimate parameters + optimizer state + max(gradients + optimizer intermediates, activations) = "
            f"{fmt_bytes(P)} + {fmt_bytes(O)} + max({fmt_bytes(GI)}, {fmt_bytes(A)}) = {fmt_bytes(est)} "
            f"(the max is {which}); measured peak allocated {fmt_bytes(peak)}"
        )
        if peak:
            sentence += f", {'above' if gap >= 0 else 'below'} the estimate by {fmt_bytes(abs(gap))}"
            extra = {k: v for k, v in at_peak.items() if k in (str(Category.TEMPORARIES), str(Category.BACKWARD_TEMPORARIES),
                                                                str(Category.WORKSPACE), str(Category.OTHER_PERSISTENT),
                                                                str(Category.OTHER), str(Category.BEFORE_LOG)) and v}
            if gap > 0 and extra:
                sentence += "; live at the peak and not in the estimate: " + ", ".join(
                    f"{k} {fmt_bytes(v)}" for k, v in sorted(extra.items(), key=lambda kv: -kv[1]))
        sentence += "."
        return Estimate(P, G, O, I, A, GI, T, W, other, est, peak, at_peak, sentence)

    # -- OOMs -------------------------------------------------------------
    def ooms(self) -> list[OomRow]:
        """Each OOM record, with the free memory in reserved segments and its largest contiguous range."""
        t = self.table
        rows = []
        for i in np.flatnonzero(t.kind == OOM).tolist():
            requested = int(t.size[i])
            reserved = int(t.block_size[i]) or int(self.reserved[i])
            allocated = int(self.allocated[i])
            free = max(0, reserved - allocated)
            largest, nseg = self._largest_free_range(i)
            frag = free >= requested and largest < requested
            stack = user_suffix(t.stack_of(int(t.stack[i])))
            site = stack[0].short() if stack else (NO_PYTHON.label if self.has_stacks else NO_STACKS.label)
            if frag:
                text = (
                    f"fragmentation: {fmt_bytes(free)} of the {fmt_bytes(reserved)} reserved was free -- more than the "
                    f"{fmt_bytes(requested)} asked for -- but split between live blocks: the largest free range in "
                    f"the {nseg} segments was {fmt_bytes(largest)}, and the device had no room for a new segment. "
                    "Blocks that stay alive between freed ones pin the segments: allocate long-lived tensors first, "
                    "free the interleaved ones together, or reuse buffers of one size."
                )
            elif free >= requested:
                text = (
                    f"{fmt_bytes(free)} of the {fmt_bytes(reserved)} reserved was free, enough for the "
                    f"{fmt_bytes(requested)} asked for, and its largest range ({fmt_bytes(largest)}) too, yet the "
                    "allocator could not use it (another stream's blocks, or the small pool's segments)."
                )
            else:
                text = (
                    f"not fragmentation: only {fmt_bytes(free)} of the {fmt_bytes(reserved)} reserved was free, less "
                    f"than the {fmt_bytes(requested)} asked for; {fmt_bytes(allocated)} was in use by live blocks "
                    "(see the anatomy at the OOM)."
                )
            rows.append(OomRow(self._time_s(i), requested, reserved, allocated, free, largest, nseg,
                               self.phase_name(int(t.phase[i])), site, frag, text))
        return rows

    def _largest_free_range(self, i: int) -> tuple[int, int]:
        """Largest gap between live blocks inside the segments live at event i, and the segment count."""
        t = self.table
        upto = np.arange(len(t)) <= i
        segs: dict[int, int] = {}
        for k in np.flatnonzero(upto & ((t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE))).tolist():
            if t.kind[k] == SEGMENT_ALLOC:
                segs[int(t.addr[k])] = int(t.size[k])
            else:
                segs.pop(int(t.addr[k]), None)
        if not segs:
            return 0, 0
        live = self.live_at(i)
        seg_addr = np.array(sorted(segs), dtype=np.uint64)
        seg_size = np.array([segs[int(a)] for a in seg_addr], dtype=np.int64)
        addr = self.blocks.addr[live]
        size = self.blocks.block_size[live]
        order = np.argsort(addr)
        addr, size = addr[order], size[order]
        owner = np.searchsorted(seg_addr, addr, side="right") - 1
        largest = 0
        for s in range(seg_addr.size):
            start, end = int(seg_addr[s]), int(seg_addr[s]) + int(seg_size[s])
            mine = owner == s
            cursor = start
            for a, z in zip(addr[mine].tolist(), size[mine].tolist()):
                if a >= end:
                    break
                largest = max(largest, a - cursor)
                cursor = max(cursor, a + z)
            largest = max(largest, end - cursor)
        return largest, int(seg_addr.size)

    # -- everything -------------------------------------------------------
    def to_dict(self, top: int = 50) -> dict[str, Any]:
        """The report as plain data (what `torchalloc report --json` prints)."""
        t = self.table
        return {
            "log": t.path,
            "device": self.device,
            "events": len(t),
            "blocks": len(self.blocks),
            "has_stacks": self.has_stacks,
            "backward_detected_from": self.backward_from,
            "notes": list(self.notes),
            "peak_allocated": self.timeline.peak_allocated,
            "peak_reserved": self.timeline.peak_reserved,
            "timeline": self.timeline.to_dict(),
            "peak_anatomy": self.anatomy("peak", top=top).to_dict() if len(t) else None,
            "markers": [self.anatomy(lab, top=top).to_dict() for lab in _unique([m[1] for m in self.timeline.markers])],
            "lifetimes": [r.to_dict() for r in self.lifetimes(top=top)],
            "phases": [r.to_dict() for r in self.phases()],
            "estimate": self.estimate().to_dict(),
            "ooms": [r.to_dict() for r in self.ooms()],
        }


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for x in items:
        seen.setdefault(x, None)
    return list(seen)


def _dominant(codes: np.ndarray, weights: np.ndarray, names: Sequence[Any]) -> Any:
    totals = np.bincount(codes.astype(np.int64), weights=weights.astype(np.float64), minlength=len(names))
    return names[int(np.argmax(totals))]


def _sum_by(codes: np.ndarray, weights: np.ndarray, names: Sequence[Any]) -> dict[str, int]:
    totals = np.bincount(codes.astype(np.int64), weights=weights.astype(np.float64), minlength=len(names))
    out = {str(names[k]): int(v) for k, v in enumerate(totals.tolist()) if v}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _explain(reason: Reason, category: Category, site: str, free_site: str | None, fn: str | None, phase: str,
             free_phase: str, rerun: bool, has_stacks: bool) -> str:
    if reason is Reason.TEMPORARY:
        return (f"temporary: made and freed on the same line ({site}); invisible to memory measured before and "
                "after that line, but part of its peak")
    if reason is Reason.FUNCTION_RETURNED:
        return (f"freed when its function returned: {fn}() kept it in a local variable until its frame exited, "
                f"back at the caller's line {free_site}")
    if reason is Reason.REBINDING:
        if rerun:
            return (f"freed on rebinding: the same line ({free_site}) ran again and assigned its name a new value, "
                    "freeing this one")
        via = f", after {fn}() returned it" if fn else ""
        return (f"freed on rebinding at {free_site}: it lived until the name holding it was assigned again "
                f"(or deleted) on that line{via}")
    if reason is Reason.SAVED_FOR_BACKWARD:
        return (f"saved for backward: allocated in {phase}, kept alive by autograd for the backward pass "
                f"and freed during it{f' ({free_phase})' if free_phase and free_phase != phase else ''}")
    if reason is Reason.PERSISTENT:
        detail = {
            Category.PARAMETERS: "model parameters or buffers",
            Category.GRADIENTS: f".grad of parameters, allocated in {phase}",
            Category.OPTIMIZER_STATE: f"optimizer state (e.g. Adam's exp_avg and exp_avg_sq), allocated in {phase}",
            Category.WORKSPACE: (f"a library workspace (cuBLAS's, per thread and stream), allocated at the first "
                                 f"matmul in {phase} and never freed"),
        }.get(category, f"allocated in {phase}, still referenced when the log ended")
        return f"persistent: still live at the end of the log -- {detail}"
    no_stacks = " (logged without stacks:1: only phases are known)" if not has_stacks else ""
    if reason is Reason.SAME_PHASE:
        return f"freed within the same occurrence of {phase} that allocated it{no_stacks}"
    if reason is Reason.LATER_PHASE:
        return f"outlived {phase}; freed later, in {free_phase}{no_stacks}"
    if category is Category.BEFORE_LOG:
        return "allocated before the log began; freed during it"
    if free_site is None:
        if category in (Category.BACKWARD_TEMPORARIES, Category.GRADIENTS):
            return (f"allocated and freed by autograd's engine during backward ({free_phase or phase}): gradients of "
                    "intermediate results, or recomputation")
        return f"freed on a thread without Python (autograd's engine or a C++ thread), in {free_phase or phase}"
    if site == NO_PYTHON.label:
        return f"allocated on a thread without Python (autograd's engine, in {phase}); freed at {free_site}"
    return f"freed at {free_site}, from a different call path than the one that made it{no_stacks}"


def _phase_sentence(row: PhaseRow, params: int, classified: Classified, analysis: Analysis) -> str:
    """E.g. "optimizer: reserved 6.3 GiB more; 4.2 GiB is optimizer state that stays (2.0 × parameters), 2.1 GiB transient"."""
    growth = row.reserved_growth
    if growth > 0:
        head = f"{row.phase}: reserved {fmt_bytes(growth)} more"
    elif growth < 0:
        head = f"{row.phase}: reserved {fmt_bytes(-growth)} less"
    else:
        head = f"{row.phase}: reserved unchanged"
    if row.occurrences > 1:
        head += f" over {row.occurrences} occurrences"
    parts = []
    if row.persistent:
        cats = row.persistent_by_category
        main, main_bytes = next(iter(cats.items())) if cats else ("", 0)
        what = f"{fmt_bytes(row.persistent)} stays ({', '.join(f'{k} {fmt_bytes(v)}' for k, v in cats.items())})"
        if main and main_bytes >= 0.9 * row.persistent:
            what = f"{fmt_bytes(row.persistent)} is {main} that stays"
            if main == str(Category.OPTIMIZER_STATE) and params:
                what += f" ({row.persistent / params:.1f} × parameters)"
        if row.occurrences > 1 and row.first_occurrence_persistent and row.first_occurrence_persistent >= row.persistent * 0.9:
            what += ", all from the first occurrence"
        parts.append(what)
    if row.handed_on:
        to = ", ".join(row.handed_on_to)
        if row.role == "forward" and "backward" in " ".join(row.handed_on_to).lower():
            parts.append(f"{fmt_bytes(row.handed_on)} saved for backward (freed in {to})")
        else:
            parts.append(f"{fmt_bytes(row.handed_on)} outlived it (freed in {to})")
    if row.transient:
        rise = f"; peak {fmt_bytes(row.peak_over_start)} above its start" if row.peak_over_start else ""
        parts.append(f"{fmt_bytes(row.transient)} transient (freed within it{rise})")
    if not parts:
        parts.append("allocated nothing")
    return f"{head}; " + ", ".join(parts) + "."


def analyze(
    source: EventTable | Any | str | os.PathLike[str],
    *,
    device: int | None = None,
    max_points: int = 1500,
    progress: bool = False,
) -> Analysis:
    """Analyze a log (a path, a decoded `torchalloc.log.Log`, or an EventTable) for one device
    (default: the one with the most allocations)."""
    if isinstance(source, (str, os.PathLike)):
        table = load(source)
    elif isinstance(source, EventTable):
        table = source
    else:
        table = table_from_log(source)
    _PROGRESS["enabled"] = progress
    devices = devices_in(table)
    if device is None:
        device = devices[0] if devices else 0
    elif devices and device not in devices:
        raise ValueError(f"no events for device {device}; the log has devices {devices}")
    t = table.select((table.device == device) | (table.device < 0))
    notes = list(table.notes)
    if len(devices) > 1:
        notes.append(f"the log has devices {devices}; this is device {device} (--device picks another)")
    blocks, odd = pair_blocks(t)
    if odd["before_log"]:
        notes.append(f"{odd['before_log']} blocks were allocated before the log began (their frees are in it)")
    if odd["lost_frees"]:
        notes.append(f"{odd['lost_frees']} addresses were allocated again while still live (a lost free record)")
    occ = phase_occurrences(t)
    in_bw, bw_from = backward_mask(t, occ)
    sites = _Sites()
    classified = classify(t, blocks, occ, in_bw, sites)
    has_stacks = bool(np.any(blocks.alloc_stack != 0))
    if len(blocks) and not has_stacks:
        notes.append("no stacks in this log (TORCHALLOC_CONF stacks:1, or install(stacks=True)): reasons come from "
                     "phases only, and allocation sites are unknown")
    if bw_from == "none" and np.any(blocks.free_i != NEVER):
        notes.append("no backward pass found (no phase named backward, no Tensor.backward frames): "
                     "nothing can be called 'saved for backward'")
    allocated, reserved, _ = _levels(t, blocks)
    timeline = build_timeline(t, blocks, occ, allocated, reserved, max_points)
    return Analysis(t, device, blocks, occ, classified, sites.sites, allocated, reserved, timeline, has_stacks, bw_from, notes)
