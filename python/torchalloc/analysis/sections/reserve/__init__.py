"""Reserved memory: where the bytes reserved beyond the allocated ones go, and what each policy would reserve.

The second pass hands `ReserveFollower`, piece by piece, the piece's
records (segment records, ALLOCs) and its new and ended blocks; it feeds
them to terms.Terms, and keeps its sums at the timeline's samples (the
page's fragmentation band) and at the peaks of reserved and allocated,
where the pass keeps the blocks live (its Part asks for those moments;
each block with its segment). Gives `Reserve`, its rows built with
rows.py's functions, and their sentences.

The replays: as the pass reads the pieces, their replay events
(trace_stream.to_events, the events `torchalloc replay` feeds) go, after
those of the blocks from before the log, to one C replay per policy
(_lib.ReplayRun) on a thread of their own: the replays run beside the pass
and need no more reading of the log.

`RESERVE` is the section's part of the pass (section.Part), and
`SECTIONS` its two entries of sections.SECTIONS (the split of reserved at
the peaks; the replays), with their views.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Sequence

import numpy as np

from .... import _lib
from ...._records import ALLOC, FREE, PHASE_BEGIN, PHASE_END, SEGMENT_ALLOC, SEGMENT_EXPANDABLE
from ....log.chunks import ChunkedLog
from ....log.trace_events import EVENT_DTYPE
from ....log.trace_stream import to_events
from ....replay.engine import DEFAULT_POLICIES
from ....units import fmt_bytes
from ...passes.first import Scan, before_log_events
from ...passes.follow import Follower
from ...passes.pieces import device_pieces
from ...rules.blocks import BIT_PERSISTENT
from ...rules.categorize import CATEGORIES
from ..section import Part, Section
from ..views import Analyzed, SectionView, Table
from .rows import (Reserve, ReserveMoment, assembled, moment, pinned_lines, policy_name, replay_note, replay_rows,
                   replayed, reserve_sentences, setting_of)
from .terms import Terms, split

_REPLAYED = np.zeros(256, dtype=bool)  # the records a replay is fed (allocs, frees, phase begins and ends), by kind
_REPLAYED[[ALLOC, FREE, PHASE_BEGIN, PHASE_END]] = True


class ReserveFollower(Follower):
    """The reserve section's part of the second pass (module docstring). Per piece: `new_blocks`, then `step`;
    `at_moment` at the peaks; `finish` at the end of the log; then `reserve` once the analysis is built."""

    columns = {"seg": -1}  # the segment holding a block (its index in Terms; -1: none known)

    def __init__(self, log: ChunkedLog, scan: Scan) -> None:
        self.log, self.scan = log, scan
        self.moments = np.unique(np.array([scan.rpeak_i, scan.peak_i] if scan.n else [], dtype=np.int64))
        self.terms = Terms(self.moments)
        self.fragmented = np.zeros(scan.samples.size, dtype=np.int64)  # at the timeline's samples
        self.sums: dict[int, np.ndarray] = {}  # moment -> Terms' sums after it
        self.segs: dict[int, np.ndarray] = {}  # moment -> the segment of each block live then (the snapshot's order)
        self.policies = np.zeros(256, dtype=np.int64)  # allocations per policy id
        self.expandable = 0  # the flags of every expandable segment mapped, or-ed (0: none)
        self.replays = _Replays(before_log_events(scan)) if scan.n else None

    def new_blocks(self, t: Any, base: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The piece's records (from event `base`); the segment of each of its new blocks (at rows `rows`)."""
        kind = t.kind
        self.terms.segments(base, kind, t.addr, t.size, t.flags)
        self.policies += np.bincount(t.policy[kind == ALLOC], minlength=256)
        mapped = (kind == SEGMENT_ALLOC) & ((t.flags & SEGMENT_EXPANDABLE) != 0)
        if mapped.any():
            self.expandable |= int(np.bitwise_or.reduce(t.flags[mapped]))
        if self.replays is not None:
            self.replays.feed(t.records)
        return {"seg": self.terms.owners(t.addr[rows], base + rows)}

    def step(self, bt: dict[str, np.ndarray], nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        """The piece's blocks: the new ones (the table's rows from nc on) and those ended (rows `ended`, at
        events `end_i`); keeps the sums at the samples and the moments in the piece."""
        persistent = (self.scan.bits[bt["ordinal"][nc:]] & BIT_PERSISTENT) != 0
        sums = self.terms.step(base, m, (bt["seg"][nc:], bt["alloc_i"][nc:], bt["block_size"][nc:], persistent),
                               (bt["seg"][ended], end_i, bt["block_size"][ended]))
        samples = self.scan.samples
        here = np.flatnonzero((samples >= base) & (samples < base + m))
        self.fragmented[here] = sums[1, samples[here] - base] - sums[3, samples[here] - base]
        for i in self.moments[(self.moments >= base) & (self.moments < base + m)].tolist():
            self.sums[i] = sums[:, i - base].copy()

    def at_moment(self, i: int, bt: dict[str, np.ndarray], rows: np.ndarray, orphans: np.ndarray,
                  orphan_reasons: np.ndarray, t: Any, base: int) -> None:
        """At the peaks: each live block's segment, beside the pass' snapshot (blocks from before the log have
        none)."""
        if i in self.moments:
            self.segs[i] = np.concatenate((np.full(orphans.size, -1, dtype=np.int64), bt["seg"][rows]))

    def finish(self, bt: dict[str, np.ndarray]) -> None:
        if self.replays is not None:
            self.replays.done()

    # -- the section ---------------------------------------------------------------------------------
    def reserve(self, a: Any) -> Reserve:
        """The section, for the analysis `a` (its snapshots, levels and sites)."""
        s = self.scan
        if not s.n:
            return Reserve([], "caching", [], [])
        moments = [self._moment(a, s.rpeak_i, "peak reserved")]
        if s.peak_i != s.rpeak_i:
            moments.append(self._moment(a, s.peak_i, "peak allocated"))
        mine = policy_name(self.policies, self.expandable)

        def replay() -> tuple[str, list[Any]]:
            assert self.replays is not None
            names = replayed(mine)
            results = self.replays.results()
            if mine not in results:  # a policy outside DEFAULT_POLICIES recorded it: one more reading
                results[mine] = _replay_again(self.log, s, mine)
            return mine, replay_rows(mine, names, [results[p] for p in names])

        return assembled(moments, self.terms.count, mine, replay)

    def _moment(self, a: Any, i: int, at: str) -> ReserveMoment:
        segs = self.terms.at(i)
        sums = self.sums[i]
        reserved, allocated = a.reserved_at(i), a.allocated_at(i)
        fragmented, cached = int(sums[1] - sums[3]), int(sums[0])
        mapped_free, before_log = split(reserved, allocated, fragmented, cached, int(sums[2] - sums[4]))
        snap, seg = a.snapshot(i), self.segs[i]
        mine = np.flatnonzero(seg >= 0)
        site, phase, category = snap["site"][mine], snap["phase"][mine], snap["category"][mine]

        def describe(j: int) -> tuple[str, str, str, str]:
            where = a.site(int(site[j]))
            return where.label, where.location, a.phase_name(int(phase[j])), str(CATEGORIES[int(category[j])])

        live = {"owner": seg[mine], "block_size": snap["block_size"][mine], "addr": snap["addr"][mine],
                "alloc_t": snap["alloc_t"][mine]}
        terms = (reserved, allocated, fragmented, cached, mapped_free, before_log)
        return moment(at, i, a.time_s(i), a.passed.levels_at[i][2], terms, segs, live, describe)


class _Replays:
    """One C replay per policy of DEFAULT_POLICIES, fed the same events piece by piece on a thread of their own
    (ctypes releases the GIL: they run beside the pass; the thread also turns the pieces' records into events).
    An error (no library, events the replay refuses) is kept and raised when the results are asked for."""

    def __init__(self, head: np.ndarray) -> None:
        self.error: BaseException | None = None
        self.runs: dict[str, _lib.ReplayRun] = {}
        try:
            self.runs = {p: _lib.ReplayRun(p, 0) for p in DEFAULT_POLICIES}
        except (_lib.LibraryError, _lib.ReplayError) as e:
            self.error = e
        self.got: dict[str, dict[str, Any]] | None = None
        self.pieces: queue.Queue[np.ndarray | None] = queue.Queue(maxsize=4)
        self.pieces.put(head)  # the blocks from before the log come first (as events already)
        self.thread = threading.Thread(target=self._work, name="torchalloc-replays", daemon=True)
        self.thread.start()

    def feed(self, records: np.ndarray) -> None:
        """A piece of the device's records (RECORD_DTYPE, not changed after: the thread reads them later)."""
        if self.error is None and len(records):
            self.pieces.put(records)

    def done(self) -> None:
        self.pieces.put(None)

    def _work(self) -> None:
        stopped: set[str] = set()  # runs that met an OOM: later events are ignored
        while True:
            records = self.pieces.get()
            if records is None:
                return
            if self.error is not None:
                continue
            try:
                events = records if records.dtype == EVENT_DTYPE else to_events(records[_REPLAYED[records["kind"]]])
                if not len(events):
                    continue
                for name, run in self.runs.items():
                    if name not in stopped and run.feed(events.ctypes.data, len(events)):
                        stopped.add(name)
            except BaseException as e:  # kept for the results; the pass goes on
                self.error = e

    def results(self) -> dict[str, dict[str, Any]]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        if self.got is None:
            self.got = {name: run.end() for name, run in self.runs.items()}
        return dict(self.got)


def _replay_again(log: ChunkedLog, scan: Scan, policy: str) -> dict[str, Any]:
    """One more replay, under `policy`, reading the log again."""
    run = _lib.ReplayRun(policy, 0)
    head = before_log_events(scan)
    if not len(head) or not run.feed(head.ctypes.data, len(head)):
        for piece in device_pieces(log, scan.device):
            events = to_events(piece.table.records[_REPLAYED[piece.table.kind]])
            if len(events) and run.feed(events.ctypes.data, len(events)):
                break
    return run.end()


# -- the section: its rows, its part of the pass, its views ------------------------------------------------
def _rows(a: Any, follower: Follower | None) -> Reserve:
    """The section's rows and sentences, for the analysis `a` (front.Analysis)."""
    assert isinstance(follower, ReserveFollower)
    r = follower.reserve(a)
    r.sentences = reserve_sentences(r, a.timeline.peak_reserved)
    return r


def _moments(scan: Scan) -> Sequence[int]:
    return [scan.rpeak_i, scan.peak_i] if scan.n else []  # the peaks, where the blocks live are split by segment


# Reserved memory's part of the second pass: every log has one (the replays run on any log).
RESERVE = Part("reserve", ReserveFollower, _rows, moments=_moments)


def _view(a: Analyzed, top: int) -> SectionView | None:
    r: Reserve = a.section_rows(RESERVE.key)
    if not r.moments:
        return None
    optional = [(key, head) for key, head in (("mapped_free", "mapped free (expandable)"),
                                              ("before_log", "before the log"))
                if any(getattr(m, key) for m in r.moments)]
    headers = ["at", "reserved", "allocated", "fragmentation (free in segments with live blocks)",
               "cache (wholly free segments)", *[head for _, head in optional]]
    cells = [(m.at, fmt_bytes(m.reserved), fmt_bytes(m.allocated), fmt_bytes(m.fragmented), fmt_bytes(m.cached),
              *[fmt_bytes(getattr(m, key)) for key, _ in optional]) for m in r.moments]
    notes = [[line for p in m.pinned for line in pinned_lines(p)] for m in r.moments]
    table = Table(headers, cells, right=range(1, len(headers)), css="reserve", row_notes=notes)
    moments = [s for s in r.sentences if s.startswith("At the ")]
    return SectionView(table, moments, {"moments": [m.to_dict() for m in r.moments], "unknown": list(r.unknown)})


def _replays_view(a: Analyzed, top: int) -> SectionView | None:
    r: Reserve = a.section_rows(RESERVE.key)
    if not r.replays:
        return None
    base = r.replays[0]
    cells = [(x.policy, setting_of(x.policy), fmt_bytes(x.peak_reserved), fmt_bytes(x.peak_allocated),
              replay_note(x, base)) for x in r.replays]
    table = Table(["policy", "TORCHALLOC_CONF", "peak reserved", "peak allocated", "against the recording policy"],
                  cells, right=(2, 3),
                  css="reserve-replays")
    best = r.best
    return SectionView(table, [s for s in r.sentences if not s.startswith("At the ")],
                       {"recording_policy": r.recording_policy, "replays": [x.to_dict() for x in r.replays],
                        "best": best.policy if best else None})


SECTIONS = [
    Section("reserve", "Reserved memory: allocated, fragmentation and cache",
            "Reserved = allocated + free bytes in segments that hold live blocks + segments with no live block; "
            "under each moment, the segments with the most free bytes that live blocks pin.", _view, RESERVE),
    Section("reserve_replays", "What each policy would have reserved on the same events",
            "The whole run replayed on the simulated device with no memory limit.", _replays_view, RESERVE),
]
