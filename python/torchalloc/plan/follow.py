"""What `torchalloc plan` takes from the analysis' second pass: every block's category, site and phase, in the
order the blocks were allocated, and the markers and phase records that say where the steps are.

`BlockKinds` is a follower of the pass (analysis.Follower: analyze(log, followers=[...]) feeds it beside the
report's sections): it adds no column to the pass' block table, it only reads the new blocks of each piece once
their category is set. Per block it keeps 17 bytes (category, site, phase, requested size); per marker and phase
record, its event index. Given `events`, it also gathers the run's trace from the same records (gather.py):
`torchalloc report` predicts without reading the log again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .._records import MARKER, PHASE_BEGIN, PHASE_END
from ..analysis import Blocks, Follower
from .gather import TraceGather


@dataclasses.dataclass
class Kinds:
    """What BlockKinds gathered, in the order of the analysis' device table (its event indices)."""

    category: np.ndarray  # int8: each block's category code (analysis.CATEGORIES), by allocation order
    site: np.ndarray  # int32: the pass' site id of each block (Analysis.site maps it to the report's Site)
    phase: np.ndarray  # int32: the phase of each block's allocation
    size: np.ndarray  # int64: the bytes each block requested
    marker_at: np.ndarray  # int64: each marker's event index
    marker_label: np.ndarray  # int64: each marker's label (a string id of the log)
    phase_at: np.ndarray  # int64: each phase begin or end record's event index
    phase_id: np.ndarray  # int32: its phase
    phase_begins: np.ndarray  # bool: a begin (else an end)


class BlockKinds(Follower):
    """A follower of the second pass gathering `Kinds` (module docstring)."""

    def __init__(self, events: int = 0) -> None:
        """`events`: gather the run's trace too, when the log has at most that many device records (0: never)."""
        self.gather = TraceGather(events) if events else None
        self._blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._markers: list[tuple[np.ndarray, np.ndarray]] = []
        self._phases: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.kinds: Kinds | None = None

    def new_blocks(self, t: Any, base: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        if self.gather is not None:
            self.gather.piece(t.records, base)
        kind = t.kind
        marks = np.flatnonzero(kind == MARKER)
        if marks.size:
            self._markers.append((base + marks, t.stack[marks].astype(np.int64)))
        phases = np.flatnonzero((kind == PHASE_BEGIN) | (kind == PHASE_END))
        if phases.size:
            self._phases.append((base + phases, t.phase[phases].astype(np.int32), kind[phases] == PHASE_BEGIN))
        return {}

    def step(self, bt: Blocks, nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        self._blocks.append((bt["category"][nc:].astype(np.int8), bt["site"][nc:].astype(np.int32),
                             bt["phase"][nc:].astype(np.int32), bt["size"][nc:].astype(np.int64)))

    def finish(self, bt: Blocks) -> None:
        def joined(parts: Sequence[tuple[np.ndarray, ...]], k: int, dtype: Any) -> np.ndarray:
            return np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, dtype=dtype)

        b, mk, ph = self._blocks, self._markers, self._phases
        self.kinds = Kinds(joined(b, 0, np.int8), joined(b, 1, np.int32), joined(b, 2, np.int32),
                           joined(b, 3, np.int64), joined(mk, 0, np.int64), joined(mk, 1, np.int64),
                           joined(ph, 0, np.int64), joined(ph, 1, np.int32), joined(ph, 2, bool))
        self._blocks, self._markers, self._phases = [], [], []
