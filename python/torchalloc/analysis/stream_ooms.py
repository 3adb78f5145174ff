"""The last OOM of a log read in pieces, replayed (streamed.py): the run up to it as a trace fed piece by piece,
under every policy, and the advice's lines checked against those replays (as ooms.oom_rows does for a whole log)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..log.chunks import ChunkedLog
from .ooms import OomRow, _note_unreproduced
from .stream_scan import Scan


def check_last(log: ChunkedLog, scan: Scan, path: Any, last: OomRow) -> None:
    """ooms.oom_rows' replays of the run up to the last OOM under every policy, fed in pieces."""
    if last.usable is None:
        last.unknown.append("whether another policy would have fit (the log has no device numbers)")
        return
    from .. import _lib
    from ..replay.oom_alternatives import alternatives, check_advice, default_policies

    try:
        trace = trace_until(log, scan, path, last.index)
        try:
            last.alternatives = alternatives(trace, last.usable, default_policies())
            last.advice = check_advice(last.advice, last.alternatives, trace, policy=last.policy,
                                       expandable=last.expandable, capacity=last.usable,
                                       device_total=last.device_total or 0, limit=last.limit or 0)
            _note_unreproduced(last)
        finally:
            trace.chunks.close()
    except _lib.LibraryError as e:
        last.unknown.append(f"whether another policy would have fit (the replay needs the library: {e})")


def trace_until(log: ChunkedLog, scan: Scan, path: Any, index: int) -> Any:
    """oom_alternatives.events_until as a Trace in pieces: the blocks from before the log, the device's events
    up to OOM record `index`, then the failed request."""
    from ..log.trace_events import ALLOC as EV_ALLOC
    from ..log.trace_events import EVENT_DTYPE, Trace
    from ..log.trace_stream import SpilledEvents, _Live, log_events
    from ..replay.oom_alternatives import _unused_address

    o = scan.orphans
    pre = np.flatnonzero(o["size"] > 0)
    head = np.zeros(pre.size, dtype=EVENT_DTYPE)
    head["kind"] = EV_ALLOC
    head["addr"], head["size"], head["stream"] = o["addr"][pre], o["size"][pre], o["stream"][pre]
    ends = [int(head["addr"].min()), int(head["addr"].max())] if head.size else []

    def pieces() -> Any:
        for events in log_events(log, scan.device, upto=index + 1, what=path):
            if len(events):
                ends.extend((int(events["addr"].min()), int(events["addr"].max())))
            yield events

    spilled = SpilledEvents(pieces(), head=head)
    oom = next(r for r in scan.ooms if int(r["index"]) == index)
    tail = np.zeros(1, dtype=EVENT_DTYPE)
    # oom_alternatives._unused_address: past the highest address or below the lowest needs only those two;
    # a log using both ends of the 64-bit space has its addresses gathered to find a gap
    used = np.array([min(ends, default=0), max(ends, default=0)], dtype=np.uint64)
    if not (int(used[1]) < (1 << 64) - (2 << 20) or int(used[0]) >= 2 << 20):
        used = np.concatenate([head["addr"]] + [p["addr"] for p in spilled.pieces()])
    tail["kind"], tail["addr"], tail["size"] = EV_ALLOC, _unused_address(used), oom["size"]
    tail["stream"], tail["phase"] = oom["stream"], oom["phase"]
    spilled.tail = tail
    spilled.allocs += 1
    peaks = _Live()
    for piece in spilled.pieces():
        peaks.piece(piece)
    trace = Trace(events=np.zeros(0, dtype=EVENT_DTYPE), source="torchalloc-log",
                  peak_requested=int(peaks.peak[0]), peak_rounded=int(peaks.peak[1]))
    trace.chunks = spilled
    return trace
