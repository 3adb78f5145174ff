"""Out of memory: each OOM record of the log diagnosed, the last one replayed under every policy.

The section's follower keeps the segments live at each OOM record as the
second pass hands it the pieces (`OomsFollower`: the largest free range
at each failure needs them), and its Part asks the pass for the blocks
live at each failure. `Ooms` builds a row per record from them, the
verdict, the blocks to blame and the advice (diagnosis.py), and on demand
replays the run up to the last failure under every policy to check the
advice (diagnosis.replay_last).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...._records import SEGMENT_ALLOC, SEGMENT_FREE
from ....log.chunks import ChunkedLog
from ....units import fmt_bytes, fmt_seconds, fmt_time
from ...passes.first import Scan
from ...passes.follow import Blocks, Follower
from ..section import Part, Section
from ..views import Analyzed, CheckedLine, CheckedList, SectionView, Table
from .diagnosis import (Blocker, OomRow, blockers_of, handle_for, oom_detail, oom_explanation, oom_row, replay_last,
                        segment_gaps, trace_until)


class OomsFollower(Follower):
    """The segments live (address -> size) at each OOM record, moved on by each piece's segment records."""

    def __init__(self, scan: Scan) -> None:
        self.at = [int(o["index"]) for o in scan.ooms]  # the OOM records' events
        self.segs: dict[int, int] = {}  # the segments live after the pieces read
        self.at_ooms: dict[int, dict[int, int]] = {}  # OOM record's event -> the segments live then

    def piece(self, bt: Blocks, t: Any, base: int) -> None:
        rows = np.flatnonzero((t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE))
        for i in [x for x in self.at if base <= x < base + len(t)]:
            at = dict(self.segs)
            _apply(at, t, rows[rows <= i - base])
            self.at_ooms[i] = at
        _apply(self.segs, t, rows)


def _apply(segs: dict[int, int], t: Any, rows: np.ndarray) -> None:
    """The segment records at rows `rows` of piece t, in order, applied to `segs`."""
    for r in rows.tolist():
        if t.kind[r] == SEGMENT_ALLOC:
            segs[int(t.addr[r])] = int(t.size[r])
        else:
            segs.pop(int(t.addr[r]), None)


class Ooms:
    """The section's rows: each OOM record diagnosed (computed once), the last one also replayed under every
    policy when asked (`rows(check_alternatives=True)`; a job's summary names the verdicts only)."""

    def __init__(self, a: Any, follower: OomsFollower | None) -> None:
        self.a, self.follower = a, follower
        self._rows: list[OomRow] | None = None
        self._replayed = False

    def rows(self, check_alternatives: bool = True) -> list[OomRow]:
        a = self.a
        if self._rows is None:
            self._rows = [self._oom(o) for o in a.scan.ooms]
            for row in self._rows:
                row.explanation = oom_explanation(row)
        if check_alternatives and self._rows and not self._replayed:
            last = self._rows[-1]
            replay_last(last, lambda: trace_until(a.log, a.scan, a.table.path, last.index))
            last.explanation = oom_explanation(last)
            self._replayed = True
        return self._rows

    def _oom(self, o: dict[str, Any]) -> OomRow:
        a = self.a
        i = int(o["index"])
        snap = a.snapshot(i)
        segs = self.follower.at_ooms.get(i, {}) if self.follower is not None else {}
        largest, nseg, by_segment = segment_gaps(segs, np.arange(len(snap["k"])), snap["addr"], snap["block_size"])
        reserved = o["block_size"] or a.reserved_at(i)
        dev = o["device"]
        facts = None if dev is None else (dev["addr"], dev["size"], dev["stream"], dev["flags"])
        now = o["time_ns"]

        def blocker(j: int) -> Blocker:
            site = a.site(int(snap["site"][j]))
            age = (now - int(snap["alloc_t"][j])) / 1e9 if snap["phase"][j] >= 0 else -1.0
            return Blocker(int(snap["addr"][j]), int(snap["block_size"][j]), site.label, site.location,
                           a.phase_name(int(snap["phase"][j])), age)

        order = np.argsort(snap["k"], kind="stable")  # the snapshot is in blocks order already

        def pick(fragmentation: bool) -> list[Blocker]:
            return blockers_of(order.tolist(), by_segment if fragmentation else None,
                               lambda j: (-int(snap["block_size"][j]), int(snap["addr"][j])), blocker)

        policy, expandable = o["policy"], o["expandable"]

        def detail() -> dict[str, object]:
            return oom_detail(segs, snap["addr"], snap["block_size"], snap["phase"], o["phase"], policy, expandable,
                              handle_for(o["size"], dev["handle"] if dev is not None else 0))

        return oom_row(a.seconds(now), i, o["size"], o["stream"], a.phase_name(o["phase"]),
                       a.table.stack_of(o["stack"]), reserved, a.allocated_at(i), largest, nseg, o["addr"], facts,
                       a.has_stacks, pick, policy, expandable, detail, a.table.phase_names)


def _follow(log: ChunkedLog, scan: Scan) -> OomsFollower | None:
    return OomsFollower(scan) if scan.ooms else None  # no OOM record: nothing to follow


def _rows(a: Any, follower: Follower | None) -> Ooms:
    return Ooms(a, follower if isinstance(follower, OomsFollower) else None)


def _moments(scan: Scan) -> Sequence[int]:
    return [int(o["index"]) for o in scan.ooms]  # the blocks live at each failure


OOMS = Part("ooms", _follow, _rows, moments=_moments)


def _view(a: Analyzed, top: int) -> SectionView | None:
    ooms = a.section_rows(OOMS.key).rows()
    if not ooms:
        return None
    cells, notes = [], []
    for o in ooms:
        cells.append((fmt_time(o.t_s), o.phase, o.site, fmt_bytes(o.requested), fmt_bytes(o.allocated),
                      fmt_bytes(o.reserved), fmt_bytes(o.largest_free_range), o.verdict))
        device = (f"device {fmt_bytes(o.device_total)}, {fmt_bytes(o.device_free)} free; "
                  if o.device_total is not None else "")
        lines = [f"{device}verdict from {o.verdict_from}: {o.explanation}"]
        for blocker in o.blockers:
            age = fmt_seconds(blocker.age_s) if blocker.age_s >= 0 else "before the log"
            lines.append(f"  {fmt_bytes(blocker.size):>10}  {blocker.site}  phase {blocker.phase}, age {age}")
        notes.append(lines)
    table = Table(["time", "phase", "at", "asked", "allocated", "reserved", "largest free range", "verdict"], cells,
                  right=(3, 4, 5, 6), css="ooms", row_notes=notes)
    lists = [CheckedList(f"Advice for OOM {k + 1}, each line checked by replaying the run up to it",
                         [CheckedLine(int(line.number), line.text, line.check,
                                      "unchecked" if line.confirmed is None else "confirmed" if line.confirmed
                                      else "refuted") for line in o.advice], css="advice")
             for k, o in enumerate(ooms) if o.advice]
    return SectionView(table, [], [o.to_dict() for o in ooms], lists)


SECTION = Section("ooms", "Out of memory", "", _view, OOMS)
