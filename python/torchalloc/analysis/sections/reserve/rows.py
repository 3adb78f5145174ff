"""Reserved memory explained: where the bytes reserved beyond the allocated ones go, and what would have saved them.

Holds the section's rows -- a `Reserve`, its `ReserveMoment`s (with their
`PinnedSegment`s and `PinningBlock`s) and `ReplayRow`s -- the functions
the section (reserve/__init__.py) builds them with (`moment`,
`policy_name`, `replayed`, `replay_rows`, `assembled`), and their words
(`reserve_sentences`, `pinned_lines`, `replay_note`; `setting_of`, a replay
policy's TORCHALLOC_CONF, is replay/engine.py's):

- `moments`: at the peak of reserved and at the peak of allocated,
  reserved = allocated + fragmented (free bytes in segments that hold live
  blocks) + cached (segments with no live block) + mapped_free (free bytes
  in the mapped granules of expandable segments) + before_log (segments
  made before the log began: the log does not know them, so their free
  bytes and any block outside the segments it saw count here). The terms
  come from running sums of the segment and block records, so they add up
  by construction. With them, the segments holding the most free bytes
  that live blocks pin, and those blocks (site, phase, category, age).
- `replays`: the whole run replayed under every policy and variant on the
  simulated device (replay/engine.py, the code that serves the GPU), the
  recording policy's own replay first: what each would have reserved at
  its peak on the same events. The best one is the change that would have
  saved the most.

The segments, which of them holds each block, and the running sums the
terms come from are computed piece by piece in terms.py, which the
section's follower feeds the second pass' pieces; the moments and the rows
are built from them here.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from .... import _lib
from ...._records import POLICY_NAMES, SEGMENT_COMPACT, SEGMENT_RECLAIM
from ....replay.engine import DEFAULT_POLICIES, setting_of
from ....units import fmt_bytes, fmt_seconds, fmt_times
from .terms import Segments

PINNED_SHOWN = 5  # segments listed per moment
BLOCKS_PER_SEGMENT = 4  # pinning blocks listed per segment


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
    sentences: list[str] = dataclasses.field(default_factory=list)  # reserve_sentences

    @property
    def best(self) -> ReplayRow | None:
        """The replay that reserves the least, when it beats the recording policy's replay."""
        if not self.replays:
            return None
        base = self.replays[0]
        best = min(self.replays, key=ReplayRow.rank)
        return best if best.peak_reserved < base.peak_reserved and not best.recording else None

    def best_cached(self) -> ReplayRow | None:
        """When the best is exact (no cache: every request goes to the device), the best policy that keeps a
        cache and still reserves less than the recording one; else None."""
        best = self.best
        if best is None or best.policy != "exact":
            return None
        base = self.replays[0]
        cached = [x for x in self.replays if x.policy != "exact" and not x.recording and not x.oom
                  and x.peak_reserved < base.peak_reserved]
        return min(cached, key=ReplayRow.rank) if cached else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"moments": [m.to_dict() for m in self.moments], "recording_policy": self.recording_policy,
                "replays": [r.to_dict() for r in self.replays], "best": best.policy if best else None,
                "unknown": list(self.unknown), "sentences": list(self.sentences)}


def moment(at: str, i: int, t_s: float, now_ns: int, terms: Sequence[int], segs: Segments,
           live: dict[str, np.ndarray], describe: Callable[[int], tuple[str, str, str, str]]) -> ReserveMoment:
    """The terms at event i (reserved, allocated, fragmented, cached, mapped_free, before_log), and the segments
    with the most free bytes that live blocks pin. `live`: the blocks live then that a segment holds, in the
    blocks' order (columns owner, block_size, addr, alloc_t); describe(j): the site label, location, phase and
    category of the j-th of them; `segs`: the rows held then (Terms.at)."""
    per_seg: dict[int, list[int]] = {}
    for j, s in enumerate(segs.rows(live["owner"]).tolist()):
        per_seg.setdefault(s, []).append(j)
    alive = np.flatnonzero((segs.alloc_i <= i) & (segs.free_i > i))
    size, addr = live["block_size"], live["addr"]
    pinned = []
    for s, members in per_seg.items():
        used = int(size[members].sum())
        free = int(segs.size[s]) - used
        if free <= 0:
            continue
        members.sort(key=lambda j: (-int(size[j]), int(addr[j])))
        shown = [PinningBlock(int(size[j]), *describe(j), (now_ns - int(live["alloc_t"][j])) / 1e9)
                 for j in members[:BLOCKS_PER_SEGMENT]]
        pinned.append(PinnedSegment(int(segs.start[s]), int(segs.size[s]), free, len(members), used,
                                    bool(segs.expandable[s]), shown))
    pinned.sort(key=lambda p: (-p.free, p.addr))
    plain = alive[~segs.expandable[alive]]
    holding = sum(1 for p in pinned if not p.expandable)
    empty = sum(1 for s in plain.tolist() if s not in per_seg)
    reserved, allocated, fragmented, cached, mapped_free, before_log = (int(x) for x in terms)
    return ReserveMoment(at, i, t_s, reserved, allocated, fragmented, cached, mapped_free, before_log,
                         int(alive.size), holding, empty, pinned[:PINNED_SHOWN])


def policy_name(policies: np.ndarray, expandable: int) -> str:
    """The policy most allocations name (`policies`: allocations per policy id), with its variant when the log
    mapped expandable segments (`expandable`: their SEGMENT_* flags or-ed; logs before the mode flags say only
    +expandable)."""
    if not policies.any():
        return "caching"
    name = POLICY_NAMES.get(int(np.argmax(policies)), "caching")
    if not expandable or name == "exact":
        return name
    return name + ("+reclaim" if expandable & SEGMENT_RECLAIM else "+compact" if expandable & SEGMENT_COMPACT
                   else "+expandable")


def replay_rows(mine: str, names: list[str], results: list[dict[str, Any]]) -> list[ReplayRow]:
    """The replays' rows: the recording policy's first, then the others, least reserved first."""
    rows = [ReplayRow(p, int(r["peak_reserved"]), int(r["peak_allocated"]), p == mine, bool(r["oom"]),
                      int(r.get("synchronizes", 0)))
            for p, r in zip(names, results)]
    return [rows[0], *sorted(rows[1:], key=lambda r: (r.peak_reserved, r.policy))]


def replayed(mine: str, policies: tuple[str, ...] = DEFAULT_POLICIES) -> list[str]:
    """The policies replayed, the recording one first."""
    return list(dict.fromkeys((mine, *policies)))


def assembled(moments: list[ReserveMoment], segments: int, mine: str,
              replay: Callable[[], tuple[str, list[ReplayRow]]] | None) -> Reserve:
    """The section from its moments, the number of segment rows, the recording policy and the replays (asked
    for here: without the library, a line in `unknown` says why there are none)."""
    unknown: list[str] = []
    if not segments:
        unknown.append("the segments (the log has no segment records): reserved cannot be split")
    rows: list[ReplayRow] = []
    if replay is not None:
        try:
            mine, rows = replay()
        except _lib.LibraryError as e:
            unknown.append(f"what other policies would have reserved (the replay needs the library: {e})")
    return Reserve(moments, mine, rows, unknown)


def moment_sentence(m: ReserveMoment, when: str) -> str:
    """'At the peak reserved (t=...): 11.53 GiB reserved = 4.64 GiB allocated + ... (fragmentation) + ... (cache).'"""
    terms = [f"{fmt_bytes(m.allocated)} allocated",
             f"{fmt_bytes(m.fragmented)} free in the {m.holding} segments that hold live blocks (fragmentation)",
             f"{fmt_bytes(m.cached)} in {m.empty} wholly free segments (cache)"]
    if m.mapped_free:
        terms.append(f"{fmt_bytes(m.mapped_free)} in mapped but free granules of expandable segments")
    if m.before_log:
        terms.append(f"{fmt_bytes(m.before_log)} free in segments made before the log began (it does not show them)")
    return f"At the {m.at} ({when}): {fmt_bytes(m.reserved)} reserved = " + " + ".join(terms) + "."


def pinned_lines(p: PinnedSegment) -> list[str]:
    """A segment that live blocks pin, and its largest live blocks, one line each."""
    kind = "expandable range" if p.expandable else "segment"
    head = (f"{kind} {p.addr:#x} of {fmt_bytes(p.size)}: {fmt_bytes(p.free)} free, pinned by {p.live_blocks} live "
            f"block{'s' if p.live_blocks != 1 else ''} ({fmt_bytes(p.live_bytes)})")
    lines = [head]
    for b in p.blocks:
        age = f"{fmt_seconds(b.age_s)} old" if b.age_s >= 0 else "from before the log"
        lines.append(f"  {fmt_bytes(b.size):>10}  {b.site}  phase {b.phase}, {b.category}, {age}")
    return lines


def replay_note(r: ReplayRow, base: ReplayRow) -> str:
    """What a replay row is, beside the recording policy's replay."""
    if r.recording:
        return "the policy that recorded the log, replayed"
    if r.oom:
        return "ran out of memory on the simulated device"
    diff = base.peak_reserved - r.peak_reserved
    if r.policy == "exact":
        return ("no cache: every request asks the device (slow on a GPU)" if diff >= 0
                else "no cache: every request asks the device")
    return f"saves {fmt_bytes(diff)}" if diff > 0 else f"reserves {fmt_bytes(-diff)} more" if diff < 0 else "the same"


def reserve_sentences(r: Reserve, log_peak_reserved: int) -> list[str]:
    """The moments' sums, the best change, and why phase_arena loses when it does."""
    out = [moment_sentence(m, when) for m, when in zip(r.moments, fmt_times([m.t_s for m in r.moments]))]
    if r.unknown:
        out.append("Not known from this log: " + "; ".join(r.unknown) + ".")
    if not r.replays:
        return out
    base = r.replays[0]
    match = ("the same as the log's" if base.peak_reserved == log_peak_reserved
             else f"the log's own peak is {fmt_bytes(log_peak_reserved)}")
    out.append(f"Replayed on the simulated device (no memory limit), {base.policy}, the policy that recorded the log, "
               f"reserves {fmt_bytes(base.peak_reserved)} at its peak ({match}).")
    best = r.best
    if best is None:
        out.append(f"No other policy or variant would have reserved less than {base.policy} on these events.")
    else:
        saved = base.peak_reserved - best.peak_reserved
        sentence = (f"The one change that would have saved the most: TORCHALLOC_CONF={setting_of(best.policy)} "
                    f"({best.policy}) reserves {fmt_bytes(best.peak_reserved)}, {fmt_bytes(saved)} less")
        if best.policy == "exact":
            c = r.best_cached()
            sentence += ", but with no cache every request asks the device (slow on a GPU)"
            if c is not None:
                sentence += (f"; of the policies that keep a cache, TORCHALLOC_CONF={setting_of(c.policy)} saves "
                             f"{fmt_bytes(base.peak_reserved - c.peak_reserved)} (reserves "
                             f"{fmt_bytes(c.peak_reserved)})")
        out.append(sentence + ".")
    arena = next((x for x in r.replays if x.policy == "phase_arena"), None)
    caching = next((x for x in r.replays if x.policy == "caching"), None)
    if arena is not None and caching is not None and arena.peak_reserved > caching.peak_reserved * 1.1:
        out.append(f"phase_arena loses here: {fmt_bytes(arena.peak_reserved)} reserved, "
                   f"{arena.peak_reserved / max(1, caching.peak_reserved):.2f}x caching's "
                   f"{fmt_bytes(caching.peak_reserved)}. Each phase has its own arena and an arena does not lend its "
                   "free segments to another phase, so every phase reserves for its own peak and the reserves add "
                   "up. It pays only when long-lived blocks of one phase (optimizer state, say) would otherwise "
                   "pin segments whose free ranges other phases' transients then cannot use; when each phase's "
                   "transients are large and come and go (as here), one shared cache (caching) reserves less.")
    return out
