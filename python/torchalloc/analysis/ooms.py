"""Out of memory: for each OOM record, the verdict, the blocks to blame and the check by replay.

Takes a `Derived`; gives one `OomRow` per OOM record:

- the numbers at the failure: what was asked for (size, stream, phase,
  site), reserved, allocated, free inside reserved and its largest
  contiguous range (from the segments and live blocks the log saw), and,
  from the `oom_device` record written beside it (logs since 0.2), the
  device's total and free memory, the memory fraction and the largest free
  block on the request's stream;
- the verdict -- fragmentation, capacity or held elsewhere -- by the one
  rule the C core applies (`_lib.oom_verdict`), taken from the record when
  the allocator wrote it, else computed from the numbers the log has;
- `blockers`: for fragmentation, the live blocks in the segments with the
  most free memory (what keeps their holes apart); otherwise the largest
  live blocks (what to shrink), each with its site, phase and age;
- `alternatives` (the last OOM of the log only: each takes a few dozen
  replays): the run up to the failure replayed under every policy at the
  capacity torchalloc could use (oom_alternatives.py);
- `unknown`: what the log could not tell (device numbers in an old log, sites
  without stacks, the capacity without device numbers).

The explanation is left empty: wording.oom_explanation writes it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import _lib
from .._records import OOM, OOM_DEVICE, SEGMENT_ALLOC, SEGMENT_FREE
from ..replay.oom_alternatives import Alternative, alternatives, default_policies, events_until
from .derived import Derived
from .frames import user_suffix
from .sites import NO_PYTHON, NO_STACKS

BLOCKERS_SHOWN = 10


@dataclasses.dataclass
class Blocker:
    """A live block at the failure: one that pins a fragmented segment, or one of the largest."""

    addr: int
    size: int
    site: str
    location: str
    phase: str
    age_s: float  # how long it had lived at the failure; -1 when it predates the log

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class OomRow:
    t_s: float
    index: int  # of the OOM record in the device's event table
    requested: int
    stream: int
    phase: str
    site: str
    reserved: int
    allocated: int
    free_in_reserved: int
    largest_free_range: int  # any stream, from the log's view of the segments
    segments: int
    device_total: int | None  # None: the log predates the oom_device record
    device_free: int | None
    limit: int | None  # the memory fraction's ceiling; 0 for none
    held_elsewhere: int | None
    largest_free_on_stream: int | None
    usable: int | None  # what torchalloc could have used: the capacity of the replays
    verdict: str  # "fragmentation", "capacity", "held elsewhere", or "unknown (...)"
    verdict_from: str  # "the allocator, at the failure" or "the numbers in the log"
    blockers: list[Blocker]
    alternatives: list[Alternative]
    unknown: list[str]
    explanation: str

    @property
    def fragmentation(self) -> bool:
        return self.verdict == "fragmentation"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["fragmentation"] = self.fragmentation
        return d


def oom_rows(d: Derived, *, check_alternatives: bool = True) -> list[OomRow]:
    """Each OOM record, diagnosed; the last one also replayed under every policy."""
    t = d.table
    indices = np.flatnonzero(t.kind == OOM).tolist()
    rows = [_row(d, i) for i in indices]
    if rows and check_alternatives:
        last = rows[-1]
        if last.usable is None:
            last.unknown.append("whether another policy would have fit (the log has no device numbers)")
        else:
            try:
                events = events_until(t, last.index, _before_log(d))
                last.alternatives = alternatives(events, last.usable, default_policies())
            except _lib.LibraryError as e:
                last.unknown.append(f"whether another policy would have fit (the replay needs the library: {e})")
    return rows


def _row(d: Derived, i: int) -> OomRow:
    t = d.table
    requested, reserved = int(t.size[i]), int(t.block_size[i]) or int(d.reserved[i])
    allocated = int(d.allocated[i])
    largest, nseg, by_segment = _segments_at(d, i)
    stack = user_suffix(t.stack_of(int(t.stack[i])))
    site = stack[0].short() if stack else (NO_PYTHON.label if d.has_stacks else NO_STACKS.label)
    unknown: list[str] = []
    device = _device_record(d, i)
    total = free = limit = on_stream = held = usable = None
    if device is not None:
        total, limit, on_stream = int(t.addr[device]), int(t.size[device]), int(t.stream[device])
        free = int(t.addr[i])
        held = max(0, total - free - reserved)
        usable = min(total - held, limit or total)
    else:
        unknown.append("the device's total and free memory and the memory fraction (the log predates them)")
    code = int(t.flags[device]) if device is not None else 0
    if code in _lib.OOM_VERDICTS and code:
        verdict, source = _lib.OOM_VERDICTS[code], "the allocator, at the failure"
    else:
        source = "the numbers in the log"
        try:
            verdict = _lib.oom_verdict(requested=requested, allocated=allocated, reserved=reserved,
                                       device_total=total or 0, device_free=free or 0, limit=limit or 0,
                                       largest_free=on_stream if on_stream is not None else largest)
        except _lib.LibraryError as e:
            verdict = f"unknown (the verdict needs the library: {e})"
    if not d.has_stacks:
        unknown.append("allocation sites (logged without stacks:1)")
    blockers = _blockers(d, i, by_segment if verdict == "fragmentation" else None)
    return OomRow(d.time_s(i), i, requested, int(t.stream[i]), d.phase_name(int(t.phase[i])), site, reserved,
                  allocated, max(0, reserved - allocated), largest, nseg, total, free, limit, held, on_stream, usable,
                  verdict, source, blockers, [], unknown, "")


def _device_record(d: Derived, i: int) -> int | None:
    """The oom_device record written right after OOM record i, if the log has it."""
    t = d.table
    for k in range(i + 1, min(i + 3, len(t))):
        if t.kind[k] == OOM_DEVICE:
            return k
        if t.kind[k] == OOM:
            break
    return None


def _segments_at(d: Derived, i: int) -> tuple[int, int, list[tuple[int, int, list[int]]]]:
    """At event i: the largest gap between live blocks in the live segments, their count, and per segment
    (free bytes, address, the live blocks in it), most free first."""
    t = d.table
    upto = np.flatnonzero((np.arange(len(t)) <= i) & ((t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE)))
    segs: dict[int, int] = {}
    for k in upto.tolist():
        if t.kind[k] == SEGMENT_ALLOC:
            segs[int(t.addr[k])] = int(t.size[k])
        else:
            segs.pop(int(t.addr[k]), None)
    if not segs:
        return 0, 0, []
    live = d.live_at(i)
    seg_addr = np.array(sorted(segs), dtype=np.uint64)
    order = np.argsort(d.blocks.addr[live])
    live = live[order]
    addr, size = d.blocks.addr[live], d.blocks.block_size[live]
    owner = np.searchsorted(seg_addr, addr, side="right") - 1
    largest, per_segment = 0, []
    for s in range(seg_addr.size):
        start = int(seg_addr[s])
        end = start + segs[start]
        mine = np.flatnonzero(owner == s)
        cursor, used = start, 0
        for k in mine.tolist():
            a, z = int(addr[k]), int(size[k])
            if a >= end:
                break
            largest = max(largest, a - cursor)
            cursor = max(cursor, a + z)
            used += z
        largest = max(largest, end - cursor)
        per_segment.append((segs[start] - used, start, live[mine].tolist()))
    per_segment.sort(key=lambda p: (-p[0], p[1]))
    return largest, int(seg_addr.size), per_segment


def _blockers(d: Derived, i: int, by_segment: list[tuple[int, int, list[int]]] | None) -> list[Blocker]:
    """Fragmentation: the live blocks in the segments with the most free memory; else the largest live blocks."""
    b = d.blocks
    if by_segment is not None:
        chosen = [k for free, _, members in by_segment if free > 0 and members for k in members][:4 * BLOCKERS_SHOWN]
    else:
        chosen = d.live_at(i).tolist()
    chosen.sort(key=lambda k: (-int(b.block_size[k]), int(b.addr[k])))
    now = int(d.table.time_ns[i])
    out = []
    for k in chosen[:BLOCKERS_SHOWN]:
        site = d.sites[int(d.classified.site[k])]
        age = (now - int(b.alloc_t[k])) / 1e9 if b.alloc_i[k] >= 0 else -1.0
        out.append(Blocker(int(b.addr[k]), int(b.block_size[k]), site.label, site.location,
                           d.phase_name(int(b.alloc_phase[k])), age))
    return out


def _before_log(d: Derived) -> list[tuple[int, int, int, int]]:
    """(addr, requested size, stream, phase) of the blocks allocated before the log began."""
    b = d.blocks
    pre = np.flatnonzero(b.alloc_i < 0)
    return [(int(b.addr[k]), int(b.size[k]), int(b.stream[k]), 0) for k in pre.tolist() if int(b.size[k]) > 0]
