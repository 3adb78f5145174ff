"""Memory by module: which nn.Module each block belongs to, and what it is to it.

Takes a `Derived`; gives `Modules`: per block its module id and what it is
("activations saved for backward", "temporaries", "gradients",
"parameters", "optimizer state", "other"), and one `ModuleRow` per module
path with the bytes its blocks hold at the peak and at each phase's own
peak (the moment that phase's allocated level was highest).

The log says which module a block belongs to in two ways
(docs/LOG_FORMAT.md, "Modules"), both written by `torchalloc.track`:

- a MODULE record makes a module current; every ALLOC after it in the
  log's order was made inside that module (until the next MODULE record);
- a MODULE_TAG record names a block by an address inside it: that block,
  live at the tag, is the module's parameter, a parameter's gradient or
  optimizer state. A tag beats the current module: a gradient is made by
  the autograd engine while some other module's backward runs, and
  optimizer state outside every module.

Without a tag, what a block is comes from its reason and category
(classify.py, categorize.py). Logs without module records give no rows.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np

from .._records import ALLOC, FREE, MODULE, MODULE_NAME, MODULE_TAG, TAG_GRADIENT, TAG_OPTIMIZER_STATE, TAG_PARAMETER
from .categorize import CATEGORIES, Category
from .classify import REASONS, Reason
from .derived import Derived

OUTSIDE = "(outside modules)"
SAVED = "activations saved for backward"
TEMPORARIES = "temporaries"
OTHER = "other"
# What a block is to its module, in the order the report lists them.
WHAT: tuple[str, ...] = (SAVED, TEMPORARIES, "gradients", "parameters", "optimizer state", OTHER)
_FROM_TAG = {TAG_PARAMETER: "parameters", TAG_GRADIENT: "gradients", TAG_OPTIMIZER_STATE: "optimizer state"}
_FROM_CATEGORY = {
    Category.PARAMETERS: "parameters",
    Category.GRADIENTS: "gradients",
    Category.OPTIMIZER_STATE: "optimizer state",
    Category.ACTIVATIONS: SAVED,
    Category.TEMPORARIES: TEMPORARIES,
    Category.BACKWARD_TEMPORARIES: TEMPORARIES,
    Category.OPTIMIZER_INTERMEDIATES: TEMPORARIES,
}
_CANDIDATES = 64  # blocks below a tagged address looked at for one that holds it (views into a larger block)


@dataclasses.dataclass
class ModuleRow:
    module: str  # its path, "model.layers.3.mlp"
    at_peak: int  # bytes its blocks hold at the run's peak
    blocks_at_peak: int
    what_at_peak: dict[str, int]  # WHAT -> bytes at the peak, largest first
    by_phase: dict[str, int]  # phase -> bytes held at that phase's own peak

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Modules:
    module_of: np.ndarray  # per block: module id (0: none)
    what_of: np.ndarray  # per block: index into WHAT
    names: dict[int, str]  # module id -> path
    peak_index: int
    phase_peaks: dict[str, int]  # phase -> the event index of its own peak
    rows: list[ModuleRow]
    tags_unmatched: int  # tags naming an address no live block holds

    def name(self, module: int) -> str:
        if module == 0:
            return OUTSIDE
        return self.names.get(module, f"module #{module}")


def _current_module(d: Derived) -> np.ndarray:
    """Per block, the module current when it was allocated: the last MODULE record before its ALLOC."""
    t, b = d.table, d.blocks
    at = np.flatnonzero(t.kind == MODULE)
    if not at.size:
        return np.zeros(len(b), dtype=np.int64)
    k = np.searchsorted(at, b.alloc_i, side="right") - 1
    ids = t.size[at].astype(np.int64)
    return np.where((k >= 0) & (b.alloc_i >= 0), ids[np.maximum(k, 0)], 0)


def _apply_tags(d: Derived, module_of: np.ndarray, tag_of: np.ndarray) -> int:
    """Give each tagged block its tag's module and role; returns the tags no live block holds."""
    t, b = d.table, d.blocks
    tags = np.flatnonzero(t.kind == MODULE_TAG)
    if not tags.size or not len(b):
        return int(tags.size)
    order = np.lexsort((b.alloc_i, b.addr))
    start = b.addr[order].astype(np.uint64)
    end = start + b.block_size[order].astype(np.uint64)
    alloc_i, free_i = b.alloc_i[order], b.free_i[order]
    # Most tags name a block's first byte (a parameter, its gradient, a state tensor): found for all tags at
    # once, the block starting there most recently allocated at or before the tag; a run tags every parameter's
    # gradient every step, so this is most of them. The rest are looked for one by one.
    starts, rank = np.unique(start, return_inverse=True)
    span = np.int64(len(t) + 2)
    keys = rank.astype(np.int64) * span + (alloc_i.astype(np.int64) + 1)  # ascending: sorted by (addr, alloc_i)
    tag_addr = t.addr[tags].astype(np.uint64)
    where = np.minimum(np.searchsorted(starts, tag_addr), starts.size - 1)
    exact = starts[where] == tag_addr
    k = np.searchsorted(keys, where.astype(np.int64) * span + (tags.astype(np.int64) + 1), side="right") - 1
    k = np.maximum(k, 0)
    found = exact & (rank[k] == where) & (alloc_i[k] <= tags) & (free_i[k] > tags)
    matched = list(zip(tags[found].tolist(), order[k[found]].tolist()))  # (tag's index, block)
    unmatched = 0
    for i in tags[~found].tolist():
        addr = np.uint64(t.addr[i])
        hi = int(np.searchsorted(start, addr, side="right"))
        for c in range(hi - 1, max(hi - 1 - _CANDIDATES, -1), -1):
            if start[c] <= addr < end[c] and alloc_i[c] <= i < free_i[c]:
                matched.append((i, int(order[c])))
                break
        else:
            unmatched += 1
    for i, j in sorted(matched):  # in log order: a block's later tag wins
        module_of[j] = int(t.size[i])
        tag_of[j] = int(t.flags[i])
    return unmatched


def _what(d: Derived, tag_of: np.ndarray) -> np.ndarray:
    c = d.classified
    code = {w: k for k, w in enumerate(WHAT)}
    cat = np.array([code[_FROM_CATEGORY.get(cat, OTHER)] for cat in CATEGORIES], dtype=np.int64)
    what = cat[c.category.astype(np.int64)] if len(d.blocks) else np.zeros(0, dtype=np.int64)
    saved = c.reason == REASONS.index(Reason.SAVED_FOR_BACKWARD)
    what = np.where(saved, code[SAVED], what)
    for role, name in _FROM_TAG.items():
        what = np.where(tag_of == role, code[name], what)
    return what


def _phase_peaks(d: Derived) -> dict[str, int]:
    """Per phase that allocated or freed a block, the event index where allocated was highest while it was current."""
    t = d.table
    ev = np.flatnonzero((t.kind == ALLOC) | (t.kind == FREE))
    out: dict[str, int] = {}
    for p in sorted(set(t.phase[ev].tolist())):
        mine = ev[t.phase[ev] == p]
        out[d.phase_name(p)] = int(mine[np.argmax(d.allocated[mine])])
    return out


def modules(d: Derived, peak_index: int) -> Modules:
    """Each block's module and what it is to it; per module path, the bytes held at the peak and each phase's peak."""
    t, b = d.table, d.blocks
    names = {int(t.size[i]): t.strings.get(int(t.stack[i]), f"module #{int(t.size[i])}")
             for i in np.flatnonzero(t.kind == MODULE_NAME).tolist()}
    module_of = _current_module(d)
    tag_of = np.zeros(len(b), dtype=np.int64)
    unmatched = _apply_tags(d, module_of, tag_of)
    what_of = _what(d, tag_of)
    result = Modules(module_of, what_of, names, peak_index, {}, [], unmatched)
    if not names and not np.any(module_of):
        return result  # no module records: a log written without track()'s modules
    result.phase_peaks = _phase_peaks(d)
    live = d.live_at(peak_index)
    held: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    count: dict[int, int] = defaultdict(int)
    for j, m, w, n in zip(live.tolist(), module_of[live].tolist(), what_of[live].tolist(),
                          b.block_size[live].tolist()):
        held[m][WHAT[w]] += n
        count[m] += 1
    by_phase: dict[int, dict[str, int]] = defaultdict(dict)
    for phase, i in result.phase_peaks.items():
        at = d.live_at(i)
        ids, inverse = np.unique(module_of[at], return_inverse=True)  # ids are the writer's: maybe large
        totals = np.bincount(inverse, weights=b.block_size[at].astype(np.float64), minlength=ids.size)
        for m, n in zip(ids.tolist(), totals.tolist()):
            if n:
                by_phase[m][phase] = int(n)
    def largest(m: int) -> tuple[int, int]:
        return (-sum(held[m].values()) if m in held else 0, -max(by_phase[m].values(), default=0))

    for m in sorted(set(held) | set(by_phase), key=largest):
        what = dict(sorted(((k, v) for k, v in held[m].items() if v), key=lambda kv: -kv[1])) if m in held else {}
        result.rows.append(ModuleRow(result.name(m), sum(what.values()), count.get(m, 0), what, by_phase.get(m, {})))
    return result
