"""The OOM section's part of the passes: the run up to the last OOM, as a trace fed piece by piece to
ooms.replay_last, which replays it under every policy and checks the advice's lines; the replay events of the
blocks allocated before the log, which every replay of it starts with (the reserve section's replays too,
stream_reserve.py); and the segments live at each OOM (follow_segments)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...._records import SEGMENT_ALLOC, SEGMENT_FREE
from ....log.chunks import ChunkedLog
from ...passes.first import Scan


def before_log_events(scan: Scan) -> np.ndarray:
    """The replay events that stand for the blocks allocated before the log: an alloc of each (of a known size),
    in the blocks' order, in phase 0."""
    from ....log.trace_events import ALLOC as EV_ALLOC
    from ....log.trace_events import EVENT_DTYPE

    o = scan.orphans
    pre = np.flatnonzero(o["size"] > 0)
    head = np.zeros(pre.size, dtype=EVENT_DTYPE)
    head["kind"] = EV_ALLOC
    head["addr"], head["size"], head["stream"] = o["addr"][pre], o["size"][pre], o["stream"][pre]
    return head


def trace_until(log: ChunkedLog, scan: Scan, path: Any, index: int) -> Any:
    """The run up to OOM record `index` as a Trace in pieces: the blocks from before the log, the device's
    events up to the record, then the failed request (at an address no event uses)."""
    from ....log.trace_events import ALLOC as EV_ALLOC
    from ....log.trace_events import EVENT_DTYPE, Trace
    from ....log.trace_stream import SpilledEvents, _Live, log_events
    from ....replay.oom_alternatives import _unused_address

    head = before_log_events(scan)
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


def follow_segments(segs: dict[int, int], at_ooms: dict[int, dict[int, int]], ooms: Sequence[int], t: Any,
                    base: int) -> None:
    """The segments live (address -> size), moved on by a piece's segment records (`t`, its first row event
    `base`): `segs` after the piece, and `at_ooms[i]` at each OOM `i` of `ooms` inside it (the largest free range
    at each failure; the pass takes the OOM moments before the piece's segments move, so those are redone)."""
    rows = np.flatnonzero((t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE))
    if not rows.size or not ooms:
        return
    for i in [x for x in ooms if base <= x < base + len(t)]:
        at = dict(segs)
        for r in rows[rows <= i - base].tolist():
            if t.kind[r] == SEGMENT_ALLOC:
                at[int(t.addr[r])] = int(t.size[r])
            else:
                at.pop(int(t.addr[r]), None)
        at_ooms[i] = at
    for r in rows.tolist():
        if t.kind[r] == SEGMENT_ALLOC:
            segs[int(t.addr[r])] = int(t.size[r])
        else:
            segs.pop(int(t.addr[r]), None)
