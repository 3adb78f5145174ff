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
  optimizer state (ranges.holders finds it: of the blocks live then that
  hold the address, the one starting highest). A tag beats the current
  module: a gradient is made by the autograd engine while some other
  module's backward runs, and optimizer state outside every module; a
  block's later tag beats an earlier one.

Without a tag, what a block is comes from its reason and category
(classify.py, categorize.py). Logs without module records give no rows.
The functions below the first are the steps both analyses share: a log
read whole (`modules`) and one read in pieces (stream_modules.py).
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
from .ranges import holders
from .reserve_terms import PIECE

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


def current_modules(alloc_i: np.ndarray, module_at: np.ndarray, module_ids: np.ndarray, before: int = 0) -> np.ndarray:
    """Per block (the index of its ALLOC, -1 before the log), the module current then: that of the last MODULE
    record before it (`module_at`: their indices, ascending; `module_ids`: their modules), else `before`."""
    k = np.searchsorted(module_at, alloc_i, side="right") - 1
    current = np.where(k >= 0, module_ids[np.maximum(k, 0)] if module_ids.size else 0, before)
    return np.where(alloc_i >= 0, current, 0).astype(np.int64)


def what_codes(category: np.ndarray, reason: np.ndarray, tag: np.ndarray) -> np.ndarray:
    """Per block, what it is to its module (an index into WHAT): its tag's role, else saved for backward by its
    reason, else by its category."""
    code = {w: k for k, w in enumerate(WHAT)}
    cat = np.array([code[_FROM_CATEGORY.get(c, OTHER)] for c in CATEGORIES], dtype=np.int64)
    what = cat[category.astype(np.int64)] if category.size else np.zeros(0, dtype=np.int64)
    what = np.where(reason == REASONS.index(Reason.SAVED_FOR_BACKWARD), code[SAVED], what)
    for role, name in _FROM_TAG.items():
        what = np.where(tag == role, code[name], what)
    return what


def named_peaks(peak_of: dict[int, int], phase_name: Any) -> dict[str, int]:
    """Per phase name, the event index of its peak (`peak_of`: per phase id; a later id of the same name wins)."""
    out: dict[str, int] = {}
    for p in sorted(peak_of):
        out[phase_name(p)] = peak_of[p]
    return out


def held_at(module: np.ndarray, what: np.ndarray, size: np.ndarray) -> tuple[dict[int, dict[str, int]], dict[int, int]]:
    """Of the blocks live at a moment (in the blocks' order): per module, the bytes per WHAT and the count."""
    held: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    count: dict[int, int] = defaultdict(int)
    for m, w, n in zip(module.tolist(), what.tolist(), size.tolist()):
        held[m][WHAT[w]] += n
        count[m] += 1
    return held, count


def add_phase(by_phase: dict[int, dict[str, int]], phase: str, module: np.ndarray, size: np.ndarray) -> None:
    """by_phase[module][phase] += the bytes of the blocks live at that phase's peak (`module`, `size`: theirs)."""
    ids, inverse = np.unique(module, return_inverse=True)  # ids are the writer's: maybe large
    totals = np.bincount(inverse.reshape(-1), weights=size.astype(np.float64), minlength=ids.size)
    for m, n in zip(ids.tolist(), totals.tolist()):
        if n:
            by_phase[m][phase] = int(n)


def module_rows(result: Modules, held: dict[int, dict[str, int]], count: dict[int, int],
                by_phase: dict[int, dict[str, int]]) -> list[ModuleRow]:
    """One row per module, the most bytes at the peak first (then at a phase's peak)."""
    def largest(m: int) -> tuple[int, int]:
        return (-sum(held[m].values()) if m in held else 0, -max(by_phase[m].values(), default=0))

    rows = []
    for m in sorted(set(held) | set(by_phase), key=largest):
        what = dict(sorted(((k, v) for k, v in held[m].items() if v), key=lambda kv: -kv[1])) if m in held else {}
        rows.append(ModuleRow(result.name(m), sum(what.values()), count.get(m, 0), what, by_phase.get(m, {})))
    return rows


# ---------------------------------------------------------------------------
# A whole log
# ---------------------------------------------------------------------------


def _current_module(d: Derived) -> np.ndarray:
    """Per block, the module current when it was allocated."""
    t, b = d.table, d.blocks
    at = np.flatnonzero(t.kind == MODULE)
    return current_modules(b.alloc_i, at, t.size[at].astype(np.int64))


def _apply_tags(d: Derived, module_of: np.ndarray, tag_of: np.ndarray) -> int:
    """Give each tagged block its tag's module and role; returns the tags no live block holds. The tags are
    looked up piece by piece among the blocks live in the piece, as a log read in pieces has them."""
    t, b = d.table, d.blocks
    tags = np.flatnonzero(t.kind == MODULE_TAG)
    if not tags.size or not len(b):
        return int(tags.size)
    matched = np.full(tags.size, -1, dtype=np.int64)
    for base in range(0, len(t), PIECE):
        lo, hi = np.searchsorted(tags, [base, base + PIECE])
        if lo == hi:
            continue
        live = np.flatnonzero((b.alloc_i < base + PIECE) & (b.free_i > base))
        got = holders(t.addr[tags[lo:hi]], tags[lo:hi], b.addr[live], b.block_size[live], b.alloc_i[live],
                      b.free_i[live])
        matched[lo:hi] = np.where(got >= 0, live[np.maximum(got, 0)], -1)
    for i, j in zip(tags.tolist(), matched.tolist()):  # in log order: a block's later tag wins
        if j >= 0:
            module_of[j] = int(t.size[i])
            tag_of[j] = int(t.flags[i])
    return int((matched < 0).sum())


def _phase_peaks(d: Derived) -> dict[str, int]:
    """Per phase that allocated or freed a block, the event index where allocated was highest while it was current."""
    t = d.table
    ev = np.flatnonzero((t.kind == ALLOC) | (t.kind == FREE))
    peak_of: dict[int, int] = {}
    for p in set(t.phase[ev].tolist()):
        mine = ev[t.phase[ev] == p]
        peak_of[p] = int(mine[np.argmax(d.allocated[mine])])
    return named_peaks(peak_of, d.phase_name)


def modules(d: Derived, peak_index: int) -> Modules:
    """Each block's module and what it is to it; per module path, the bytes held at the peak and each phase's peak."""
    t, b = d.table, d.blocks
    names = {int(t.size[i]): t.strings.get(int(t.stack[i]), f"module #{int(t.size[i])}")
             for i in np.flatnonzero(t.kind == MODULE_NAME).tolist()}
    module_of = _current_module(d)
    tag_of = np.zeros(len(b), dtype=np.int64)
    unmatched = _apply_tags(d, module_of, tag_of)
    what_of = what_codes(d.classified.category, d.classified.reason, tag_of)
    result = Modules(module_of, what_of, names, peak_index, {}, [], unmatched)
    if not names and not np.any(module_of):
        return result  # no module records: a log written without track()'s modules
    result.phase_peaks = _phase_peaks(d)
    live = d.live_at(peak_index)
    held, count = held_at(module_of[live], what_of[live], b.block_size[live])
    by_phase: dict[int, dict[str, int]] = defaultdict(dict)
    for phase, i in result.phase_peaks.items():
        at = d.live_at(i)
        add_phase(by_phase, phase, module_of[at], b.block_size[at])
    result.rows = module_rows(result, held, count, by_phase)
    return result
