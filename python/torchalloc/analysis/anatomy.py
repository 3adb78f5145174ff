"""Peak anatomy: the blocks live at one moment, grouped by allocation site and phase, largest first.

Takes a `Derived` and a moment -- "peak" (default), "peak_reserved", "end",
"oom", a marker label or a time in seconds -- and gives an `Anatomy`: the
allocated and reserved bytes then, one `AnatomyRow` per (site, phase,
reason, category) group of live blocks, and the live bytes by category and by phase.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from .._records import MARKER, OOM
from .categorize import CATEGORIES
from .classify import REASONS
from .derived import Derived, bytes_by, dominant
from .events import time_base_ns

# The marker labels whose anatomy the JSON report carries (the first ones), for a log read whole and one read in
# pieces (streamed.py) alike: one 'step N' marker per step gives a label per step, and each anatomy is a pass
# over the blocks, so without a cap `report --json` grew with steps times blocks.
MARKER_ANATOMIES = 1000
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


def index_at(d: Derived, at: str | float | int | None = None) -> tuple[int, str]:
    """The event index for "peak" (default), "peak_reserved", "end", "oom", a marker label, or a time in seconds,
    and how to name that moment. ValueError for a marker the log does not have."""
    t = d.table
    n = len(t)
    if n == 0:
        return 0, "empty log"
    if at is None or at == "peak":
        return d.timeline.peak_index, "peak"
    if at == "peak_reserved":
        return int(np.argmax(d.reserved)), "peak reserved"
    if at == "end":
        return n - 1, "end"
    if at == "oom":
        ooms = np.flatnonzero(t.kind == OOM)
        if not ooms.size:
            raise ValueError("the log has no OOM record")
        return int(ooms[0]), "OOM"
    if isinstance(at, str):
        first = marker_first(d)
        if at in first:
            return first[at], f"marker '{at}'"
        try:
            at = float(at.rstrip("s"))
        except ValueError:
            raise ValueError(f"no marker {at!r}; markers: {some_labels(first)}; or give a time in seconds") from None
    target = float(at)
    rel = (t.time_ns - time_base_ns(t)) / 1e9
    end = max(float(rel[-1]), 0.0)
    # A time outside the log was once clamped to its first or last event, and nan or inf passed as
    # "t=nans": say what the log covers instead.
    if not math.isfinite(target) or not 0.0 <= target <= end:
        raise ValueError(f"t={target:g} s is not in this log: it covers t=0 s to t={end:.9g} s (seconds since "
                         "it was opened); give a time in that range, or a marker")
    i = int(np.searchsorted(rel, target, side="right")) - 1
    return max(0, min(i, n - 1)), f"t={target:g}s"


def marker_first(d: Derived) -> dict[str, int]:
    """Each marker text -> the index of its first marker, in the order the texts first appear; computed once per
    `d`. Looking a label up used to scan every marker, so the JSON report (an anatomy per label) was quadratic
    in the markers of a log."""
    cached = d.__dict__.get("_marker_first")
    if cached is None:
        t = d.table
        marks = np.flatnonzero(t.kind == MARKER)
        ids = t.stack[marks]
        _, first = np.unique(ids, return_index=True)  # the first marker of each string id
        cached = {}
        for i in sorted(marks[first].tolist()):  # by index: two ids may hold one text, the earlier one wins
            cached.setdefault(t.label(i), i)
        d.__dict__["_marker_first"] = cached
    return cached


def marker_labels(d: Derived) -> list[str]:
    """The marker texts whose anatomy the JSON report carries: the first MARKER_ANATOMIES, in order of appearance."""
    return list(marker_first(d))[:MARKER_ANATOMIES]


def some_labels(labels: Iterable[str]) -> str:
    """The labels for an error message, sorted: the first LABELS_NAMED and how many more (the message is one line)."""
    ordered = sorted(set(labels))
    shown = ", ".join(ordered[:LABELS_NAMED]) or "none"
    return shown + (f" and {len(ordered) - LABELS_NAMED} more" if len(ordered) > LABELS_NAMED else "")


def anatomy(d: Derived, at: str | float | int | None = None, top: int | None = None) -> Anatomy:
    """What was live at `at` (see index_at), the `top` largest groups (all without top)."""
    i, label = index_at(d, at)
    live = d.live_at(i)
    c, b = d.classified, d.blocks
    # one row per (site, phase, reason, category): a row names one category, and its count is that category's
    groups: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    for k, s, p, r, g in zip(live.tolist(), c.site[live].tolist(), b.alloc_phase[live].tolist(),
                             c.reason[live].tolist(), c.category[live].tolist()):
        groups[(s, p, r, g)].append(k)
    rows = []
    for (s, p, _r, _g), members in groups.items():
        m = np.array(members)
        size = b.block_size[m]
        cat = dominant(c.category[m], size, CATEGORIES)
        reason = dominant(c.reason[m], size, REASONS)
        rows.append(AnatomyRow(d.sites[s].label, d.sites[s].location, d.phase_name(p), str(cat), str(reason),
                               int(m.size), int(size.sum()), int(b.size[m].sum())))
    rows.sort(key=lambda r: (-r.bytes, r.site))
    by_cat = bytes_by(c.category[live], b.block_size[live], CATEGORIES)
    by_phase: dict[str, int] = defaultdict(int)
    for p, s in zip(b.alloc_phase[live].tolist(), b.block_size[live].tolist()):
        by_phase[d.phase_name(p)] += s
    n = len(d.table)
    return Anatomy(label, i, d.time_s(i), int(d.allocated[i]) if n else 0, int(d.reserved[i]) if n else 0,
                   rows[:top] if top else rows, by_cat, dict(sorted(by_phase.items(), key=lambda kv: -kv[1])))
