"""Allocated and reserved bytes over time: the timeline the report draws.

Holds `Timeline`: the allocated and reserved bytes sampled for drawing
(every event when few; else per time bucket the highest and the last
event), allocated split by the phase that allocated each block, phase
spans, markers, OOMs and the peaks. The levels are running sums of the
blocks' and the segments' sizes. A log opened mid-run lacks the segments
made before it: reserved starts from the smallest level that keeps it at
or above allocated. The first pass computes the levels and picks the
samples (passes/first.py, first_state.Sampler), the second gives
allocated per phase at them (passes/second.py); Analysis (result.py) builds
the Timeline.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np



@dataclasses.dataclass
class Timeline:
    """Allocated and reserved bytes over time, sampled for drawing (every event when few)."""

    t_s: np.ndarray  # seconds since the start of the log
    index: np.ndarray  # event index of each sample
    allocated: np.ndarray
    reserved: np.ndarray
    by_phase: dict[str, np.ndarray]  # allocated, split by the phase that allocated each block
    phase_spans: list[tuple[str, float, float]]
    markers: list[tuple[float, str, str]]  # (t_s, label, phase)
    peak_t: float
    peak_allocated: int
    peak_index: int
    peak_reserved_t: float
    peak_reserved: int
    ooms: list[tuple[float, int]]  # (t_s, requested)
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_s": _round_list(self.t_s),
            "allocated": self.allocated.tolist(),
            "reserved": self.reserved.tolist(),
            "by_phase": {k: v.tolist() for k, v in self.by_phase.items()},
            "phase_spans": [{"phase": n, "start_s": round(a, 6), "end_s": round(b, 6)} for n, a, b in self.phase_spans],
            "markers": [{"t_s": round(t, 6), "label": lab, "phase": ph} for t, lab, ph in self.markers],
            "peak": {"t_s": round(self.peak_t, 6), "allocated": self.peak_allocated},
            "peak_reserved": {"t_s": round(self.peak_reserved_t, 6), "reserved": self.peak_reserved},
            "ooms": [{"t_s": round(t, 6), "requested": s} for t, s in self.ooms],
            "duration_s": round(self.duration_s, 6),
        }


def _round_list(a: np.ndarray) -> list[float]:
    return [round(float(x), 6) for x in a]


