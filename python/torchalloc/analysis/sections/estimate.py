"""The usual estimate, measured: params + optimizer state + max(grads + optimizer intermediates, activations).

`Estimate`: every term is the peak over time of the live bytes of its
categories (rules/categorize.py; `ESTIMATE_TERMS`), then the estimate
those terms add up to, the measured peak, and the categories live at the
peak, with its sentence (`estimate_sentence`). `EstimateFollower` follows
each term's live bytes as the second pass hands it the blocks, and keeps
their peak.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...log.chunks import ChunkedLog
from ...units import fmt_bytes
from ..passes.first import Scan
from ..passes.first_state import INT_MIN
from ..passes.follow import Blocks, Follower, FreedOrphans
from ..rules.categorize import CATEGORIES, CATEGORY_CODE, Category
from .section import Part, Section
from .views import Analyzed, SectionView, Table

# The estimate's terms (Estimate's fields), each the categories whose live bytes peak together.
ESTIMATE_TERMS: dict[str, tuple[Category, ...]] = {
    "parameters": (Category.PARAMETERS,),
    "gradients": (Category.GRADIENTS,),
    "optimizer_state": (Category.OPTIMIZER_STATE,),
    "optimizer_intermediates": (Category.OPTIMIZER_INTERMEDIATES,),
    "activations": (Category.ACTIVATIONS,),
    "gradients_plus_intermediates": (Category.GRADIENTS, Category.OPTIMIZER_INTERMEDIATES),
    "temporaries": (Category.TEMPORARIES, Category.BACKWARD_TEMPORARIES),
    "workspace": (Category.WORKSPACE,),
    "other": (Category.OTHER_PERSISTENT, Category.OTHER, Category.BEFORE_LOG),
}


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


class EstimateFollower(Follower):
    """Each term's live bytes, piece by piece, and their peak (module docstring)."""

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self.terms = {name: np.array([CATEGORY_CODE[c] for c in cats]) for name, cats in ESTIMATE_TERMS.items()}
        self.level = {name: self._initial(name) for name in ESTIMATE_TERMS}
        self.peak = {name: INT_MIN for name in ESTIMATE_TERMS}
        self.seen = np.zeros(len(CATEGORIES), dtype=bool)  # the categories some block had
        if len(scan.orphans["addr"]):
            self.seen[CATEGORY_CODE[Category.BEFORE_LOG]] = True
        self.orphans_freed = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))  # this piece's: (event, size)

    def _initial(self, name: str) -> int:
        """A term's level before the log's first event: the blocks from before the log, for the term that holds
        them."""
        return self.scan.initial if Category.BEFORE_LOG in ESTIMATE_TERMS[name] else 0

    def orphans_ended(self, freed: FreedOrphans) -> None:
        self.orphans_freed = (freed.free_i, self.scan.orphans["block_size"][freed.k])

    def step(self, bt: Blocks, nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        cat_new, cat_end = bt["category"][nc:], bt["category"][ended]
        self.seen[np.unique(cat_new)] = True
        arow, end_rows = bt["alloc_i"][nc:] - base, end_i - base
        bs_new, bs_end = bt["block_size"][nc:], bt["block_size"][ended]
        orow, o_size = self.orphans_freed[0] - base, self.orphans_freed[1]
        self.orphans_freed = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        for name, codes in self.terms.items():
            delta = np.zeros(m, dtype=np.int64)
            sel = np.isin(cat_new, codes)
            np.add.at(delta, arow[sel], bs_new[sel])
            sel = np.isin(cat_end, codes)
            np.subtract.at(delta, end_rows[sel], bs_end[sel])
            if CATEGORY_CODE[Category.BEFORE_LOG] in codes.tolist():
                np.subtract.at(delta, orow, o_size)
            level = self.level[name] + np.cumsum(delta)
            self.peak[name] = max(self.peak[name], int(level.max()))
            self.level[name] = int(level[-1])

    def peaks(self) -> dict[str, int]:
        """Each term's peak; 0 when no block had the term's categories, else at least its level at the start."""
        return {name: max(int(v), self._initial(name) if self.seen[self.terms[name]].any() else 0)
                for name, v in self.peak.items()}

def estimate_sentence(e: Estimate) -> str:
    """The estimate's formula with the measured terms, and how far the measured peak is from it."""
    P, O, GI, A, est, peak = (e.parameters, e.optimizer_state, e.gradients_plus_intermediates, e.activations,
                              e.estimate, e.measured_peak)
    gap = peak - est
    which = "gradients + optimizer intermediates" if GI >= A else "activations"
    sentence = (
        f"Estimate parameters + optimizer state + max(gradients + optimizer intermediates, activations) = "
        f"{fmt_bytes(P)} + {fmt_bytes(O)} + max({fmt_bytes(GI)}, {fmt_bytes(A)}) = {fmt_bytes(est)} "
        f"(the max is {which}); measured peak allocated {fmt_bytes(peak)}"
    )
    if peak:
        sentence += f", {'above' if gap >= 0 else 'below'} the estimate by {fmt_bytes(abs(gap))}"
        outside = {str(c) for c in (Category.TEMPORARIES, Category.BACKWARD_TEMPORARIES, Category.WORKSPACE,
                                    Category.OTHER_PERSISTENT, Category.OTHER, Category.BEFORE_LOG)}
        extra = {k: v for k, v in e.at_peak.items() if k in outside and v}
        if gap > 0 and extra:
            sentence += "; live at the peak and not in the estimate: " + ", ".join(
                f"{k} {fmt_bytes(v)}" for k, v in sorted(extra.items(), key=lambda kv: -kv[1]))
    return sentence + "."


def _rows(a: Any, follower: Follower | None) -> Estimate:
    """The estimate, for the analysis `a` (front.Analysis): the terms' peaks, and the categories live at the peak."""
    assert isinstance(follower, EstimateFollower)
    t = follower.peaks()
    P, G, O, I, A = (t["parameters"], t["gradients"], t["optimizer_state"], t["optimizer_intermediates"],
                     t["activations"])
    GI = t["gradients_plus_intermediates"]
    at_peak = a.anatomy("peak").by_category if a.scan.n else {}
    est = Estimate(P, G, O, I, A, GI, t["temporaries"], t["workspace"], t["other"], P + O + max(GI, A),
                   a.timeline.peak_allocated, at_peak, "")
    est.sentence = estimate_sentence(est)
    return est


def _follow(log: ChunkedLog, scan: Scan) -> EstimateFollower:
    return EstimateFollower(scan)


ESTIMATE = Part("estimate", _follow, _rows)


def _view(a: Analyzed, top: int) -> SectionView:
    est: Estimate = a.section_rows(ESTIMATE.key)
    table = Table(["term (peak live bytes)", "bytes"], [(term, fmt_bytes(n)) for term, n in est.rows()], right=(1,),
                  css="estimate")
    return SectionView(table, [est.sentence], est.to_dict())


SECTION = Section("estimate", "The usual estimate, measured", "", _view, ESTIMATE)
