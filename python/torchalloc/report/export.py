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
"""
from __future__ import annotations

import gzip
import os
import pickle
from collections import defaultdict
from typing import Any

import numpy as np

from .._records import ALLOC, FREE, OOM, SEGMENT_ALLOC, SEGMENT_EXPANDABLE, SEGMENT_FREE
from ..analysis import EventTable, Stack

__all__ = ["to_snapshot", "write_snapshot", "check_snapshot", "keep_last", "MAX_ENTRIES"]

# The trace entries kept per device by default, as `_record_memory_history(max_entries=100000)` keeps them (the
# value of PyTorch's memory guide): its own default keeps every entry, which memory_viz cannot draw for a long run.
MAX_ENTRIES = 100_000

_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "oom", "snapshot")
_STATES = ("active_allocated", "active_awaiting_free", "active_pending_free", "inactive")


def _frames(stack: Stack) -> list[dict[str, Any]]:
    return [{"filename": f.filename, "line": int(f.line), "name": f.function} for f in stack]


def to_snapshot(t: EventTable) -> tuple[dict[str, Any], list[str]]:
    """The snapshot dict for every device of the log, and notes on what had to be made up."""
    notes: list[str] = []
    ndev = int(t.device.max()) + 1 if len(t) and t.device.max() >= 0 else 1
    traces: list[list[dict[str, Any]]] = [[] for _ in range(ndev)]
    frames_cache: dict[int, list[dict[str, Any]]] = {}

    def frames(sid: int) -> list[dict[str, Any]]:
        if sid not in frames_cache:
            frames_cache[sid] = _frames(t.stack_of(sid))
        return frames_cache[sid]

    wall = t.wall_offset_ns
    live: list[dict[int, tuple[int, int, int, int]]] = [dict() for _ in range(ndev)]  # addr -> (block, req, stream, stack)
    segs: list[dict[int, tuple[int, int, int]]] = [dict() for _ in range(ndev)]  # addr -> (size, stream, expandable)
    mapped: list[dict[int, tuple[int, int]]] = [dict() for _ in range(ndev)]  # expandable: start -> (end, stream)
    kinds = t.kind.tolist()
    for i in np.flatnonzero(np.isin(t.kind, (ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM))).tolist():
        d = int(t.device[i])
        if d < 0:
            continue
        k = kinds[i]
        addr, size, block = int(t.addr[i]), int(t.size[i]), int(t.block_size[i])
        stream, sid = int(t.stream[i]), int(t.stack[i])
        time_us = (int(t.time_ns[i]) + wall) // 1000
        if k == ALLOC:
            live[d][addr] = (block, size, stream, sid)
            traces[d].append({"action": "alloc", "addr": addr, "size": block, "stream": stream, "time_us": time_us,
                              "frames": frames(sid)})
        elif k == FREE:
            alloc_stack = live[d].pop(addr, (block, size, stream, 0))[3]
            free_frames = frames(sid) if sid else frames(alloc_stack)
            traces[d].append({"action": "free_requested", "addr": addr, "size": block, "stream": stream,
                              "time_us": time_us, "frames": free_frames})
            traces[d].append({"action": "free_completed", "addr": addr, "size": block, "stream": stream,
                              "time_us": time_us, "frames": frames(alloc_stack)})
        elif k in (SEGMENT_ALLOC, SEGMENT_FREE) and int(t.flags[i]) & SEGMENT_EXPANDABLE:
            # a run of granules of an expandable segment mapped or unmapped: PyTorch's names for it
            _map_range(mapped[d], addr, addr + size, stream, k == SEGMENT_ALLOC)
            traces[d].append({"action": "segment_map" if k == SEGMENT_ALLOC else "segment_unmap", "addr": addr,
                              "size": size, "stream": stream, "time_us": time_us, "frames": []})
        elif k == SEGMENT_ALLOC:
            segs[d][addr] = (size, stream, 0)
            traces[d].append({"action": "segment_alloc", "addr": addr, "size": size, "stream": stream,
                              "time_us": time_us, "frames": []})
        elif k == SEGMENT_FREE:
            segs[d].pop(addr, None)
            traces[d].append({"action": "segment_free", "addr": addr, "size": size, "stream": stream,
                              "time_us": time_us, "frames": []})
        else:  # OOM
            traces[d].append({"action": "oom", "addr": 0, "size": size, "stream": stream, "time_us": time_us,
                              "device_free": 0, "frames": frames(sid)})
    segments: list[dict[str, Any]] = []
    for d in range(ndev):
        for start, (end, stream) in mapped[d].items():  # each mapped stretch of an expandable segment
            segs[d][start] = (end - start, stream, 1)
        segments += _segments_at_end(d, segs[d], live[d], frames, notes)
    snapshot = {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": settings(),
        "external_annotations": [],
    }
    return snapshot, notes


def settings() -> dict[str, Any]:
    """The snapshot's allocator_settings: PyTorch's names, and that torchalloc wrote it."""
    return {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False, "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "torchalloc": True}


def keep_last(snapshot: dict[str, Any], max_entries: int) -> list[int]:
    """Cut each device's trace to its last `max_entries` entries (0: keep all), as PyTorch's ring buffer keeps
    them; returns how many each had."""
    totals = [len(trace) for trace in snapshot["device_traces"]]
    if max_entries:
        snapshot["device_traces"] = [trace[-max_entries:] for trace in snapshot["device_traces"]]
    return totals


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
