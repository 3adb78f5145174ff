"""Phase summary: per phase, what it allocated and freed, and what stayed, was handed on, or was transient.

Takes a `Derived`; gives one `PhaseRow` per phase that allocated a block,
ran, or grew or shrank the reserved memory: allocated / freed / peak /
reserved growth, and its blocks split into persistent (live at the end),
handed on (outlived the occurrence that made them) and transient (freed
within it). The row's sentence is left empty: wording.phase_sentence writes
it. A phase that never began (the default phase, a log without phases) has
no occurrences: there, transient means freed while the same phase was
current.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np

from .._records import ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE
from ..units import fmt_bytes
from .blocks import NEVER
from .categorize import CATEGORIES
from .derived import Derived, bytes_by
from .roles import phase_role


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
        # A phase that never began (the default phase: outside every phase) has no occurrences to count.
        occurrences = self.occurrences if self.occurrences else "- (outside phases)"
        return (self.phase, occurrences, fmt_bytes(self.allocated), fmt_bytes(self.freed), fmt_bytes(self.peak),
                fmt_bytes(self.reserved_growth), fmt_bytes(self.persistent), fmt_bytes(self.handed_on),
                fmt_bytes(self.transient))


def phase_rows(d: Derived) -> list[PhaseRow]:
    """Per phase: allocated, freed, peak, reserved growth, persistent/handed on/transient (no sentence yet)."""
    t, b, c, occ = d.table, d.blocks, d.classified, d.occ
    n = len(t)
    rows = []
    is_segment = (t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE)
    phase_ids = sorted(set(b.alloc_phase[b.alloc_i >= 0].tolist()) | set(occ.phase.tolist())
                       | set(t.phase[is_segment].tolist()))
    seg_delta = np.where(t.kind == SEGMENT_ALLOC, t.size, np.where(t.kind == SEGMENT_FREE, -t.size, 0))
    for p in phase_ids:
        mine = (b.alloc_phase == p) & (b.alloc_i >= 0)
        occ_rows = np.flatnonzero(occ.phase == p)
        freed_here = (b.free_phase == p) & ~b.persistent
        ev = t.phase == p
        alloc_ev = ev & ((t.kind == ALLOC) | (t.kind == FREE) | is_segment)
        peak = int(d.allocated[alloc_ev].max()) if alloc_ev.any() else 0
        rises = []
        for r in occ_rows.tolist():
            lo, hi = int(occ.begin_i[r]), min(int(occ.end_i[r]), n - 1)
            rises.append(int(d.allocated[lo:hi + 1].max() - d.allocated[lo]))
        persistent = mine & b.persistent
        if occ_rows.size:
            transient = mine & ~b.persistent & (b.free_i < occ.end_of(c.alloc_occ, none=NEVER))
        else:
            transient = mine & ~b.persistent & (b.free_phase == p)
        handed = mine & ~b.persistent & ~transient
        by_cat = bytes_by(c.category[persistent], b.block_size[persistent], CATEGORIES)
        handed_to: dict[str, int] = defaultdict(int)
        for fp, s in zip(b.free_phase[handed].tolist(), b.block_size[handed].tolist()):
            handed_to[d.phase_name(fp)] += s
        first_occ = occ_rows[0] if occ_rows.size else -1
        if first_occ >= 0:
            first_persist = int(b.block_size[persistent & (c.alloc_occ == first_occ)].sum())
        else:
            first_persist = int(b.block_size[persistent].sum())
        rows.append(PhaseRow(
            phase=d.phase_name(p),
            role=phase_role(d.phase_name(p)),
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
        ))
    return rows
