"""A torchalloc event log as a `Trace`: one device's allocs and frees, the phases, the recorded reserved curve.

    from torchalloc.log.trace_stream import load_log
    trace = load_log("run.talog")                # trace.events, or trace.chunks for a long log
    for piece in trace.chunks.pieces(): ...      # EVENT_DTYPE arrays, in order

Every log, of any size, is read the same way: in pieces (log/chunks.py; a
small log is one piece), twice: once to pick the device (the one with the
most allocations and frees), once to build the events piece by piece, with
what the log says about them: frees of blocks allocated before the log
(with ``prelude``, reconstructed as allocations at the start from the free
records' sizes), addresses allocated again while live, the live peaks, the
recording policy's reserved curve, the notes. The events are kept
(`SpilledEvents`) in memory when few -- then they are `trace.events` --
else in a temporary file of 32 bytes per event that each replay reads back
in pieces (`trace.chunks`): a log is decoded once however many replays the
search for the smallest capacity makes.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Iterable, Iterator

import numpy as np

from .. import _records as records
from ..printable import printable
from .format import LogFormatError
from .chunks import DEFAULT_CHUNK_RECORDS, ChunkedLog
from .trace_events import ALLOC, EVENT_DTYPE, FREE, MAX_PHASES, MAX_REQUEST, Trace, TraceError

__all__ = ["SpilledEvents", "load_log", "log_events", "IN_MEMORY_EVENTS"]

IN_MEMORY_EVENTS = 1 << 22  # up to 128 MiB of events stay in memory; more go to a temporary file
PIECE_EVENTS = 1 << 20  # events per piece read back

_LOG_TO_EVENT = np.zeros(256, dtype=np.uint8)
_LOG_TO_EVENT[[records.ALLOC, records.FREE, records.PHASE_BEGIN, records.PHASE_END]] = [1, 2, 3, 4]


class SpilledEvents:
    """Replay events written once, read back in pieces as often as asked: in memory up to `IN_MEMORY_EVENTS`,
    past that in a temporary file (deleted by close(), or when the object goes)."""

    def __init__(self, pieces: Iterable[np.ndarray], *, head: np.ndarray | None = None,
                 tail: np.ndarray | None = None, directory: str | None = None) -> None:
        self.head = head if head is not None else np.zeros(0, dtype=EVENT_DTYPE)
        self.tail = tail if tail is not None else np.zeros(0, dtype=EVENT_DTYPE)
        self._memory: list[np.ndarray] = []
        self._file: Any = None
        self.path: str | None = None
        self.body = 0
        self.allocs = int((self.head["kind"] == ALLOC).sum() + (self.tail["kind"] == ALLOC).sum())
        for piece in pieces:
            if not len(piece):
                continue
            self.allocs += int((piece["kind"] == ALLOC).sum())
            if self._file is None and self.body + len(piece) > IN_MEMORY_EVENTS:
                self._spill(directory)
            if self._file is not None:
                piece.tofile(self._file)
            else:
                self._memory.append(piece.copy())
            self.body += len(piece)
        if self._file is not None:
            self._file.flush()

    def _spill(self, directory: str | None) -> None:
        where = directory or tempfile.gettempdir()
        need = (self.body + IN_MEMORY_EVENTS) * EVENT_DTYPE.itemsize
        if shutil.disk_usage(where).free < need:
            raise TraceError(f"the trace's events do not fit in memory and {where} has less than "
                             f"{need >> 20} MiB free for them (set TMPDIR to a larger disk)")
        fd, self.path = tempfile.mkstemp(prefix="torchalloc-events-", suffix=".bin", dir=where)
        self._file = os.fdopen(fd, "w+b")
        for part in self._memory:
            part.tofile(self._file)
        self._memory = []

    def __len__(self) -> int:
        return len(self.head) + self.body + len(self.tail)

    def pieces(self, size: int = PIECE_EVENTS) -> Iterator[np.ndarray]:
        """The events in order, at most `size` per piece (each a fresh array)."""
        if len(self.head):
            yield self.head
        if self._file is not None:
            with open(self.path, "rb") as f:  # type: ignore[arg-type]
                while True:
                    part = np.fromfile(f, dtype=EVENT_DTYPE, count=size)
                    if not len(part):
                        break
                    yield part
        else:
            yield from self._memory
        if len(self.tail):
            yield self.tail

    def array(self) -> np.ndarray:
        """All of them at once (for a trace small enough), in EVENT_DTYPE (np.concatenate may drop its padding)."""
        out = np.zeros(len(self), dtype=EVENT_DTYPE)
        at = 0
        for piece in self.pieces():
            out[at: at + len(piece)] = piece
            at += len(piece)
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None

    def __del__(self) -> None:
        self.close()


def to_events(rows: np.ndarray) -> np.ndarray:
    """Log records (RECORD_DTYPE: allocs, frees, phase begins and ends) as replay events."""
    events = np.zeros(len(rows), dtype=EVENT_DTYPE)
    events["kind"] = _LOG_TO_EVENT[rows["kind"]]
    events["addr"] = np.where(events["kind"] <= FREE, rows["addr"], 0)
    events["size"] = np.where(events["kind"] == ALLOC, rows["size"], 0)
    events["stream"] = rows["stream"]
    events["phase"] = rows["phase"]
    return events


def log_events(log: ChunkedLog, device: int, *, upto: int | None = None, what: str = "log") -> Iterator[np.ndarray]:
    """The device's replay events piece by piece (its allocs and frees, every phase begin and end); with `upto`,
    only those among the first `upto` rows of the device table (records about the device or about none)."""
    for _, _, events in _device_pieces(log, device, upto=upto, what=what):
        yield events


def _device_pieces(log: ChunkedLog, device: int, *, upto: int | None = None,
                   what: str = "log") -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """log_events' pieces with what they were made of: (the piece's log records, the mask of those that are
    events, the events)."""
    seen = 0
    for _, recs in log.chunks():
        if upto is not None:
            dev = recs["device"]
            in_table = np.flatnonzero((dev == device) | (dev < 0))
            if seen >= upto:
                continue
            take = in_table[: upto - seen]
            seen += in_table.size
            recs = recs[: int(take[-1]) + 1] if take.size else recs[:0]
        kind = recs["kind"]
        sel = (((kind == records.ALLOC) | (kind == records.FREE)) & (recs["device"] == device)) | \
              (kind == records.PHASE_BEGIN) | (kind == records.PHASE_END)
        rows = recs[sel]
        if (rows["phase"] >= MAX_PHASES).any():
            raise TraceError(f"{what}: phase ids above {MAX_PHASES - 1}: not a log this version wrote")
        events = to_events(rows)
        if (events["size"] > MAX_REQUEST).any():
            raise TraceError(f"{what}: an allocation of more than {MAX_REQUEST} bytes: damaged log")
        yield recs, sel, events


class LivePeaks:
    """The trace's live addresses piece by piece, as trace_events._live_deltas counts them."""

    def __init__(self) -> None:
        self.addr = np.zeros(0, dtype=np.uint64)
        self.req = np.zeros(0, dtype=np.int64)
        self.rounded = np.zeros(0, dtype=np.int64)
        self.seen = np.zeros(0, dtype=np.uint64)  # every address an alloc (size > 0) or free ever named
        self.level = np.zeros(2, dtype=np.int64)
        self.peak = np.zeros(2, dtype=np.int64)
        self.unknown = 0
        self.replaced = 0

    def piece(self, events: np.ndarray) -> np.ndarray:
        """Account for `events`; returns the mask of frees that are the first event on their address."""
        kind, size = events["kind"], events["size"].astype(np.int64)
        rel = np.flatnonzero(((kind == ALLOC) & (events["size"] > 0)) | (kind == FREE))
        nc = self.addr.size
        addr = np.concatenate((self.addr, events["addr"][rel]))
        is_alloc = np.concatenate((np.ones(nc, dtype=bool), kind[rel] == ALLOC))
        amount = np.stack((np.concatenate((self.req, size[rel])),
                           np.concatenate((self.rounded, np.maximum((size[rel] + 511) // 512 * 512, 512)))))
        order = np.argsort(addr, kind="stable")
        same_prev = np.zeros(order.size, dtype=bool)
        same_prev[1:] = addr[order[1:]] == addr[order[:-1]]
        prev_alloc = np.zeros(order.size, dtype=bool)
        prev_alloc[1:] = same_prev[1:] & is_alloc[order[:-1]]
        delta = np.zeros((2, order.size), dtype=np.int64)
        delta[:, is_alloc[order]] += amount[:, order][:, is_alloc[order]]
        closes = prev_alloc
        delta[:, closes] -= amount[:, order[np.flatnonzero(closes) - 1]]
        frees = ~is_alloc[order]
        self.unknown += int((frees & ~prev_alloc).sum())
        self.replaced += int((is_alloc[order] & prev_alloc & (order >= nc)).sum())
        # levels in event order (the carried allocs changed nothing now: their amounts are already counted)
        per_event = np.zeros((2, events.size), dtype=np.int64)
        pos = order >= nc
        np.add.at(per_event, (slice(None), rel[order[pos] - nc]), delta[:, pos])
        levels = self.level[:, None] + np.cumsum(per_event, axis=1)
        if events.size:
            self.peak = np.maximum(self.peak, levels.max(axis=1))
            self.level = levels[:, -1]
        # first events on an address: frees among them start the prelude
        first = ~same_prev & (order >= nc)
        first_free = np.zeros(events.size, dtype=bool)
        cand = rel[order[first & frees] - nc]
        if cand.size:
            fresh = ~np.isin(events["addr"][cand], self.seen)
            first_free[cand[fresh]] = True
        self.seen = np.union1d(self.seen, events["addr"][rel])
        # still live: the last event on each address is an alloc
        last = np.ones(order.size, dtype=bool)
        last[:-1] = ~same_prev[1:]
        keep = order[last & is_alloc[order]]
        keep.sort()
        self.addr, self.req, self.rounded = addr[keep], amount[0, keep], amount[1, keep]
        return first_free


def _busiest_device(log: ChunkedLog) -> int | None:
    """The trace's device: the most alloc and free records (ties: the lower id); None without any."""
    counts: dict[int, int] = {}
    for _, recs in log.chunks():
        kind = recs["kind"]
        dev = recs["device"][(kind == records.ALLOC) | (kind == records.FREE)]
        if dev.size:
            u, c = np.unique(dev, return_counts=True)
            for d, k in zip(u.tolist(), c.tolist()):
                counts[d] = counts.get(d, 0) + k
    return min(counts, key=lambda d: (-counts[d], d)) if counts else None


def load_log(source: str | os.PathLike[str] | bytes, *, device: int | None = None, prelude: bool = True,
             what: str | None = None, chunk_records: int = DEFAULT_CHUNK_RECORDS) -> Trace:
    """The log's trace (module docstring); `what` names it in errors and notes (default: its path)."""
    try:  # the log's own refusals (a bad header, a cut compressed stream, damage) as the trace's
        return _load(source, device=device, prelude=prelude, what=what, chunk_records=chunk_records)
    except LogFormatError as e:
        raise TraceError(str(e)) from None


def _load(source: str | os.PathLike[str] | bytes, *, device: int | None, prelude: bool, what: str | None,
          chunk_records: int) -> Trace:
    log = ChunkedLog(source, chunk_records, check="refuse")
    what = what or log.path
    asked = device
    if device is None:
        busiest = _busiest_device(log)
        device = busiest if busiest is not None else 0
    live = LivePeaks()
    first_frees: list[np.ndarray] = []
    seg_pos: list[np.ndarray] = []
    seg_delta: list[np.ndarray] = []
    policies: set[int] = set()
    facts = {"ooms": 0, "blocks": 0, "count": 0}

    def pieces() -> Iterator[np.ndarray]:
        for recs, sel, events in _device_pieces(log, device, what=what):
            kind = recs["kind"]
            on_dev = recs["device"] == device
            facts["blocks"] += int((events["kind"] <= FREE).sum())  # the allocs and frees among the events
            facts["ooms"] += int(((kind == records.OOM) & on_dev).sum())
            is_seg = ((kind == records.SEGMENT_ALLOC) | (kind == records.SEGMENT_FREE)) & on_dev
            if is_seg.any():
                before = facts["count"] + np.cumsum(sel) - sel  # replay events before each record
                seg_pos.append(before[is_seg].astype(np.int64))
                seg_delta.append(np.where(kind[is_seg] == records.SEGMENT_ALLOC, 1, -1)
                                 * recs["size"][is_seg].astype(np.int64))
                policies.update(int(p) for p in np.unique(recs["policy"][is_seg]).tolist())
            ff = live.piece(events)
            if ff.any():
                pre = events[ff]
                sizes = recs["size"][sel][ff].astype(np.int64)  # the free record's: the bytes asked at the alloc
                first_frees.append(np.stack((pre["addr"].astype(np.int64), sizes,
                                             pre["stream"].astype(np.int64), pre["phase"].astype(np.int64)), axis=1))
            facts["count"] += len(events)
            yield events

    spilled = SpilledEvents(pieces())
    if asked is not None and not facts["blocks"]:
        spilled.close()
        raise TraceError(f"{what}: no allocations on device {device}")
    notes = list(log.damage)
    n_pre = 0
    if prelude and first_frees:
        ff = np.concatenate(first_frees)
        sizes = ff[:, 1]
        keep = (sizes > 0) & (sizes <= MAX_REQUEST)
        head = np.zeros(int(keep.sum()), dtype=EVENT_DTYPE)
        head["kind"] = ALLOC
        head["addr"] = ff[keep, 0].astype(np.uint64)
        head["size"] = sizes[keep].astype(np.uint64)
        head["stream"] = ff[keep, 2].astype(np.uint64)
        head["phase"] = ff[keep, 3].astype(np.uint16)
        spilled.head = head
        spilled.allocs += len(head)
        n_pre = len(head)
    unknown = live.unknown
    if unknown:
        notes.append(f"{unknown} frees of addresses the log never saw allocated: it was opened mid-run")
    if n_pre:
        notes.append(f"{n_pre} allocations made before the log was opened were reconstructed at its start")
    if log.truncated:
        notes.append("the log was cut short by its writer (log_max or a full disk): the trace ends early")
    peaks = LivePeaks()  # live_peaks over the prelude and the events: one more pass, over the events kept
    for piece in spilled.pieces():
        peaks.piece(piece)
    trace = Trace(events=np.zeros(0, dtype=EVENT_DTYPE), source="torchalloc-log", path=what, device=device,
                  peak_requested=int(peaks.peak[0]), peak_rounded=int(peaks.peak[1]), unknown_frees=unknown,
                  replaced_allocs=peaks.replaced, prelude=n_pre, phase_names={k: printable(v) for k, v in log.phase_names.items()},
                  native_ooms=facts["ooms"], notes=notes, rank=int(log.header.rank))
    if spilled.path is None:  # few events: one array, as a snapshot's trace has them
        trace.events = spilled.array()
        spilled.close()
    else:
        trace.chunks = spilled
    if seg_pos:
        trace.native_pos = np.concatenate(seg_pos) + n_pre
        trace.native_delta = np.concatenate(seg_delta)
        trace.native_initial_reserved = 0
        trace.native_peak_reserved = max(0, int(np.cumsum(trace.native_delta).max()))
        names = ", ".join(records.POLICY_NAMES.get(p, f"policy {p}") for p in sorted(policies))
        trace.native_label = f"recorded ({names})"
        if unknown:
            trace.notes.append("the recorded reserved curve starts from 0 at the log's opening")
    return trace
