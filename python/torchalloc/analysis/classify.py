"""Why each block was freed when it was: backward detection, the stack rules, allocation sites.

Takes the event table, the blocks and the phase occurrences; gives
`Reasons`: per block a `Reason`, its allocation site and free site (ids in
a `SiteTable`), the function whose return freed it, and whether it was made
or freed during backward. Stacks are optional: without them the rules fall
back to phases (rule 4), and without phases as well every block still gets
a reason.

Why a block was freed (`Reason`), in this order of precedence
-------------------------------------------------------------
Let A be the user suffix (frames.py) of the allocation stack and F that of
the free stack.

1. persistent -- never freed by the end of the log, or living through the
   whole run whatever its phase: allocated before the first phase
   occurrence began and freed after the last one ended, as parameters
   freed at teardown are (a log without phases has no such boundary). Sub-labelled by its category
   (parameters, gradients, optimizer state, library workspace...).
2. saved for backward -- allocated outside backward and freed during
   backward. "During backward" means a phase whose name says backward
   (``torchalloc.phase("backward")``, see roles.py), or, without such
   phases, a free on a thread without Python frames (autograd's engine)
   while a Python thread is inside ``Tensor.backward``/
   ``torch.autograd.backward`` (seen as records whose stacks hold those
   frames).
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
   Without phases too, "within its phase" means within the default phase.
   The report says that stacks were missing.

The same line run again in a loop (``for ...: x = x + 1`` where the loop
header allocates nothing) frees the previous value on the very line that
made it, and reads as temporary: stacks carry lines, not iterations.
A block whose F equals A but where another line of the same function
allocated between its alloc and its free is therefore called "freed on
rebinding" (the line ran again later), not temporary.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Iterable, Sequence

import numpy as np

from .._records import ALLOC, FREE
from .blocks import Blocks, Occurrences
from .events import EventTable
from .frames import BACKWARD_FRAME, Frame, Stack, has_frame, is_library_frame, user_suffix
from .roles import phase_role
from .sites import BEFORE_LOG, NO_PYTHON, NO_STACKS, SiteTable


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


REASONS: tuple[Reason, ...] = tuple(Reason)
REASON_CODE = {r: i for i, r in enumerate(REASONS)}  # Reason -> its code in Reasons.reason


# ---------------------------------------------------------------------------
# Backward detection
# ---------------------------------------------------------------------------


def backward_mask(t: EventTable, occ: Occurrences) -> tuple[np.ndarray, str]:
    """Per event: whether it happened during backward. Returns the mask and how it was found
    ("phase", "stacks", "phase+stacks" or "none")."""
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
    flag_of_stack = {sid: has_frame(t.stack_of(sid), BACKWARD_FRAME)
                     for sid in np.unique(t.stack[with_stack]).tolist()}
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
# The stack rules (rule 3) for one pair of stacks
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
# Every block
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Reasons:
    """Per block: reason code (index into REASONS), site ids, details."""

    reason: np.ndarray
    site: np.ndarray  # allocation site id
    free_site: np.ndarray  # free site id, -1 when none
    returned: np.ndarray  # index into `functions`, -1 when not applicable
    rerun: np.ndarray  # bool: REBINDING because the same line ran again
    alloc_occ: np.ndarray  # occurrence row of the alloc phase, -1 if none
    functions: list[str]
    alloc_in_backward: np.ndarray  # bool: allocated during backward
    free_in_backward: np.ndarray  # bool: freed during backward
    has_stacks: bool  # any allocation stack recorded (the log was written with stacks:1)


def _progress(items: Sequence[Any], desc: str, enabled: bool) -> Iterable[Any]:
    """tqdm over `items` when asked for, installed and worth it."""
    if not enabled or len(items) < 20000:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False, unit="stack")


def _stack_rule_pairs(
    t: EventTable, blocks: Blocks, idx: np.ndarray, sites: SiteTable, progress: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """classify_stacks for the blocks `idx`, once per distinct (alloc stack, free stack) pair."""
    reason = np.full(idx.size, REASON_CODE[Reason.OTHER], dtype=np.int8)
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
    for k, (a_id, f_id) in enumerate(_progress(uniq.tolist(), "classifying stacks", progress)):
        v = classify_stacks(t.stack_of(a_id), t.stack_of(f_id))
        u_reason[k] = REASON_CODE[v.reason]
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


def classify(
    t: EventTable,
    blocks: Blocks,
    occ: Occurrences,
    in_backward: np.ndarray,
    sites: SiteTable,
    progress: bool = False,
) -> Reasons:
    """Reason and allocation site for every block (module docstring); `progress` shows a bar on big logs."""
    nb = len(blocks)
    n = len(t)
    reason = np.full(nb, REASON_CODE[Reason.OTHER], dtype=np.int8)
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

    reason[persistent] = REASON_CODE[Reason.PERSISTENT]
    # saved for backward: made outside backward, freed during it (by autograd: no Python
    # stack, or a stack inside Tensor.backward)
    free_by_autograd = np.ones(nb, dtype=bool)
    if has_stacks:
        fs_uniq, fs_inv = np.unique(blocks.free_stack, return_inverse=True)
        ok = np.array([sid == 0 or has_frame(t.stack_of(sid), BACKWARD_FRAME) for sid in fs_uniq.tolist()],
                      dtype=bool)
        free_by_autograd = ok[fs_inv.reshape(-1)]
    saved = freed & ~before & free_bw & ~alloc_bw & free_by_autograd
    reason[saved] = REASON_CODE[Reason.SAVED_FOR_BACKWARD]

    alloc_occ = occ.of(blocks.alloc_phase.astype(np.int64), ai)
    alloc_occ[before] = -1
    rest = np.flatnonzero(freed & ~saved & ~before)
    if has_stacks:
        r, fsite, ret, functions = _stack_rule_pairs(t, blocks, rest, sites, progress)
        reason[rest], free_site[rest], returned[rest] = r, fsite, ret
        temp = rest[r == REASON_CODE[Reason.TEMPORARY]]
        again = _line_ran_again(t, blocks, temp)
        reason[temp[again]] = REASON_CODE[Reason.REBINDING]
        rerun[temp[again]] = True
    else:
        # rule 4: within the occurrence that allocated it; without occurrences (no phases, or
        # phase 0), within the phase that allocated it
        end_of_occ = occ.end_of(alloc_occ[rest], none=-1)
        within = np.where(alloc_occ[rest] >= 0, blocks.free_i[rest] < end_of_occ,
                          blocks.free_phase[rest] == blocks.alloc_phase[rest])
        reason[rest] = np.where(within, REASON_CODE[Reason.SAME_PHASE], REASON_CODE[Reason.LATER_PHASE])

    # a phase-based reason ("freed within its phase") is wrong for a block that outlived all the work; a stack
    # rule (rebinding, a function's return) still says better why it was freed
    by_phase = np.isin(reason, [REASON_CODE[r] for r in (Reason.SAME_PHASE, Reason.LATER_PHASE, Reason.OTHER)])
    reason[whole_run(t, blocks, occ) & by_phase] = REASON_CODE[Reason.PERSISTENT]
    return Reasons(reason, site, free_site, returned, rerun, alloc_occ, functions, alloc_bw, free_bw, has_stacks)


def whole_run(t: EventTable, blocks: Blocks, occ: Occurrences) -> np.ndarray:
    """The freed blocks that lived through the whole run: made before its first phase occurrence began, freed
    after its last one ended. A log without phases has no such boundary: none."""
    freed = ~blocks.persistent
    if not occ.begin_i.size:
        return np.zeros(len(blocks), dtype=bool)
    first, last = int(occ.begin_i.min()), int(occ.end_i.max())
    return freed & (blocks.alloc_i <= first) & (blocks.free_i >= last) & (last > first)
