"""The usual estimate, measured: params + optimizer state + max(grads + optimizer intermediates, activations).

Takes a `Derived`; gives an `Estimate` whose every term is the peak over
time of the live bytes of its categories (categorize.py), the estimate
those terms add up to, the measured peak, and the categories live at the
peak. Its sentence is left empty: wording.estimate_sentence writes it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .anatomy import anatomy
from .categorize import CATEGORY_CODE, Category
from .derived import Derived


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


def category_peak(d: Derived, categories: Sequence[Category]) -> int:
    """Peak over time of the live bytes of the given categories together."""
    b = d.blocks
    sel = np.isin(d.classified.category, [CATEGORY_CODE[x] for x in categories])
    n = len(d.table)
    if not sel.any() or n == 0:
        return 0
    delta = np.zeros(n, dtype=np.int64)
    known = sel & (b.alloc_i >= 0)
    delta[b.alloc_i[known]] += b.block_size[known]
    fr = sel & ~b.persistent
    delta[b.free_i[fr]] -= b.block_size[fr]
    initial = int(b.block_size[sel & (b.alloc_i < 0)].sum())
    return int(max(initial, (initial + np.cumsum(delta)).max()))


def category_total(d: Derived, category: Category) -> int:
    """The bytes of a category still live at the end, or, when none is, its peak."""
    sel = d.classified.category == CATEGORY_CODE[category]
    return int(d.blocks.block_size[sel & d.blocks.persistent].sum()) or int(category_peak(d, [category]))


def estimate(d: Derived) -> Estimate:
    """Every term of the estimate, measured (no sentence yet)."""
    P = category_peak(d, [Category.PARAMETERS])
    G = category_peak(d, [Category.GRADIENTS])
    O = category_peak(d, [Category.OPTIMIZER_STATE])
    I = category_peak(d, [Category.OPTIMIZER_INTERMEDIATES])
    A = category_peak(d, [Category.ACTIVATIONS])
    GI = category_peak(d, [Category.GRADIENTS, Category.OPTIMIZER_INTERMEDIATES])
    T = category_peak(d, [Category.TEMPORARIES, Category.BACKWARD_TEMPORARIES])
    W = category_peak(d, [Category.WORKSPACE])
    other = category_peak(d, [Category.OTHER_PERSISTENT, Category.OTHER, Category.BEFORE_LOG])
    at_peak = anatomy(d, "peak").by_category if len(d.table) else {}
    return Estimate(P, G, O, I, A, GI, T, W, other, P + O + max(GI, A), d.timeline.peak_allocated, at_peak, "")
