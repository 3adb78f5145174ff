"""Allocated and reserved bytes over time: the levels after every event, and the timeline to draw.

Takes the event table, the blocks and the phase occurrences; gives the
allocated and reserved bytes after every event (`levels`: numpy cumsums of
the blocks' and segments' sizes) and a `Timeline` sampled for drawing:
allocated split by the phase that allocated each block, phase spans,
markers, OOMs and the peaks. A log opened mid-run lacks the segments made
before it: reserved starts from the smallest level that keeps it at or
above allocated.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .._records import MARKER, OOM, SEGMENT_ALLOC, SEGMENT_FREE
from .blocks import Blocks, Occurrences
from .events import EventTable, time_base_ns
from .sites import BEFORE_LOG


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


def levels(t: EventTable, blocks: Blocks) -> tuple[np.ndarray, np.ndarray, int]:
    """Allocated and reserved bytes after every event, and the allocated bytes before the first."""
    n = len(t)
    delta = np.zeros(n, dtype=np.int64)
    known = blocks.alloc_i >= 0
    delta[blocks.alloc_i[known]] += blocks.block_size[known]
    freed = ~blocks.persistent
    delta[blocks.free_i[freed]] -= blocks.block_size[freed]
    initial = int(blocks.block_size[~known].sum())
    allocated = initial + np.cumsum(delta)
    seg = np.zeros(n, dtype=np.int64)
    seg[t.kind == SEGMENT_ALLOC] = t.size[t.kind == SEGMENT_ALLOC]
    seg[t.kind == SEGMENT_FREE] = -t.size[t.kind == SEGMENT_FREE]
    reserved = np.cumsum(seg)
    # A log opened mid-run does not know the segments made before it: the smallest initial
    # reserved that keeps reserved >= allocated and >= 0 throughout.
    if n:
        reserved += max(0, int(np.max(allocated - reserved)), int(-reserved.min()))
    return allocated, reserved, initial


def _sample(time_s: np.ndarray, values: np.ndarray, max_points: int, must: Sequence[int]) -> np.ndarray:
    """Event indices to draw: per time bucket the highest and the last event, plus `must`."""
    n = values.size
    if n <= max_points:
        return np.arange(n)
    span = float(time_s[-1] - time_s[0]) or 1.0
    buckets = max(1, max_points // 2)
    b = np.minimum(((time_s - time_s[0]) / span * buckets).astype(np.int64), buckets - 1)
    order = np.lexsort((values, b))  # by bucket, then value: the last of each bucket is its max
    last_of_bucket = np.flatnonzero(np.concatenate((b[order][1:] != b[order][:-1], [True])))
    highs = order[last_of_bucket]
    lasts = np.flatnonzero(np.concatenate((b[1:] != b[:-1], [True])))
    picks = np.concatenate((highs, lasts, [0, n - 1], np.asarray(must, dtype=np.int64)))
    return np.unique(picks[(picks >= 0) & (picks < n)])


def build_timeline(
    t: EventTable, blocks: Blocks, occ: Occurrences, allocated: np.ndarray, reserved: np.ndarray, max_points: int = 1500
) -> Timeline:
    """The timeline of `allocated` and `reserved` (levels()), at most about `max_points` samples."""
    n = len(t)
    time_s = (t.time_ns - time_base_ns(t)) / 1e9
    if n == 0:
        z = np.zeros(0)
        return Timeline(z, z.astype(np.int64), z.astype(np.int64), z.astype(np.int64), {}, [], [], 0.0, 0, 0, 0.0, 0, [],
                        0.0)
    peak_i = int(np.argmax(allocated))
    rpeak_i = int(np.argmax(reserved))
    idx = _sample(time_s, allocated, max_points, [peak_i, rpeak_i])
    by_phase: dict[str, np.ndarray] = {}
    known = blocks.alloc_i >= 0
    phases = sorted(set(blocks.alloc_phase[known].tolist()))
    for p in phases:
        delta = np.zeros(n, dtype=np.int64)
        sel = known & (blocks.alloc_phase == p)
        delta[blocks.alloc_i[sel]] += blocks.block_size[sel]
        fsel = sel & ~blocks.persistent
        delta[blocks.free_i[fsel]] -= blocks.block_size[fsel]
        curve = np.cumsum(delta)[idx]
        name = t.phase_names.get(int(p), f"phase {p}")
        by_phase[name] = by_phase.get(name, 0) + curve
    if (~known).any():
        delta = np.zeros(n, dtype=np.int64)
        pre = ~known & ~blocks.persistent
        delta[blocks.free_i[pre]] -= blocks.block_size[pre]
        by_phase[BEFORE_LOG.label] = int(blocks.block_size[~known].sum()) + np.cumsum(delta)[idx]
    spans = []
    for p, b, e in zip(occ.phase.tolist(), occ.begin_i.tolist(), occ.end_i.tolist()):
        spans.append((t.phase_names.get(p, f"phase {p}"), float(time_s[b]), float(time_s[min(e, n - 1)])))
    markers = [
        (float(time_s[i]), t.label(i), t.phase_names.get(int(t.phase[i]), ""))
        for i in np.flatnonzero(t.kind == MARKER).tolist()
    ]
    ooms = [(float(time_s[i]), int(t.size[i])) for i in np.flatnonzero(t.kind == OOM).tolist()]
    return Timeline(
        t_s=time_s[idx],
        index=idx,
        allocated=allocated[idx],
        reserved=reserved[idx],
        by_phase=by_phase,
        phase_spans=spans,
        markers=markers,
        peak_t=float(time_s[peak_i]),
        peak_allocated=int(allocated[peak_i]),
        peak_index=peak_i,
        peak_reserved_t=float(time_s[rpeak_i]),
        peak_reserved=int(reserved[rpeak_i]),
        ooms=ooms,
        duration_s=float(time_s[-1]),
    )
