"""Allocated and reserved bytes over time: the timeline the report draws.

Holds `Timeline`: the allocated and reserved bytes sampled for drawing
(every event when few; else per time bucket the highest and the last
event), allocated split by the phase that allocated each block, phase
spans, markers, OOMs and the peaks. The levels are running sums of the
blocks' and the segments' sizes. A log opened mid-run lacks the segments
made before it: reserved starts from the smallest level that keeps it at
or above allocated. The first pass computes the levels and picks the
samples (passes/first.py, first_state.Sampler), the second gives
allocated per phase at them (passes/second.py); `timeline_of` builds the
Timeline from both.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from .passes.first import Scan
from .passes.second import Passed
from .rules.sites import BEFORE_LOG

SPANS_KEPT = 100_000  # phase occurrences the timeline lists (about 6 MB of JSON)


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


def timeline_of(s: Scan, passed: Passed, base_ns: int, phase_name: Callable[[int], str], strings: Mapping[int, str],
                phase_names: Mapping[int, str]) -> Timeline:
    """The timeline of a log from its two passes; times in seconds from `base_ns` (the report's time zero)."""
    if not s.n:
        z = np.zeros(0)
        return Timeline(z, z.astype(np.int64), z.astype(np.int64), z.astype(np.int64), {}, [], [], 0.0, 0, 0, 0.0,
                        0, [], 0.0)

    def seconds(time_ns: int) -> float:
        return (int(time_ns) - base_ns) / 1e9

    t_s = (s.sample_ns - base_ns) / 1e9
    by_phase: dict[str, np.ndarray] = {}
    for p in sorted(passed.alloc_phases):
        curve = passed.by_phase.get(p, np.zeros(len(s.samples), dtype=np.int64))
        name = phase_name(p)
        by_phase[name] = by_phase.get(name, 0) + curve
    if passed.before_log is not None:
        by_phase[BEFORE_LOG.label] = passed.before_log
    spans = [(phase_name(int(p)), seconds(b), seconds(e)) for p, b, e in
             zip(s.occ_phase[:SPANS_KEPT].tolist(), s.occ_begin_ns[:SPANS_KEPT].tolist(),
                 s.occ_end_ns[:SPANS_KEPT].tolist())]
    markers = [(seconds(ns), strings.get(label, ""), phase_names.get(phase, "")) for _, label, phase, ns in s.markers]
    ooms = [(seconds(o["time_ns"]), o["size"]) for o in s.ooms]
    return Timeline(t_s=t_s, index=s.samples, allocated=s.sample_cum + s.initial, reserved=s.sample_raw + s.offset,
                    by_phase=by_phase, phase_spans=spans, markers=markers, peak_t=seconds(s.peak_ns),
                    peak_allocated=s.peak_cum + s.initial, peak_index=s.peak_i,
                    peak_reserved_t=seconds(s.rpeak_ns), peak_reserved=s.rpeak_raw + s.offset, ooms=ooms,
                    duration_s=seconds(s.last_ns))
