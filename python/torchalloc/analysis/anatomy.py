"""Peak anatomy: the blocks live at one moment, grouped by allocation site and phase, largest first.

Holds the row types -- an `Anatomy`: the allocated and reserved bytes at
one moment, one `AnatomyRow` per (site, phase, reason, category) group of
the blocks live then, and the live bytes by category and by phase -- and
what builds them: `anatomy_of` groups the blocks the second pass kept live
at the moment (passes/second.py), `bytes_by` and `dominant` give a row's
category and reason (the one holding most of its bytes), `some_labels`
the marker labels named in an error. Analysis.anatomy (front.py) takes
the moment -- "peak" (default), "peak_reserved", "end", "oom", a marker
label or a time in seconds.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .rules.categorize import CATEGORIES
from .rules.classify import REASONS
from .rules.sites import Site

LABELS_NAMED = 20  # marker labels an error names (the first ones, sorted): a log can hold 10^5 of them


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


def some_labels(labels: Iterable[str]) -> str:
    """The labels for an error message, sorted: the first LABELS_NAMED and how many more (the message is one line)."""
    ordered = sorted(set(labels))
    shown = ", ".join(ordered[:LABELS_NAMED]) or "none"
    return shown + (f" and {len(ordered) - LABELS_NAMED} more" if len(ordered) > LABELS_NAMED else "")


def bytes_by(codes: np.ndarray, weights: np.ndarray, names: Sequence[Any]) -> dict[str, int]:
    """Total weight per code, named by `names` (REASONS, CATEGORIES), largest first; zero totals left out."""
    totals = np.bincount(codes.astype(np.int64), weights=weights.astype(np.float64), minlength=len(names))
    out = {str(names[k]): int(v) for k, v in enumerate(totals.tolist()) if v}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def dominant(codes: np.ndarray, weights: np.ndarray, names: Sequence[Any]) -> Any:
    """The name of the code with the largest total weight (a row's category and reason)."""
    totals = np.bincount(codes.astype(np.int64), weights=weights.astype(np.float64), minlength=len(names))
    return names[int(np.argmax(totals))]


def anatomy_of(at: str, i: int, t_s: float, allocated: int, reserved: int, snap: dict[str, np.ndarray],
               reason: np.ndarray, site: Callable[[int], Site], phase_name: Callable[[int], str],
               top: int | None) -> Anatomy:
    """The anatomy at moment i from the blocks live then (`snap`, the second pass' columns; `reason`: each one's
    reason, known once it ended): one row per (site, phase, reason, category), the largest `top` first."""
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for j, key in enumerate(zip(snap["site"].tolist(), snap["phase"].tolist(), reason.tolist(),
                                snap["category"].tolist())):
        groups.setdefault(key, []).append(j)
    rows = []
    for (s_, p, _r, _g), members in groups.items():
        m = np.array(members)
        size = snap["block_size"][m]
        cat = dominant(snap["category"][m], size, CATEGORIES)
        why = dominant(reason[m], size, REASONS)
        where = site(s_)
        rows.append(AnatomyRow(where.label, where.location, phase_name(p), str(cat), str(why), int(m.size),
                               int(size.sum()), int(snap["size"][m].sum())))
    rows.sort(key=lambda r: (-r.bytes, r.site))
    by_cat = bytes_by(snap["category"], snap["block_size"], CATEGORIES)
    by_phase: dict[str, int] = {}
    for p, sz in zip(snap["phase"].tolist(), snap["block_size"].tolist()):
        name = phase_name(p)
        by_phase[name] = by_phase.get(name, 0) + sz
    return Anatomy(at, i, t_s, allocated, reserved, rows[:top] if top else rows, by_cat,
                   dict(sorted(by_phase.items(), key=lambda kv: -kv[1])))
