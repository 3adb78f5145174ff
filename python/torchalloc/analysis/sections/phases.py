"""Phases: per phase, what it allocated and freed, and what stayed, was handed on, or was transient.

One `PhaseRow` per phase that allocated a block, ran, or grew or shrank
the reserved memory: allocated / freed / peak / reserved growth, and its
blocks split into persistent (live at the end), handed on (outlived the
occurrence that made them) and transient (freed within it), with its
sentence (`phase_sentence`). A phase that never began (the default phase,
a log without phases) has no occurrences: there, transient means freed
while the same phase was current. The first pass finds each phase's peak,
rise and reserved growth (passes/first.py); `PhasesFollower` adds up, as
the second pass hands it the blocks, what each phase allocated, freed,
handed on and kept.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...log.chunks import ChunkedLog
from ...printable import printable
from ...units import fmt_bytes
from ..passes.first import Scan
from ..passes.first_state import INT_MAX, add_bytes, add_counted
from ..passes.follow import Blocks, Follower, FreedOrphans
from ..rules.blocks import BIT_WITHIN
from ..rules.categorize import CATEGORIES, CATEGORY_CODE, Category
from ..rules.roles import PHASE_IDS, phase_role
from ..rules.sites import BEFORE_LOG
from .section import Part, Section
from .views import Analyzed, SectionView, Table


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


class PhasesFollower(Follower):
    """The phase table's sums (module docstring): per allocating phase, by the blocks' ends."""

    def __init__(self, log: ChunkedLog, scan: Scan) -> None:
        self.scan = scan
        self.names = {k: printable(v) for k, v in log.phase_names.items()}  # shown escaped, as every report does
        self.has_occ = np.zeros(PHASE_IDS, dtype=bool)  # phases with occurrences (a phase_begin)
        self.has_occ[scan.occ_phase] = True
        self.first_occ: dict[int, int] = {}  # phase -> its first occurrence's row
        for row, p in enumerate(scan.occ_phase.tolist()):
            self.first_occ.setdefault(p, row)
        self.allocated: dict[int, list[int]] = {}  # phase -> [bytes, count]
        self.freed: dict[int, list[int]] = {}
        self.transient: dict[int, int] = {}
        self.handed: dict[int, int] = {}
        self.handed_to: dict[int, dict[str, list[int]]] = {}  # phase -> free phase name -> [bytes, first block]
        self.persistent: dict[int, int] = {}
        self.persistent_cat: dict[int, np.ndarray] = {}  # phase -> bytes per category
        self.first_occ_persistent: dict[int, int] = {}
        self.persistent_total = np.zeros(len(CATEGORIES), dtype=np.int64)  # bytes of persistent blocks per category

    def step(self, bt: Blocks, nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        add_counted(self.allocated, bt["phase"][nc:], bt["block_size"][nc:])

    def ended(self, bt: Blocks, ended: np.ndarray, ends: dict[str, np.ndarray]) -> None:
        """Freed within the occurrence that allocated them (transient), or later (handed on, to the freeing
        phase)."""
        size, alloc_phase, free_phase = bt["block_size"][ended], bt["phase"][ended], ends["free_phase"]
        bits = bt["bits"][ended].astype(np.uint8)
        add_counted(self.freed, free_phase, size)
        within = np.where(self.has_occ[alloc_phase], (bits & BIT_WITHIN) != 0, free_phase == alloc_phase)
        add_bytes(self.transient, alloc_phase[within], size[within])
        handed = ~within
        add_bytes(self.handed, alloc_phase[handed], size[handed])
        if handed.any():
            hp, hf = alloc_phase[handed], free_phase[handed]
            key = (hp << 17) | (hf + 1)
            uniq, inv = np.unique(key, return_inverse=True)
            inv = inv.reshape(-1)
            total = np.zeros(uniq.size, dtype=np.int64)
            np.add.at(total, inv, size[handed])
            first = np.full(uniq.size, INT_MAX, dtype=np.int64)
            np.minimum.at(first, inv, bt["ordinal"][ended][handed])
            for u, tot, fst in zip(uniq.tolist(), total.tolist(), first.tolist()):
                p, fp = u >> 17, (u & ((1 << 17) - 1)) - 1
                name = self.names.get(fp, f"phase {fp}") if fp >= 0 else BEFORE_LOG.label
                slot = self.handed_to.setdefault(p, {}).setdefault(name, [0, fst])
                slot[0] += tot
                slot[1] = min(slot[1], fst)

    def orphans_ended(self, freed: FreedOrphans) -> None:
        o = self.scan.orphans
        add_counted(self.freed, o["free_phase"][freed.k].astype(np.int64), o["block_size"][freed.k])

    def finish(self, bt: Blocks) -> None:
        """The blocks live at the end: persistent, per phase, per category and from each phase's first
        occurrence."""
        if not len(bt["ordinal"]):
            return
        np.add.at(self.persistent_total, bt["category"], bt["block_size"])
        phases, size, cat, occ = bt["phase"], bt["block_size"], bt["category"], bt["occ"]
        for p in np.unique(phases).tolist():
            sel = phases == p
            self.persistent[p] = int(size[sel].sum())
            self.persistent_cat[p] = np.bincount(cat[sel], weights=size[sel].astype(np.float64),
                                                 minlength=len(CATEGORIES))
            first = self.first_occ.get(p, -1)
            self.first_occ_persistent[p] = int(size[sel & (occ == first)].sum()) if first >= 0 else int(size[sel].sum())

def phase_sentence(row: PhaseRow, params: int) -> str:
    """The phase's row in words, `params` the parameters' bytes (live at the end, else their peak). E.g.
    "optimizer: reserved 6.3 GiB more; 4.2 GiB is optimizer state that stays (2.0 × parameters), 2.1 GiB
    transient"."""
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
        first = row.first_occurrence_persistent
        if row.occurrences > 1 and first and first >= row.persistent * 0.9:
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


def _rows(a: Any, follower: Follower | None) -> list[PhaseRow]:
    """The rows, for the analysis `a` (front.Analysis): every phase that allocated, ran or moved reserved."""
    assert isinstance(follower, PhasesFollower)
    s, f = a.scan, follower
    ids = sorted(set(f.allocated) | set(s.occ_phase.tolist()) | set(s.segment_phases))
    occurrences = {p: int(c) for p, c in zip(*np.unique(s.occ_phase, return_counts=True))} if s.occ_phase.size else {}
    # the parameters' bytes the sentences compare with: those live at the end, else their peak (the estimate's term)
    params = int(f.persistent_total[CATEGORY_CODE[Category.PARAMETERS]]) or a.estimate().parameters
    rows = []
    for p in ids:
        name = a.phase_name(p)
        allocated, count = f.allocated.get(p, [0, 0])
        freed, freed_count = f.freed.get(p, [0, 0])
        by_cat = f.persistent_cat.get(p)
        cats = {}
        if by_cat is not None:
            cats = {str(CATEGORIES[k]): int(v) for k, v in enumerate(by_cat.tolist()) if v}
            cats = dict(sorted(cats.items(), key=lambda kv: -kv[1]))
        handed_to = f.handed_to.get(p, {})
        handed = dict((k, v[0]) for k, v in sorted(handed_to.items(), key=lambda kv: (-kv[1][0], kv[1][1])))
        peak = s.phase_peak.get(p)
        row = PhaseRow(
            phase=name, role=phase_role(name), occurrences=occurrences.get(p, 0), allocated=allocated,
            allocated_count=count, freed=freed, freed_count=freed_count,
            peak=peak + s.initial if peak is not None else 0, peak_over_start=s.phase_rise.get(p, 0),
            reserved_growth=s.phase_growth.get(p, 0), persistent=f.persistent.get(p, 0),
            handed_on=f.handed.get(p, 0), transient=f.transient.get(p, 0), persistent_by_category=cats,
            handed_on_to=handed, first_occurrence_persistent=f.first_occ_persistent.get(p, 0), sentence="")
        row.sentence = phase_sentence(row, params)
        rows.append(row)
    return rows


PHASES = Part("phases", PhasesFollower, _rows)


def _view(a: Analyzed, top: int) -> SectionView | None:
    phases: list[PhaseRow] = a.section_rows(PHASES.key)
    if not phases:
        return None
    table = Table(["phase", "occurrences", "allocated", "freed", "peak", "reserved growth", "persistent", "handed on",
                   "transient"], [tuple(str(c) for c in p.cells()) for p in phases], right=range(1, 9), css="phases")
    return SectionView(table, [p.sentence for p in phases], [p.to_dict() for p in phases])


SECTION = Section("phases", "Phases", "", _view, PHASES)
