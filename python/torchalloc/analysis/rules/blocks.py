"""classify.py's and categorize.py's rules, block by block, for the second pass (passes/second.py).

Takes the log's stacks and phase names and what the first pass found
(passes/first.py: has the log stacks, where the first forward/backward/
optimizer phase began, the sizes of the persistent parameters, and each
block's `BIT_*` byte); gives, for a batch of blocks, each one's allocation
site, its category (at its alloc: everything it depends on is known by
then), and at its end its reason, free site and returning function. The
rules are those the module docstrings of classify.py and categorize.py
state, applied per distinct stack or stack pair and cached. `LineRuns`
keeps, piece by piece, where each frame chain's allocating line changed
(the "freed on rebinding" rule needs it at a block's end).

Site and function ids here are in first-use order; `canonical` gives the
order the report lists them in (the allocation stacks' sites in stack id
order, then BEFORE_LOG, then the free sites in (alloc stack, free stack)
order), which decides how ties are listed.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...printable import printable
from .categorize import CATEGORY_CODE, Category, _workspace_sizes
from .classify import REASON_CODE, Reason, classify_stacks
from .frames import NN_INIT_FRAME, OPTIMIZER_FRAME, Frame, Stack, has_frame, user_suffix
from .roles import PHASE_IDS, phase_role
from .sites import BEFORE_LOG, NO_PYTHON, NO_STACKS, Site, SiteTable

# Per block (by ordinal): what the first pass (passes/first.py) learns of it, a bit each: what these rules need of
# a block's future at its alloc.
BIT_ALLOC_BW = 1  # allocated during backward (classify.py, rule 2: a backward phase, or a Python thread inside
#                   Tensor.backward; phase names as far as read: every phase_begin precedes its events)
BIT_FREE_BW = 2  # ended during backward
BIT_AUTOGRAD_FREE = 4  # its free has no stack, or a stack inside backward (classify.py, rule 2: by autograd)
BIT_WITHIN = 8  # ended before the occurrence of the phase that allocated it ended
BIT_SAME = 16  # the thread's allocation before or after it has the same stack (categorize: workspaces)
BIT_PERSISTENT = 32  # never ended: live at the end of the log

C = CATEGORY_CODE
R = REASON_CODE
_ROLES = ("", "forward", "backward", "optimizer", "setup")


class BlockRules:
    """The per-block rules, with their caches (module docstring)."""

    def __init__(self, stacks: dict[int, Any], phase_names: dict[int, str], has_stacks: bool,
                 first_begin: dict[int, int]) -> None:
        # shown escaped, as every report shows text from the log (torchalloc.printable)
        self.stacks: dict[int, Stack] = {int(k): tuple(Frame(printable(str(f[0])), int(f[1]), printable(str(f[2])))
                                                       for f in v) for k, v in stacks.items()}
        phase_names = {k: printable(v) for k, v in phase_names.items()}
        self.phase_names = phase_names
        self.has_stacks = has_stacks
        roles = {p: phase_role(name) for p, name in phase_names.items()}
        self.role = np.zeros(PHASE_IDS, dtype=np.int8)
        for p, r in roles.items():
            self.role[p] = _ROLES.index(r or "")
        self.bw_phase = self.role == _ROLES.index("backward")
        active = [first_begin[p] for p, r in roles.items() if r in ("forward", "backward", "optimizer")
                  and p in first_begin]
        self.first_active = min(active) if active else None
        self.workspace = np.array(sorted(_workspace_sizes()), dtype=np.int64)
        self.param_sizes = np.zeros(0, dtype=np.int64)
        self.sites = SiteTable()
        self._site: dict[int, int] = {}
        self._flags: dict[int, tuple[bool, bool]] = {}  # stack -> (torch.nn init frame, optimizer frame)
        self._verdict: dict[tuple[int, int], tuple[int, int, int, bool]] = {}
        self.functions: list[str] = []
        self._fn: dict[str, int] = {}
        self._chain: dict[int, tuple[int, int]] = {}
        self._chains: dict[Any, int] = {}

    def stack_of(self, sid: int) -> Stack:
        return self.stacks.get(int(sid), ())

    # -- per stack -------------------------------------------------------
    def site_ids(self, alloc_stacks: np.ndarray) -> np.ndarray:
        """The allocation site of each block (by its alloc stack): its first user frame, else NO_PYTHON (NO_STACKS
        in a log without stacks)."""
        uniq, inv = np.unique(alloc_stacks, return_inverse=True)
        out = np.empty(uniq.size, dtype=np.int64)
        for k, sid in enumerate(uniq.tolist()):
            if sid not in self._site:
                a = user_suffix(self.stack_of(sid))
                self._site[sid] = (self.sites.of_frame(a[0]) if a
                                   else self.sites.id(NO_PYTHON if self.has_stacks else NO_STACKS))
            out[k] = self._site[sid]
        return out[inv.reshape(-1)]

    def _stack_flags(self, alloc_stacks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        uniq, inv = np.unique(alloc_stacks, return_inverse=True)
        nn = np.empty(uniq.size, dtype=bool)
        opt = np.empty(uniq.size, dtype=bool)
        for k, sid in enumerate(uniq.tolist()):
            if sid not in self._flags:
                stack = self.stack_of(sid)
                self._flags[sid] = (has_frame(stack, NN_INIT_FRAME), has_frame(stack, OPTIMIZER_FRAME))
            nn[k], opt[k] = self._flags[sid]
        inv = inv.reshape(-1)
        return nn[inv], opt[inv]

    def chain_and_line(self, alloc_stacks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per alloc stack, its frame chain id (its innermost user frame's function and the frames outside it;
        -1: no user frames) and that frame's line: what LineRuns follows."""
        uniq, inv = np.unique(alloc_stacks, return_inverse=True)
        chain = np.empty(uniq.size, dtype=np.int64)
        line = np.empty(uniq.size, dtype=np.int64)
        for k, sid in enumerate(uniq.tolist()):
            if sid not in self._chain:
                a = user_suffix(self.stack_of(sid))
                if not a:
                    self._chain[sid] = (-1, -1)
                else:
                    key = ((a[0].filename, a[0].function), a[1:])
                    self._chain[sid] = (self._chains.setdefault(key, len(self._chains)), a[0].line)
            chain[k], line[k] = self._chain[sid]
        inv = inv.reshape(-1)
        return chain[inv], line[inv]

    # -- categories (categorize.py's rules), at the alloc --------------------------
    def params_flags(self, stacks: np.ndarray, phases: np.ndarray, alloc_i: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(params, optim, setup) per block: categorize.py's evidence from stacks, phase roles and time."""
        nn, opt_frame = self._stack_flags(stacks)
        role = self.role[phases]
        optim = (role == _ROLES.index("optimizer")) | opt_frame
        setup = role == _ROLES.index("setup")
        if self.has_stacks or self.first_active is None:
            early = np.zeros(len(stacks), dtype=bool)
        else:
            early = alloc_i < self.first_active
        params = nn | ((setup | early) & ~optim)
        return params, optim, setup

    def set_param_sizes(self, persistent: dict[str, np.ndarray]) -> None:
        """The sizes of the persistent blocks that are parameters: a block of one of them made during backward
        is a gradient, not a workspace."""
        if not len(persistent["ordinal"]):
            return
        params, _, _ = self.params_flags(persistent["stack"], persistent["phase"], persistent["alloc_i"])
        self.param_sizes = np.unique(persistent["block_size"][params])

    def categories(self, bits: np.ndarray, stacks: np.ndarray, phases: np.ndarray, alloc_i: np.ndarray,
                   block_size: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Each new block's category, by categorize.py's rules (its bits say how it will end)."""
        params, optim, setup = self.params_flags(stacks, phases, alloc_i)
        persistent = (bits & BIT_PERSISTENT) != 0
        alloc_bw = (bits & BIT_ALLOC_BW) != 0
        free_bw = (bits & BIT_FREE_BW) != 0
        within = (bits & BIT_WITHIN) != 0
        saved = self.saved(bits)
        ws = np.isin(block_size, self.workspace) | np.isin(size, self.workspace)
        ws &= ((bits & BIT_SAME) != 0) & ~(alloc_bw & np.isin(block_size, self.param_sizes))
        cat = np.full(len(bits), C[Category.OTHER], dtype=np.int8)
        p = persistent
        cat[p] = C[Category.OTHER_PERSISTENT]
        cat[p & params] = C[Category.PARAMETERS]
        cat[p & ~params & alloc_bw] = C[Category.GRADIENTS]
        cat[p & ~params & optim] = C[Category.OPTIMIZER_STATE]
        cat[p & ~params & ~optim & ws & ~setup] = C[Category.WORKSPACE]
        f = ~persistent
        cat[f] = C[Category.TEMPORARIES]
        cat[f & alloc_bw] = C[Category.BACKWARD_TEMPORARIES]
        cat[f & alloc_bw & ~free_bw] = C[Category.GRADIENTS]
        cat[f & optim] = np.where(within[f & optim], C[Category.OPTIMIZER_INTERMEDIATES], C[Category.OPTIMIZER_STATE])
        cat[f & saved] = C[Category.ACTIVATIONS]
        cat[f & params & ~alloc_bw & ~optim] = C[Category.PARAMETERS]
        return cat

    def saved(self, bits: np.ndarray) -> np.ndarray:
        """classify.py's rule 2 (for blocks that end): made outside backward, freed by autograd during it."""
        autograd = ((bits & BIT_AUTOGRAD_FREE) != 0) | (not self.has_stacks)
        return (((bits & BIT_FREE_BW) != 0) & ((bits & BIT_ALLOC_BW) == 0) & autograd
                & ((bits & BIT_PERSISTENT) == 0))

    # -- reasons (classify.py's rules), at the end ---------------------------------
    def stack_rules(self, alloc_stacks: np.ndarray, free_stacks: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """classify_stacks per block (cached per pair): reason code, free site id, returned function id, and
        whether it was a same-line (temporary) candidate."""
        pairs = np.stack((alloc_stacks, free_stacks), axis=1)
        uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
        n = len(uniq)
        reason = np.empty(n, dtype=np.int8)
        free_site = np.empty(n, dtype=np.int64)
        returned = np.empty(n, dtype=np.int64)
        for k, (a, f) in enumerate(uniq.tolist()):
            key = (a, f)
            if key not in self._verdict:
                v = classify_stacks(self.stack_of(a), self.stack_of(f))
                fn = -1
                if v.returned is not None:
                    fn = self._fn.setdefault(v.returned, len(self.functions))
                    if fn == len(self.functions):
                        self.functions.append(v.returned)
                self._verdict[key] = (R[v.reason], self.sites.of_frame(v.free_site), fn, v.same_frame_line)
            reason[k], free_site[k], returned[k], _ = self._verdict[key]
        inv = inv.reshape(-1)
        return reason[inv], free_site[inv], returned[inv], reason[inv] == R[Reason.TEMPORARY]

    # -- the report's order of sites and functions ----------------------------------
    def canonical(self, alloc_stacks: np.ndarray, rest_pairs: np.ndarray) -> tuple[list[Site], np.ndarray, np.ndarray]:
        """The sites in the report's order (module docstring), and the maps from this object's site and function
        ids to that order's. `alloc_stacks`: every block's alloc stack (unique, sorted;
        0 for blocks allocated before the log); `rest_pairs`: the (alloc, free) stack pairs that went through
        the stack rules (unique, sorted)."""
        table = SiteTable()
        for sid in alloc_stacks.tolist():
            a = user_suffix(self.stack_of(sid))
            table.of_frame(a[0]) if a else table.id(NO_PYTHON if self.has_stacks else NO_STACKS)
        table.id(BEFORE_LOG)
        functions: dict[str, int] = {}
        if self.has_stacks:
            for a, f in rest_pairs.tolist():
                v = classify_stacks(self.stack_of(a), self.stack_of(f))
                table.of_frame(v.free_site)
                if v.returned is not None:
                    functions.setdefault(v.returned, len(functions))
        site_map = np.array([table.id(s) for s in self.sites.sites] + [-1], dtype=np.int64)  # [-1]: no site
        fn_map = np.array([functions.get(f, -1) for f in self.functions] + [-1], dtype=np.int64)
        return table.sites, site_map, fn_map


class LineRuns:
    """Per frame chain, where its allocating line changed ("the line ran again": classify.py's note on loops), piece
    by piece: the changes of the current piece, and each chain's last change and line before it."""

    def __init__(self) -> None:
        self.last_change: dict[int, int] = {}  # chain -> index of its last line change
        self.last_line: dict[int, int] = {}
        self._changes = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._changes_before: dict[int, int] = {}

    def piece(self, chain: np.ndarray, line: np.ndarray, ai: np.ndarray) -> None:
        """The piece's new blocks: their frame chain (-1: none), allocating line and alloc index."""
        sel = chain >= 0
        if not sel.any():
            self._changes = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
            return
        c, l_, i = chain[sel], line[sel], ai[sel]
        order = np.lexsort((i, c))
        c, l_, i = c[order], l_[order], i[order]
        prev = np.empty(c.size, dtype=np.int64)
        prev[1:] = l_[:-1]
        first = np.ones(c.size, dtype=bool)
        first[1:] = c[1:] != c[:-1]
        prev[first] = [self.last_line.get(int(x), int(y)) for x, y in zip(c[first].tolist(), l_[first].tolist())]
        change = l_ != prev
        self._changes = (c[change], i[change])  # sorted by (chain, index)
        self._changes_before = dict(self.last_change)
        last = np.ones(c.size, dtype=bool)
        last[:-1] = c[1:] != c[:-1]
        for x, y in zip(c[last].tolist(), l_[last].tolist()):
            self.last_line[x] = y
        for x, y in zip(self._changes[0].tolist(), self._changes[1].tolist()):
            self.last_change[x] = y

    def ran_again(self, chain: np.ndarray, alloc_i: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Did the chain's line change at an allocation between each block's alloc and its end?"""
        out = np.array([self._changes_before.get(int(c), -1) > a for c, a in zip(chain.tolist(), alloc_i.tolist())],
                       dtype=bool) if chain.size else np.zeros(0, dtype=bool)
        cc, ci = self._changes
        if cc.size:
            key = (cc << 40) | ci
            q = np.searchsorted(key, (chain << 40) | alloc_i, side="right")
            ok = q < key.size
            qq = np.minimum(q, key.size - 1)
            out |= ok & (cc[qq] == chain) & (ci[qq] < end)
        return out & (chain >= 0)
