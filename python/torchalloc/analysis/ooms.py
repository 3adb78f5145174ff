"""Out of memory: each OOM record, with the free memory in the reserved segments and its largest free range.

Takes a `Derived`; gives one `OomRow` per OOM record: what was asked for,
allocated and reserved then, the free bytes inside the reserved segments,
the largest contiguous free range between live blocks (from the segments
the log saw reserved), and whether that makes it fragmentation (enough free
bytes, no range large enough). Its explanation is left empty:
wording.oom_explanation writes it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._records import OOM, SEGMENT_ALLOC, SEGMENT_FREE
from .derived import Derived
from .frames import user_suffix
from .sites import NO_PYTHON, NO_STACKS


@dataclasses.dataclass
class OomRow:
    t_s: float
    requested: int
    reserved: int
    allocated: int
    free_in_reserved: int
    largest_free_range: int
    segments: int
    phase: str
    site: str
    fragmentation: bool
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def oom_rows(d: Derived) -> list[OomRow]:
    """Each OOM record, with the free memory in reserved segments and its largest contiguous range."""
    t = d.table
    rows = []
    for i in np.flatnonzero(t.kind == OOM).tolist():
        requested = int(t.size[i])
        reserved = int(t.block_size[i]) or int(d.reserved[i])  # the record carries reserved when the writer knew it
        allocated = int(d.allocated[i])
        free = max(0, reserved - allocated)
        largest, nseg = largest_free_range(d, i)
        stack = user_suffix(t.stack_of(int(t.stack[i])))
        site = stack[0].short() if stack else (NO_PYTHON.label if d.has_stacks else NO_STACKS.label)
        rows.append(OomRow(d.time_s(i), requested, reserved, allocated, free, largest, nseg,
                           d.phase_name(int(t.phase[i])), site, free >= requested and largest < requested, ""))
    return rows


def largest_free_range(d: Derived, i: int) -> tuple[int, int]:
    """Largest gap between live blocks inside the segments live at event i, and the segment count."""
    t = d.table
    upto = np.arange(len(t)) <= i
    segs: dict[int, int] = {}
    for k in np.flatnonzero(upto & ((t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE))).tolist():
        if t.kind[k] == SEGMENT_ALLOC:
            segs[int(t.addr[k])] = int(t.size[k])
        else:
            segs.pop(int(t.addr[k]), None)
    if not segs:
        return 0, 0
    live = d.live_at(i)
    seg_addr = np.array(sorted(segs), dtype=np.uint64)
    seg_size = np.array([segs[int(a)] for a in seg_addr], dtype=np.int64)
    addr = d.blocks.addr[live]
    size = d.blocks.block_size[live]
    order = np.argsort(addr)
    addr, size = addr[order], size[order]
    owner = np.searchsorted(seg_addr, addr, side="right") - 1
    largest = 0
    for s in range(seg_addr.size):
        start, end = int(seg_addr[s]), int(seg_addr[s]) + int(seg_size[s])
        mine = owner == s
        cursor = start
        for a, z in zip(addr[mine].tolist(), size[mine].tolist()):
            if a >= end:
                break
            largest = max(largest, a - cursor)
            cursor = max(cursor, a + z)
        largest = max(largest, end - cursor)
    return largest, int(seg_addr.size)
