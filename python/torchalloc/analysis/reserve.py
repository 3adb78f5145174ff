"""Reserved memory explained: where the bytes reserved beyond the allocated ones go, and what would have saved them.

Takes a `Derived`; gives a `Reserve`:

- `levels` (after every event, exact): reserved = allocated + fragmented
  (free bytes in segments that hold live blocks) + cached (segments with no
  live block) + mapped_free (free bytes in the mapped granules of
  expandable segments) + before_log (segments made before the log began:
  the log does not know them, so their free bytes and any block outside
  the segments it saw count here). The terms are cumulative sums of the
  segment and block records, so they add up by construction.
- `moments`: those terms at the peak of reserved and at the peak of
  allocated, with the segments holding the most free bytes that live blocks
  pin, and those blocks (site, phase, category, age).
- `replays`: the whole run replayed under every policy and variant on the
  simulated device (replay/engine.py, the code that serves the GPU), the
  recording policy's own replay first: what each would have reserved at
  its peak on the same events. The best one is the change that would have
  saved the most.

A segment is what one SEGMENT_ALLOC record made; with expandable segments a
record maps a run of granules, and a SEGMENT_FREE may unmap part of a run
(the rest stays mapped). Which segment holds a block: the live one whose
address range contains the block's address when it was allocated.
The sentences are left to wording.py.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any

import numpy as np

from .. import _lib
from .._records import ALLOC, POLICY_NAMES, SEGMENT_ALLOC, SEGMENT_EXPANDABLE, SEGMENT_FREE
from ..replay.engine import DEFAULT_POLICIES, replay_once
from ..replay.oom_alternatives import events_until
from .blocks import NEVER
from .categorize import CATEGORIES
from .derived import Derived

PINNED_SHOWN = 5  # segments listed per moment
BLOCKS_PER_SEGMENT = 4  # pinning blocks listed per segment


@dataclasses.dataclass
class Segments:
    """One row per segment (or run of expandable granules) the log saw, in order of appearance."""

    start: np.ndarray  # uint64 address
    size: np.ndarray  # int64 bytes
    alloc_i: np.ndarray  # event index of its SEGMENT_ALLOC (or of the partial unmap that left it)
    free_i: np.ndarray  # event index of its SEGMENT_FREE; NEVER while mapped at the end
    expandable: np.ndarray  # bool


@dataclasses.dataclass
class Levels:
    """The terms of reserved after every event (each an int64 array as long as the event table)."""

    fragmented: np.ndarray
    cached: np.ndarray
    mapped_free: np.ndarray
    before_log: np.ndarray


@dataclasses.dataclass
class PinningBlock:
    size: int
    site: str
    location: str
    phase: str
    category: str
    age_s: float  # -1: allocated before the log began

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PinnedSegment:
    addr: int
    size: int
    free: int
    live_blocks: int
    live_bytes: int
    expandable: bool
    blocks: list[PinningBlock]  # the largest live blocks in it

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["blocks"] = [b.to_dict() for b in self.blocks]
        return d


@dataclasses.dataclass
class ReserveMoment:
    at: str  # "peak reserved", "peak allocated"
    index: int
    t_s: float
    reserved: int
    allocated: int
    fragmented: int
    cached: int
    mapped_free: int
    before_log: int
    segments: int  # live then
    holding: int  # of them, segments that hold live blocks and have free bytes (non-expandable)
    empty: int  # of them, segments with no live block (non-expandable)
    pinned: list[PinnedSegment]

    def terms(self) -> list[tuple[str, int]]:
        return [("allocated", self.allocated), ("fragmented", self.fragmented), ("cached", self.cached),
                ("mapped_free", self.mapped_free), ("before_log", self.before_log)]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["pinned"] = [p.to_dict() for p in self.pinned]
        return d


@dataclasses.dataclass
class ReplayRow:
    policy: str
    peak_reserved: int
    peak_allocated: int
    recording: bool  # the policy (and variant) that recorded the log
    oom: bool  # ran out of memory on the simulated device (unlimited: should not happen)
    synchronizes: int = 0  # device synchronizes the replay made (compact's, say)

    def rank(self) -> tuple[int, int, bool]:
        """Least memory first; on a tie, the variant that never waits for the device, then the recording one."""
        return self.peak_reserved, self.synchronizes, not self.recording

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Reserve:
    moments: list[ReserveMoment]
    recording_policy: str  # e.g. "caching", "caching+expandable"
    replays: list[ReplayRow]  # the recording policy's first, then the others, least reserved first
    unknown: list[str]  # what could not be computed, and why
    sentences: list[str] = dataclasses.field(default_factory=list)  # wording.reserve_sentences

    @property
    def best(self) -> ReplayRow | None:
        """The replay that reserves the least, when it beats the recording policy's replay."""
        if not self.replays:
            return None
        base = self.replays[0]
        best = min(self.replays, key=ReplayRow.rank)
        return best if best.peak_reserved < base.peak_reserved and not best.recording else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"moments": [m.to_dict() for m in self.moments], "recording_policy": self.recording_policy,
                "replays": [r.to_dict() for r in self.replays], "best": best.policy if best else None,
                "unknown": list(self.unknown), "sentences": list(self.sentences)}


def segments(d: Derived) -> Segments:
    """The segments the log saw (see the module's docstring for expandable runs unmapped in part)."""
    t = d.table
    rows = np.flatnonzero((t.kind == SEGMENT_ALLOC) | (t.kind == SEGMENT_FREE)).tolist()
    start: list[int] = []
    size: list[int] = []
    alloc_i: list[int] = []
    free_i: list[int] = []
    exp: list[bool] = []
    live: dict[int, int] = {}  # start -> row in the lists

    def add(a: int, z: int, i: int, x: bool) -> None:
        live[a] = len(start)
        start.append(a), size.append(z), alloc_i.append(i), free_i.append(NEVER), exp.append(x)

    for i in rows:
        a, z = int(t.addr[i]), int(t.size[i])
        if t.kind[i] == SEGMENT_ALLOC:
            add(a, z, i, bool(t.flags[i] & SEGMENT_EXPANDABLE))
            continue
        k = live.pop(a, None)
        if k is None:  # a run unmapped from the middle or end of a mapped one: find the one holding it
            k = next((r for s, r in live.items() if s <= a < s + size[r]), None)
            if k is None:
                continue  # a segment made before the log began
            del live[start[k]]
        free_i[k] = i
        s, e = start[k], start[k] + size[k]
        if a > s:  # the part before the unmapped range stays mapped
            add(s, a - s, i, exp[k])
        if a + z < e:
            add(a + z, e - a - z, i, exp[k])
    return Segments(np.array(start, dtype=np.uint64), np.array(size, dtype=np.int64),
                    np.array(alloc_i, dtype=np.int64), np.array(free_i, dtype=np.int64), np.array(exp, dtype=bool))


def block_segments(d: Derived, segs: Segments) -> np.ndarray:
    """Per block, the row of the segment holding it (-1: none the log saw, e.g. made before it began)."""
    b = d.blocks
    owner = np.full(len(b.addr), -1, dtype=np.int64)
    known = np.flatnonzero(b.alloc_i >= 0)
    order = known[np.argsort(b.addr[known], kind="stable")]
    addrs = b.addr[order]
    for s in range(segs.start.size):
        lo = int(np.searchsorted(addrs, segs.start[s], side="left"))
        hi = int(np.searchsorted(addrs, segs.start[s] + np.uint64(segs.size[s]), side="left"))
        cand = order[lo:hi]
        inside = cand[(b.alloc_i[cand] > segs.alloc_i[s]) & (b.alloc_i[cand] < segs.free_i[s])]
        owner[inside] = s
    return owner


def levels(d: Derived, segs: Segments, owner: np.ndarray) -> Levels:
    """The terms of reserved after every event (see the module's docstring)."""
    n = len(d.table)
    b = d.blocks
    nseg = segs.start.size
    # per segment, its live-block count after each of its block events: sorted by (segment, event)
    sel = np.flatnonzero(owner >= 0)
    freed = sel[b.free_i[sel] != NEVER]
    seg = np.concatenate((owner[sel], owner[freed]))
    idx = np.concatenate((b.alloc_i[sel], b.free_i[freed]))
    step = np.concatenate((np.ones(sel.size, np.int64), -np.ones(freed.size, np.int64)))
    nbytes = np.concatenate((b.block_size[sel], -b.block_size[freed])).astype(np.int64)
    order = np.lexsort((idx, seg))
    seg, idx, step, nbytes = seg[order], idx[order], step[order], nbytes[order]
    count = np.cumsum(step)
    first = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1]))) if seg.size else np.zeros(0, np.int64)
    if seg.size:  # restart the count at each segment's first event
        lengths = np.diff(np.concatenate((first, [seg.size])))
        count = count - np.repeat((count - step)[first], lengths)
    became_empty = (count == 0).astype(np.int64) - (count - step == 0).astype(np.int64)  # +1 emptied, -1 occupied
    size_of = segs.size[seg] if seg.size else np.zeros(0, np.int64)
    exp_of = segs.expandable[seg] if seg.size else np.zeros(0, bool)
    # the last count of each segment: live blocks when it was freed (0 in any consistent log)
    last = np.full(nseg, 0, np.int64)
    if seg.size:
        ends = np.concatenate((first[1:] - 1, [seg.size - 1]))
        last[seg[ends]] = count[ends]

    cached = np.zeros(n, np.int64)
    occupied = np.zeros(n, np.int64)
    mapped = np.zeros(n, np.int64)
    in_plain = np.zeros(n, np.int64)
    in_exp = np.zeros(n, np.int64)
    plain = ~exp_of
    np.add.at(cached, idx[plain], became_empty[plain] * size_of[plain])
    np.add.at(occupied, idx[plain], -became_empty[plain] * size_of[plain])
    np.add.at(in_plain, idx[plain], nbytes[plain])
    np.add.at(in_exp, idx[~plain], nbytes[~plain])
    for s in range(nseg):  # segment records: few
        z = int(segs.size[s])
        if segs.expandable[s]:
            mapped[segs.alloc_i[s]] += z
            if segs.free_i[s] != NEVER:
                mapped[segs.free_i[s]] -= z
            continue
        cached[segs.alloc_i[s]] += z
        if segs.free_i[s] != NEVER:
            (cached if last[s] == 0 else occupied)[segs.free_i[s]] -= z
    cached, occupied, mapped = np.cumsum(cached), np.cumsum(occupied), np.cumsum(mapped)
    fragmented = occupied - np.cumsum(in_plain)
    mapped_free = mapped - np.cumsum(in_exp)
    before_log = d.reserved - d.allocated - fragmented - cached - mapped_free
    # With expandable:reclaim a granule the device may still be using is mapped at its new address before its
    # old one is unmapped: for a while the log's mapped runs hold more than the device memory reserved. Count
    # such granules once (out of mapped_free), so no term goes below zero.
    aliased = np.minimum(np.maximum(-before_log, 0), np.maximum(mapped_free, 0))
    mapped_free, before_log = mapped_free - aliased, before_log + aliased
    return Levels(fragmented, cached, mapped_free, before_log)


def moment(d: Derived, lv: Levels, segs: Segments, owner: np.ndarray, i: int, at: str) -> ReserveMoment:
    """The terms at event i, and the segments with the most free bytes pinned by live blocks."""
    b, c = d.blocks, d.classified
    live = d.live_at(i)
    mine = live[owner[live] >= 0]
    per_seg: dict[int, list[int]] = {}
    for k, s in zip(mine.tolist(), owner[mine].tolist()):
        per_seg.setdefault(s, []).append(k)
    alive = np.flatnonzero((segs.alloc_i <= i) & (segs.free_i > i))
    now = int(d.table.time_ns[i])
    pinned = []
    for s, members in per_seg.items():
        used = int(b.block_size[members].sum())
        free = int(segs.size[s]) - used
        if free <= 0:
            continue
        members.sort(key=lambda k: (-int(b.block_size[k]), int(b.addr[k])))
        shown = []
        for k in members[:BLOCKS_PER_SEGMENT]:
            site = d.sites[int(c.site[k])]
            age = (now - int(b.alloc_t[k])) / 1e9 if b.alloc_i[k] >= 0 else -1.0
            shown.append(PinningBlock(int(b.block_size[k]), site.label, site.location,
                                      d.phase_name(int(b.alloc_phase[k])), str(CATEGORIES[int(c.category[k])]), age))
        pinned.append(PinnedSegment(int(segs.start[s]), int(segs.size[s]), free, len(members), used,
                                    bool(segs.expandable[s]), shown))
    pinned.sort(key=lambda p: (-p.free, p.addr))
    plain = alive[~segs.expandable[alive]]
    holding = sum(1 for p in pinned if not p.expandable)
    empty = sum(1 for s in plain.tolist() if s not in per_seg)
    return ReserveMoment(at, i, d.time_s(i), int(d.reserved[i]), int(d.allocated[i]), int(lv.fragmented[i]),
                         int(lv.cached[i]), int(lv.mapped_free[i]), int(lv.before_log[i]), int(alive.size), holding,
                         empty, pinned[:PINNED_SHOWN])


def recording_policy(d: Derived) -> str:
    """The policy most of the log's allocations name, with +expandable when it mapped expandable segments."""
    t = d.table
    ids = t.policy[t.kind == ALLOC]
    if not ids.size:
        return "caching"
    name = POLICY_NAMES.get(int(np.bincount(ids).argmax()), "caching")
    segs = (t.kind == SEGMENT_ALLOC) & ((t.flags & SEGMENT_EXPANDABLE) != 0)
    return name + "+expandable" if bool(np.any(segs)) and name != "exact" else name


def replays(d: Derived, policies: tuple[str, ...] = DEFAULT_POLICIES) -> tuple[str, list[ReplayRow]]:
    """The whole run replayed, without a capacity, under `policies` (the recording one first in the result)."""
    t = d.table
    b = d.blocks
    pre = np.flatnonzero((b.alloc_i < 0) & (b.size > 0))
    before = [(int(b.addr[k]), int(b.size[k]), int(b.stream[k]), 0) for k in pre.tolist()]
    events = events_until(t, len(t) - 1, before, request=False)
    mine = recording_policy(d)
    names = list(dict.fromkeys((mine, *policies)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # a replay releases the GIL
        results = list(pool.map(lambda p: replay_once(events, p, 0)[0], names))
    rows = [ReplayRow(p, int(r["peak_reserved"]), int(r["peak_allocated"]), p == mine, bool(r["oom"]),
                      int(r.get("synchronizes", 0)))
            for p, r in zip(names, results)]
    return mine, [rows[0], *sorted(rows[1:], key=lambda r: (r.peak_reserved, r.policy))]


def reserve(d: Derived, *, replay: bool = True) -> Reserve:
    """Reserved memory explained at the peaks of reserved and allocated, and the policies' replays."""
    if not len(d.table):
        return Reserve([], "caching", [], [])
    segs = segments(d)
    owner = block_segments(d, segs)
    lv = levels(d, segs, owner)
    peak_r = int(np.argmax(d.reserved))
    moments = [moment(d, lv, segs, owner, peak_r, "peak reserved")]
    if d.timeline.peak_index != peak_r:
        moments.append(moment(d, lv, segs, owner, d.timeline.peak_index, "peak allocated"))
    unknown: list[str] = []
    if not segs.start.size:
        unknown.append("the segments (the log has no segment records): reserved cannot be split")
    mine, rows = recording_policy(d), []
    if replay:
        try:
            mine, rows = replays(d)
        except _lib.LibraryError as e:
            unknown.append(f"what other policies would have reserved (the replay needs the library: {e})")
    return Reserve(moments, mine, rows, unknown)


def series(d: Derived) -> Levels:
    """The terms after every event, for the timeline's bands."""
    segs = segments(d)
    return levels(d, segs, block_segments(d, segs))
