"""`torchalloc export LOG -o snap.pickle`: a torchalloc log as a PyTorch memory snapshot.

PyTorch's memory viewer (https://pytorch.org/memory_viz, and
torch.cuda._memory_viz: trace_plot, segment_plot, segsum, trace, memory,
segments) reads the pickle that torch.cuda.memory._dump_snapshot writes.
Under a pluggable allocator _record_memory_history raises, so there is no
such pickle; this builds one from the log instead:

    {"segments": [...], "device_traces": [[...], ...], "allocator_settings": {...}}

- device_traces[d]: one entry per event of device d, in log order:
  {"action", "addr", "size", "stream", "time_us", "frames"} with action
  "alloc" (size = block bytes, frames = the allocation stack),
  "free_requested" then "free_completed" for each free (torch records
  both; the viewer merges them), "segment_alloc" / "segment_free", and
  "oom" (with "device_free": 0, unknown here). frames are
  [{"filename", "line", "name"}], innermost first, as torch writes them.
- segments: the state at the end of the log: every segment still reserved,
  its blocks in address order covering it exactly: live ones
  {"state": "active_allocated", "size", "requested_size", "address",
  "frames"} and the gaps {"state": "inactive"}. The viewer replays the
  trace backwards from this state, so it must agree with the trace: a live
  block whose segment was reserved before the log began gets a segment
  made up to hold it (noted in the returned notes).

The log is read in pieces (log/chunks.py; a small log is one piece), twice:
once to count each device's trace entries, once to follow the blocks and
segments (blocks paired piece by piece as the analysis pairs them,
segments record by record: there are few) and to write out only the
entries the snapshot keeps -- the last `max_entries` of each device, as
PyTorch's ring buffer (`_record_memory_history(max_entries=...)`) keeps
them. The state at the end is complete whatever the cap. Memory follows
the entries kept and the blocks live, not the log's length.
"""
from __future__ import annotations

import gzip
import os
import pickle
from collections import defaultdict
from typing import Any

import numpy as np

from .._records import ALLOC, FREE, OOM, SEGMENT_ALLOC, SEGMENT_EXPANDABLE, SEGMENT_FREE
from ..analysis.notes import table_notes
from ..analysis.passes.pieces import Carry, Piece, PieceTable, pair_piece
from ..analysis.rules.frames import Frame, Stack
from ..log.chunks import DEFAULT_CHUNK_RECORDS, ChunkedLog
from ..printable import printable

__all__ = ["to_snapshot", "write_snapshot", "check_snapshot", "MAX_ENTRIES"]

# The trace entries kept per device by default, as `_record_memory_history(max_entries=100000)` keeps them (the
# value of PyTorch's memory guide): its own default keeps every entry, which memory_viz cannot draw for a long run.
MAX_ENTRIES = 100_000

_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "oom", "snapshot")
_ENTRIES = np.zeros(256, dtype=np.int64)  # trace entries per record kind (a free: requested, then completed)
_ENTRIES[[ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM]] = [1, 2, 1, 1, 1]
_STATES = ("active_allocated", "active_awaiting_free", "active_pending_free", "inactive")


def _frames(stack: Stack) -> list[dict[str, Any]]:
    return [{"filename": f.filename, "line": int(f.line), "name": f.function} for f in stack]


def to_snapshot(source: str | os.PathLike[str] | bytes, max_entries: int = 0,
                chunk_records: int = DEFAULT_CHUNK_RECORDS) -> tuple[dict[str, Any], list[str], list[int]]:
    """The snapshot, the notes (the log's, then what had to be made up), and per device how many trace entries
    the log has in all (the snapshot keeps the last `max_entries` of them; 0: all)."""
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
            # escaped, as the report shows them (torchalloc.printable)
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
    """Record r's trace entries (the module's docstring says which), those numbered `first_kept` or later."""
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


def settings() -> dict[str, Any]:
    """The snapshot's allocator_settings: PyTorch's names, and that torchalloc wrote it."""
    return {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False, "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "torchalloc": True}


def _map_range(runs: dict[int, tuple[int, int]], start: int, end: int, stream: int, add: bool) -> None:
    """Add or remove [start, end) in `runs`, disjoint stretches kept merged where they touch."""
    for s in [s for s, (e, _) in runs.items() if s <= end and e >= start]:  # overlapping or touching
        e, st = runs.pop(s)
        if add:
            start, end = min(start, s), max(end, e)
        else:
            if s < start:
                runs[s] = (start, st)
            if e > end:
                runs[end] = (e, st)
    if add:
        runs[start] = (end, stream)


def _segments_at_end(
    d: int,
    segs: dict[int, tuple[int, int, int]],
    live: dict[int, tuple[int, int, int, int]],
    frames: Any,
    notes: list[str],
) -> list[dict[str, Any]]:
    """Segments reserved at the end with their blocks in address order, gaps as inactive blocks."""
    seg_addrs = sorted(segs)
    members: dict[int, list[int]] = defaultdict(list)
    orphans: list[int] = []
    for addr in sorted(live):
        k = int(np.searchsorted(seg_addrs, addr, side="right")) - 1
        if k >= 0 and addr + live[addr][0] <= seg_addrs[k] + segs[seg_addrs[k]][0]:
            members[seg_addrs[k]].append(addr)
        else:
            orphans.append(addr)
    if orphans:
        # their segments were reserved before the log began: make up one per run of touching blocks
        notes.append(f"device {d}: {len(orphans)} live blocks lie outside every segment the log saw reserved "
                     "(reserved before the log began); each run of them gets a made-up segment")
        start = orphans[0]
        end = start + live[start][0]
        runs = []
        for addr in orphans[1:]:
            if addr == end:
                end += live[addr][0]
            else:
                runs.append((start, end))
                start, end = addr, addr + live[addr][0]
        runs.append((start, end))
        for s, e in runs:
            segs[s] = (e - s, live[s][2], 0)
            members[s] = [a for a in orphans if s <= a < e]
    out = []
    for base in sorted(segs):
        size, stream, expandable = segs[base]
        blocks = []
        cursor = base
        allocated = requested = 0
        for addr in members.get(base, []):
            bsize, req, _bstream, sid = live[addr]
            if addr > cursor:
                blocks.append({"address": cursor, "size": addr - cursor, "requested_size": 0, "state": "inactive",
                               "frames": []})
            blocks.append({"address": addr, "size": bsize, "requested_size": req, "state": "active_allocated",
                           "frames": frames(sid)})
            allocated += bsize
            requested += req
            cursor = addr + bsize
        if cursor < base + size:
            blocks.append({"address": cursor, "size": base + size - cursor, "requested_size": 0, "state": "inactive",
                           "frames": []})
        out.append({
            "device": d,
            "address": base,
            "total_size": size,
            "allocated_size": allocated,
            "active_size": allocated,
            "requested_size": requested,
            "stream": stream,
            "segment_type": "small" if size <= 2 << 20 else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": bool(expandable),
            "frames": [],
            "blocks": blocks,
        })
    return out


def check_snapshot(snap: Any) -> list[str]:
    """Problems with `snap` as a PyTorch memory snapshot (what _memory_viz and the viewer rely on); [] if none."""
    problems: list[str] = []
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list) or not isinstance(snap.get("device_traces"), list):
        return ["not a dict with 'segments' and 'device_traces' lists"]
    for s, seg in enumerate(snap["segments"]):
        for key, typ in (("device", int), ("address", int), ("total_size", int), ("allocated_size", int),
                         ("active_size", int), ("stream", int), ("segment_type", str), ("blocks", list)):
            if not isinstance(seg.get(key), typ):
                problems.append(f"segments[{s}].{key} missing or not {typ.__name__}")
        blocks = seg.get("blocks", [])
        if sum(b.get("size", 0) for b in blocks) != seg.get("total_size"):
            problems.append(f"segments[{s}]: block sizes do not add up to total_size")
        addr = seg.get("address")
        for b, block in enumerate(blocks):
            if block.get("state") not in _STATES:
                problems.append(f"segments[{s}].blocks[{b}].state {block.get('state')!r}")
            if block.get("address") != addr:
                problems.append(f"segments[{s}].blocks[{b}] is not contiguous with the one before")
            addr = (addr or 0) + block.get("size", 0)
            for key in ("size", "requested_size"):
                if not isinstance(block.get(key), int):
                    problems.append(f"segments[{s}].blocks[{b}].{key} missing")
            if not isinstance(block.get("frames"), list):
                problems.append(f"segments[{s}].blocks[{b}].frames missing")
    for d, trace in enumerate(snap["device_traces"]):
        if not isinstance(trace, list):
            problems.append(f"device_traces[{d}] is not a list")
            continue
        for e, entry in enumerate(trace):
            if entry.get("action") not in _ACTIONS:
                problems.append(f"device_traces[{d}][{e}].action {entry.get('action')!r}")
            for key in ("addr", "size", "stream", "time_us"):
                if not isinstance(entry.get(key), int):
                    problems.append(f"device_traces[{d}][{e}].{key} missing or not int")
            frames = entry.get("frames")
            if not isinstance(frames, list) or any(set(f) != {"filename", "line", "name"} for f in frames):
                problems.append(f"device_traces[{d}][{e}].frames malformed")
        if len(problems) > 50:
            break
    return problems


def write_snapshot(snapshot: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Pickle it as torch does (protocol 4; gzip when the name ends in .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
