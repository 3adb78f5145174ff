"""Where a logged run's steps are, and what they say about the prediction's limits.

A step is what the user said it is: from one step marker to the next (the
markers of the kind the leak rule takes as steps: analysis.step_markers),
or, without step markers, from the end of one occurrence of the phase that
closes the loop to the end of the next -- the optimizer's when a phase's
name says optimizer (a training step), else backward's, else forward's (a
generation or evaluation loop); the first step runs from the log's start.
A log with neither marks no step: plan predicts from it and says it could
not tell. A log that marks steps but completes none -- cut inside its first
step -- has nothing to scale: plan refuses it.

Each complete step's peak of allocated bytes comes from the timeline's
samples (each the highest level of its stretch of events): steps that
peak apart drew their shapes per step, or their sizes hung on the data.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..analysis import Analysis, phase_role, step_markers
from .follow import Kinds

CLOSING_ROLES = ("optimizer", "backward", "forward")  # the phase that ends a step, the first one the log has
CUT_WRITERS = ("stopped early", "killed", "running")  # log.writer: the log may end inside a step


@dataclasses.dataclass
class Steps:
    """A run's steps (module docstring)."""

    by: str  # "markers 'step N'", "phase 'optimizer'", or "" when the log marks none
    bounds: list[tuple[int, int]]  # each complete step's (first, last) event index
    cut: str  # why the log may end inside a step ("" when it ended cleanly)
    peaks: list[int]  # each complete step's peak allocated (that has a sample)

    @property
    def complete(self) -> int:
        return len(self.bounds)

    @property
    def marked(self) -> bool:
        return bool(self.by)

    def spread(self) -> tuple[int, int, float] | None:
        """(lowest, highest, (highest - lowest) / highest) of the steps' peaks, the first step left out when there
        are three or more (it makes the optimizer's state, fills caches); None with fewer than two."""
        peaks = self.peaks[1:] if len(self.peaks) >= 3 else self.peaks
        if len(peaks) < 2 or max(peaks) <= 0:
            return None
        lo, hi = min(peaks), max(peaks)
        return lo, hi, (hi - lo) / hi


def steps_of(a: Analysis, kinds: Kinds) -> Steps:
    """The steps of an analysed run (module docstring)."""
    labels = [a.table.strings.get(int(s), "") for s in kinds.marker_label.tolist()]
    chosen = step_markers(labels)
    by, bounds = "", []
    if len(chosen) >= 2:
        at = kinds.marker_at[chosen]
        by = f"markers like '{labels[chosen[0]]}'"
        bounds = [(int(lo) + 1, int(hi)) for lo, hi in zip(at[:-1], at[1:])]
    else:
        roles = {int(p): phase_role(a.phase_name(int(p))) for p in np.unique(kinds.phase_id).tolist()}
        closing = next((r for r in CLOSING_ROLES if r in roles.values()), None)
        if closing is not None:
            ends = kinds.phase_at[~kinds.phase_begins & np.isin(kinds.phase_id, [p for p, r in roles.items()
                                                                                 if r == closing])]
            by = f"the end of each {closing} phase"
            starts = np.concatenate(([0], ends[:-1] + 1))
            bounds = [(int(lo), int(hi)) for lo, hi in zip(starts, ends)]
    writer = a.log.writer
    cut = f"its writer {writer}" if writer in CUT_WRITERS else ("cut short by log_max or a full disk"
                                                                if a.log.truncated else "")
    return Steps(by, bounds, cut, _peaks(a, bounds))


def _peaks(a: Analysis, bounds: list[tuple[int, int]]) -> list[int]:
    """Each step's highest sample of allocated (steps without a sample left out)."""
    index, allocated = a.timeline.index, a.timeline.allocated
    out = []
    for lo, hi in bounds:
        k0, k1 = np.searchsorted(index, lo, side="left"), np.searchsorted(index, hi, side="right")
        if k1 > k0:
            out.append(int(allocated[k0:k1].max()))
    return out
