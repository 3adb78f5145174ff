"""`torchalloc export` for a log read in pieces: the snapshot export.py builds, in bounded memory.

export.to_snapshot walks the decoded log record by record and keeps every
trace entry. Here the log is read twice in pieces (log/chunks.py): once to
count each device's trace entries, once to follow the blocks and segments
(blocks paired piece by piece as the analysis pairs them, segments record
by record: there are few) and to write out only the entries the snapshot
keeps -- the last `max_entries` of each device, as PyTorch's ring buffer
(`_record_memory_history(max_entries=...)`) keeps them. The state at the
end (every segment still reserved, with its blocks) is complete whatever
the cap, and the same as export.to_snapshot's.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._records import ALLOC, FREE, OOM, SEGMENT_ALLOC, SEGMENT_EXPANDABLE, SEGMENT_FREE
from ..analysis.frames import Frame
from ..analysis.stream_table import Carry, Piece, PieceTable, pair_piece
from ..analysis.stream_notes import table_notes
from ..log.chunks import DEFAULT_CHUNK_RECORDS, ChunkedLog
from ..printable import printable
from .export import _frames, _map_range, _segments_at_end, settings

__all__ = ["to_snapshot_streamed"]

_ENTRIES = np.zeros(256, dtype=np.int64)  # trace entries per record kind (a free: requested, then completed)
_ENTRIES[[ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM]] = [1, 2, 1, 1, 1]


def to_snapshot_streamed(source: str | os.PathLike[str] | bytes, max_entries: int,
                         chunk_records: int = DEFAULT_CHUNK_RECORDS) -> tuple[dict[str, Any], list[str], list[int]]:
    """The snapshot, the notes (the log's, then what had to be made up), and per device how many trace entries
    the whole log has (the snapshot keeps the last `max_entries` of them; 0: all)."""
    log = ChunkedLog(source, chunk_records, check="drop")
    totals: dict[int, int] = {}
    top = -1
    for _, recs in log.chunks():  # first pass: how many entries each device has
        dev, kind = recs["device"], recs["kind"]
        top = max(top, int(dev.max(initial=-1)))
        n = _ENTRIES[kind] * (dev >= 0)
        if n.any():
            for d in np.unique(dev[n > 0]).tolist():
                totals[d] = totals.get(d, 0) + int(n[dev == d].sum())
    ndev = top + 1 if top >= 0 else 1
    first_kept = {d: max(0, c - max_entries) if max_entries else 0 for d, c in totals.items()}
    stacks = log.stacks
    cache: dict[int, list[dict[str, Any]]] = {}

    def frames(sid: int) -> list[dict[str, Any]]:
        if sid not in cache:
            # escaped, as the whole-log export's EventTable has them (torchalloc.printable)
            cache[sid] = _frames(tuple(Frame(printable(str(f[0])), int(f[1]), printable(str(f[2])))
                                       for f in stacks.get(sid, [])))
        return cache[sid]

    wall = int(log.header.created_realtime_ns - log.header.created_monotonic_ns)
    traces: list[list[dict[str, Any]]] = [[] for _ in range(ndev)]
    seen = {d: 0 for d in range(ndev)}
    carry = {d: Carry.empty({"addr": np.uint64, "block_size": np.int64, "size": np.int64, "stream": np.int64,
                             "stack": np.int64}) for d in range(ndev)}
    segs: list[dict[int, tuple[int, int, int]]] = [dict() for _ in range(ndev)]
    mapped: list[dict[int, tuple[int, int]]] = [dict() for _ in range(ndev)]
    for _, recs in log.chunks():  # second pass: the blocks, the segments, the entries kept
        dev = recs["device"]
        for d in np.unique(dev[dev >= 0]).tolist():
            t = PieceTable(recs[dev == d])
            carry[d] = _device_piece(t, d, carry[d], first_kept.get(d, 0), seen, traces[d], segs[d], mapped[d],
                                     frames, wall)
    notes = table_notes(log)
    made_up: list[str] = []
    segments: list[dict[str, Any]] = []
    for d in range(ndev):
        for start, (end, stream) in mapped[d].items():  # each mapped stretch of an expandable segment
            segs[d][start] = (end - start, stream, 1)
        c = carry[d]
        live = {int(a): (int(b), int(s), int(st), int(k)) for a, b, s, st, k in
                zip(c["addr"].tolist(), c["block_size"].tolist(), c["size"].tolist(), c["stream"].tolist(),
                    c["stack"].tolist())}
        segments += _segments_at_end(d, segs[d], live, frames, made_up)
    snapshot = {"segments": segments, "device_traces": traces, "allocator_settings": settings(),
                "external_annotations": []}
    return snapshot, notes + made_up, [totals.get(d, 0) for d in range(ndev)]


def _device_piece(t: PieceTable, d: int, carry: Carry, first_kept: int, seen: dict[int, int],
                  trace: list[dict[str, Any]], segs: dict[int, tuple[int, int, int]],
                  mapped: dict[int, tuple[int, int]], frames: Any, wall: int) -> Carry:
    """One piece of device d's records: blocks paired (the carry: its live blocks), segments followed, and the
    entries from entry number `first_kept` on written into `trace`."""
    kind = t.kind
    paired = pair_piece(Piece(t, 0), carry, 0)
    # the alloc stack of each free's block (0: a free of a block the log did not see allocated)
    alloc_stack = np.zeros(len(t), dtype=np.int64)
    real = paired.ended_real
    comb_stack = paired.combined(carry["stack"], t.stack)
    alloc_stack[paired.ended_at[real]] = comb_stack[paired.ended_src[real]]
    count = _ENTRIES[kind]
    start = seen[d] + np.cumsum(count) - count  # each record's first entry number
    seen[d] += int(count.sum())
    keep = (count > 0) & (start + count > first_kept)
    for r in np.flatnonzero(keep).tolist():
        _entries(t, r, int(start[r]), first_kept, int(alloc_stack[r]), trace, frames, wall, mapped)
    for r in np.flatnonzero((kind == SEGMENT_ALLOC) | (kind == SEGMENT_FREE)).tolist():
        addr, size, stream = int(t.addr[r]), int(t.size[r]), int(t.stream[r])
        if int(t.flags[r]) & SEGMENT_EXPANDABLE:
            _map_range(mapped, addr, addr + size, stream, kind[r] == SEGMENT_ALLOC)
        elif kind[r] == SEGMENT_ALLOC:
            segs[addr] = (size, stream, 0)
        else:
            segs.pop(addr, None)
    cols = {"addr": t.addr, "block_size": t.block_size, "size": t.size, "stream": t.stream.astype(np.int64),
            "stack": t.stack}
    return Carry({name: paired.combined(carry[name], col)[paired.live_src] for name, col in cols.items()})


def _entries(t: PieceTable, r: int, first: int, first_kept: int, alloc_stack: int, trace: list[dict[str, Any]],
             frames: Any, wall: int, mapped: dict[int, tuple[int, int]]) -> None:
    """Record r's trace entries (export.to_snapshot's), those numbered `first_kept` or later."""
    k = int(t.kind[r])
    addr, size, block = int(t.addr[r]), int(t.size[r]), int(t.block_size[r])
    stream, sid = int(t.stream[r]), int(t.stack[r])
    time_us = (int(t.time_ns[r]) + wall) // 1000
    if k == ALLOC:
        trace.append({"action": "alloc", "addr": addr, "size": block, "stream": stream, "time_us": time_us,
                      "frames": frames(sid)})
    elif k == FREE:
        if first >= first_kept:
            trace.append({"action": "free_requested", "addr": addr, "size": block, "stream": stream,
                          "time_us": time_us, "frames": frames(sid) if sid else frames(alloc_stack)})
        trace.append({"action": "free_completed", "addr": addr, "size": block, "stream": stream,
                      "time_us": time_us, "frames": frames(alloc_stack)})
    elif k in (SEGMENT_ALLOC, SEGMENT_FREE) and int(t.flags[r]) & SEGMENT_EXPANDABLE:
        trace.append({"action": "segment_map" if k == SEGMENT_ALLOC else "segment_unmap", "addr": addr,
                      "size": size, "stream": stream, "time_us": time_us, "frames": []})
    elif k in (SEGMENT_ALLOC, SEGMENT_FREE):
        trace.append({"action": "segment_alloc" if k == SEGMENT_ALLOC else "segment_free", "addr": addr, "size": size,
                      "stream": stream, "time_us": time_us, "frames": []})
    else:  # OOM
        trace.append({"action": "oom", "addr": 0, "size": size, "stream": stream, "time_us": time_us,
                      "device_free": 0, "frames": frames(sid)})
