"""Memory by module: which nn.Module each block belongs to, and what it is to it.

Holds `Modules`: one `ModuleRow` per module path with the bytes its blocks
hold at the peak, by what they are to it ("activations saved for
backward", "temporaries", "gradients", "parameters", "optimizer state",
"other"), and at each phase's own peak (the moment that phase's allocated
level was highest); and the steps stream_modules.py builds it with as the
second pass reads the log.

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
(rules/classify.py, rules/categorize.py). Logs without module records give no rows.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np

from .._records import TAG_GRADIENT, TAG_OPTIMIZER_STATE, TAG_PARAMETER
from .rules.categorize import CATEGORIES, Category
from .rules.classify import REASONS, Reason

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
    """The section: its rows, and the module names they use. Nothing per block: a block the page lists has its
    module in its details (passes/details.py)."""

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
