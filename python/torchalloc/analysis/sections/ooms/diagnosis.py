"""Out of memory: for each OOM record, the verdict, the blocks to blame and the check by replay.

Holds `OomRow` and the steps the OOM section (ooms/__init__.py) builds
one per OOM record with, from the records the first pass found, the
blocks the second pass kept live at each failure and the segments its
follower kept:

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
- `advice`: the allocator's advice for the numbers the log has (the one
  rule, `_lib.oom_advice`, given the facts and the detail this module reads
  from the segments and live blocks at the failure: free bytes in whole
  granules of the request's handle size (handle_for), the phases of the
  blocks that pin the fragmented segments), each line checked by the
  replay that tests it;
- `alternatives` (the last OOM of the log only: each takes a few dozen
  replays): the run up to the failure replayed under every policy and
  variant at the capacity torchalloc could use (oom_alternatives.py), and
  from them the advice's checks ("confirmed by replay: caching+reclaim
  fits, peak reserved ...");
- `unknown`: what the log could not tell (device numbers in an old log, sites
  without stacks, the capacity without device numbers).

The explanation is written last, in words (`oom_explanation`): the
verdict with the numbers behind it, the blocks to blame and what the
replays showed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .... import _lib
from ....log.chunks import ChunkedLog
from ....oom import parse_advice
from ....replay.oom_alternatives import (AdviceCheck, Alternative, alternatives, check_advice, default_policies)
from ....units import fmt_bytes, fmt_seconds
from ...passes.first import Scan, before_log_events
from ...rules.frames import user_suffix
from ...rules.sites import NO_PYTHON, NO_STACKS

BLOCKERS_SHOWN = 10
# The physical handle a request would be mapped in under expandable segments (heap_oom.c note_detail), which the
# advice counts whole free granules in: the oom_device record says (docs/LOG_FORMAT.md); an older log does not, and
# then it is the pool's default: the small pool's (requests up to 1 MiB, size_classes.h ta_pool_for) CUDA's 2 MiB
# granule, the large pool's the default of TORCHALLOC_CONF `handle` (config.h TA_DEFAULT_LARGE_HANDLE).
SMALL_POOL_MAX = 1 << 20
SMALL_HANDLE = 2 << 20
LARGE_HANDLE = 8 << 20


def handle_for(requested: int, logged: int = 0) -> int:
    """The handle size the advice for a request of `requested` bytes counts in: `logged` (its oom_device
    record's) where the log has it, else the default of the pool the request goes to."""
    return logged or (SMALL_HANDLE if requested <= SMALL_POOL_MAX else LARGE_HANDLE)


NOT_REPLAYED = "not checked: only the last failure of a log is replayed"


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
    policy: str = ""  # the failing policy, as the log's allocations before it say
    expandable: int = 0  # 1 when the log saw expandable segments (expandable:1, 2 or 3; it cannot tell which)
    advice: list[AdviceCheck] = dataclasses.field(default_factory=list)

    @property
    def fragmentation(self) -> bool:
        return self.verdict == "fragmentation"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["fragmentation"] = self.fragmentation
        return d


def replay_last(last: OomRow, run_until: Callable[[], Any]) -> None:
    """The last OOM's alternatives and its advice checked: `run_until()` gives the run up to the failure, as
    replay events or a Trace read in pieces (trace_until; its pieces are closed after)."""
    if last.usable is None:
        last.unknown.append("whether another policy would have fit (the log has no device numbers)")
        return
    try:
        events = run_until()
        try:
            last.alternatives = alternatives(events, last.usable, default_policies())
            last.advice = check_advice(last.advice, last.alternatives, events, policy=last.policy,
                                       expandable=last.expandable, capacity=last.usable,
                                       device_total=last.device_total or 0, limit=last.limit or 0)
            _note_unreproduced(last)
        finally:
            chunks = getattr(events, "chunks", None)
            if chunks is not None:
                chunks.close()
    except _lib.LibraryError as e:
        last.unknown.append(f"whether another policy would have fit (the replay needs the library: {e})")


def trace_until(log: ChunkedLog, scan: Scan, path: Any, index: int) -> Any:
    """The run up to OOM record `index` as a Trace in pieces: the blocks from before the log, the device's
    events up to the record, then the failed request (at an address no event uses)."""
    from ....log.trace_events import ALLOC as EV_ALLOC
    from ....log.trace_events import EVENT_DTYPE, Trace
    from ....log.trace_stream import SpilledEvents, LivePeaks, log_events
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
    peaks = LivePeaks()
    for piece in spilled.pieces():
        peaks.piece(piece)
    trace = Trace(events=np.zeros(0, dtype=EVENT_DTYPE), source="torchalloc-log",
                  peak_requested=int(peaks.peak[0]), peak_rounded=int(peaks.peak[1]))
    trace.chunks = spilled
    return trace


def _note_unreproduced(row: OomRow) -> None:
    """Say so when the replay of the failing policy itself fits: then no check of the advice is a proof."""
    failing = row.policy + ("+expandable" if row.expandable and row.policy != "exact" else "")
    alt = next((a for a in row.alternatives if a.policy == failing), None)
    if alt is not None and alt.fits:
        row.unknown.append(f"why the run failed where its replay does not: {failing} replayed up to the failure fits "
                           "(the log does not show what else took the room: other streams' pending frees, "
                           "memory freed late)")


def oom_row(t_s: float, i: int, requested: int, stream: int, phase: str, stack: Any, reserved: int, allocated: int,
            largest: int, nseg: int, device_free: int, device: tuple[int, int, int, int] | None, has_stacks: bool,
            blockers: Any, policy: str, expandable: int, detail: Any, phase_names: dict[int, str]) -> OomRow:
    """An OOM record diagnosed from its numbers: `device` is its oom_device record's (total, limit, largest free on
    the stream, verdict code), None in a log before them; `blockers(fragmentation)` gives the blocks to blame,
    `detail()` torchalloc_oom_detail's fields for the advice (oom_detail)."""
    user = user_suffix(stack)
    site = user[0].short() if user else (NO_PYTHON.label if has_stacks else NO_STACKS.label)
    unknown: list[str] = []
    total = free = limit = on_stream = held = usable = None
    if device is not None:
        total, limit, on_stream = device[0], device[1], device[2]
        free = device_free
        held = max(0, total - free - reserved)
        usable = min(total - held, limit or total)
    else:
        unknown.append("the device's total and free memory and the memory fraction (the log predates them)")
    code = device[3] if device is not None else 0
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
    if not has_stacks:
        unknown.append("allocation sites (logged without stacks:1)")
    advice: list[AdviceCheck] = []
    if verdict in _lib.OOM_VERDICTS.values():
        facts = dict(requested=requested, allocated=allocated, reserved=reserved, device_total=total or 0,
                     device_free=free or 0, limit=limit or 0, largest_free=on_stream if on_stream is not None else largest)
        try:
            text = _lib.oom_advice(facts, detail(), phase_names)
            advice = [AdviceCheck(a.number, a.text, a.setting, a.serves, None, None, NOT_REPLAYED)
                      for a in parse_advice(text)]
        except _lib.LibraryError as e:
            unknown.append(f"the advice (it needs the library: {e})")
    return OomRow(t_s, i, requested, stream, phase, site, reserved, allocated, max(0, reserved - allocated), largest,
                  nseg, total, free, limit, held, on_stream, usable, verdict, source,
                  blockers(verdict == "fragmentation"), [], unknown, "", policy, expandable, advice)


def oom_detail(segs: dict[int, int], addr: Any, size: Any, phase: Any, request_phase: int, policy: str,
               expandable: int, granule: int) -> dict[str, object]:
    """torchalloc_oom_detail's fields from the segments (address: size) and the live blocks (their addresses,
    sizes and allocating phases, -1 before the log) at the failure; `granule`: handle_for(the request)."""
    out: dict[str, object] = {"granule": granule, "phase": request_phase, "expandable": expandable,
                              "flags": (_lib.OOM_PHASE_ARENAS if policy == "phase_arena" else 0)
                              | (_lib.OOM_FREES_TO_DEVICE if policy == "exact" else 0)}
    by_addr = np.argsort(addr, kind="stable")
    # addresses as uint64: a (hand-made or damaged) log may hold segments in the top half of the address space
    addr, size = np.asarray(addr)[by_addr].astype(np.uint64), np.asarray(size)[by_addr].astype(np.int64)
    phase = np.asarray(phase)[by_addr]
    seg_addr = np.array(sorted(segs), dtype=np.uint64)
    owner = (np.searchsorted(seg_addr, addr, side="right").astype(np.int64) - 1 if seg_addr.size
             else np.zeros(0, dtype=np.int64))
    totals = dict.fromkeys(("free_granules", "free_segments", "pinned_free", "pinning", "pinning_other",
                            "pinned_segments"), 0)
    other: dict[int, int] = {}
    for s, start in enumerate(seg_addr.tolist()):
        end = start + segs[start]
        mine = np.flatnonzero(owner == s).tolist()
        if not mine:
            totals["free_segments"] += end - start
            continue
        cursor, free_b, granules, live_b = start, 0, 0, 0
        seg_other: dict[int, int] = {}
        for k in mine:
            a, z = int(addr[k]), int(size[k])
            free_b += max(0, a - cursor)
            granules += _whole_granules(cursor, a, granule)
            cursor = max(cursor, a + z)
            live_b += z
            p = int(phase[k])
            if p != request_phase and p >= 0:  # blocks from before the log have no phase
                seg_other[p] = seg_other.get(p, 0) + z
        free_b += max(0, end - cursor)
        granules += _whole_granules(cursor, end, granule)
        totals["free_granules"] += granules
        if free_b:  # a full segment pins nothing
            totals["pinned_segments"] += 1
            totals["pinned_free"] += free_b
            totals["pinning"] += live_b
            totals["pinning_other"] += sum(seg_other.values())
            for p, b in seg_other.items():
                other[p] = other.get(p, 0) + b
    out.update(totals)
    top = sorted(((b, p) for p, b in other.items()), key=lambda bp: (-bp[0], bp[1]))[:_lib.OOM_OTHER_PHASES]
    out["other_bytes"] = [b for b, _ in top]
    out["other_phases"] = [p for _, p in top]
    return out


def _whole_granules(lo: int, hi: int, granule: int) -> int:
    """Bytes of the granule-aligned granules lying wholly inside [lo, hi) (heap_oom.c whole_free_granules)."""
    first, last = -(-lo // granule) * granule, hi // granule * granule
    return max(0, last - first)


def segment_gaps(segs: dict[int, int], ids: np.ndarray, addr: np.ndarray, size: np.ndarray
                 ) -> tuple[int, int, list[tuple[int, int, list[int]]]]:
    """The largest gap between the live blocks (`ids`, at `addr` of `size` bytes) inside the segments `segs`
    (address -> size), how many segments, and per segment (free bytes, address, its live blocks' ids), most free
    first."""
    if not segs:
        return 0, 0, []
    seg_addr = np.array(sorted(segs), dtype=np.uint64)
    order = np.argsort(addr)
    live = ids[order]
    addr, size = addr[order], size[order]
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


def blockers_of(live: list[int], by_segment: list[tuple[int, int, list[int]]] | None, order: Any, blocker: Any
                ) -> list[Blocker]:
    """The blocks to blame (fragmentation: those in the segments with the most free memory, else any live one),
    largest first (`order(k)`: the sort key), as `blocker(k)` describes them."""
    if by_segment is not None:
        chosen = [k for free, _, members in by_segment if free > 0 and members for k in members][:4 * BLOCKERS_SHOWN]
    else:
        chosen = list(live)
    chosen.sort(key=order)
    return [blocker(k) for k in chosen[:BLOCKERS_SHOWN]]


def oom_explanation(o: OomRow) -> str:
    """The verdict in words, with the numbers behind it, the blocks to blame and what the replays showed."""
    parts = [_oom_verdict_sentence(o)]
    if o.blockers:
        what = "Blocks that pin the most fragmented segments" if o.fragmentation else "The largest live blocks"
        parts.append(what + ": " + "; ".join(_blocker_words(b) for b in o.blockers[:5]) + ".")
    if o.alternatives:
        parts.append(alternatives_sentence(o))
    if o.unknown:
        parts.append("Not known from this log: " + "; ".join(o.unknown) + ".")
    return " ".join(parts)


def _oom_verdict_sentence(o: OomRow) -> str:
    free, requested = o.free_in_reserved, o.requested
    if o.verdict == "fragmentation":
        said = f"fragmentation: {fmt_bytes(free)} of the {fmt_bytes(o.reserved)} torchalloc reserved was free -- "
        if free < requested:
            # The verdict (the C core's rule) can be fragmentation with less cached than asked: the device had
            # room for a new segment by its numbers. "As much as" here contradicted the numbers it stood between.
            return (said + f"less than the {fmt_bytes(requested)} asked for, so it needed a new segment, and the "
                    f"device gave none; the largest free range in the {o.segments} segments was "
                    f"{fmt_bytes(o.largest_free_range)}.")
        return (said + f"{'more than' if free > requested else 'as much as'} the {fmt_bytes(requested)} asked for "
                f"-- but split between live blocks: the largest free range in the {o.segments} segments was "
                f"{fmt_bytes(o.largest_free_range)}, and the device gave no new segment.")
    if o.verdict == "capacity":
        total = f"the device's {fmt_bytes(o.device_total)}" if o.device_total else "what the device could give"
        return (f"capacity: live tensors ({fmt_bytes(o.allocated)}) and the {fmt_bytes(requested)} asked for "
                f"exceed {total}: no allocator could have served it.")
    if o.verdict == "held elsewhere":
        why = []
        if o.held_elsewhere:
            why.append(f"{fmt_bytes(o.held_elsewhere)} of the device was held outside torchalloc (another process, "
                       "another allocator, the CUDA context)")
        if o.limit:
            why.append(f"a memory fraction capped torchalloc at {fmt_bytes(o.limit)}")
        return (f"held elsewhere: {' and '.join(why) or 'the device had no room'}, although live tensors and the "
                f"request ({fmt_bytes(o.allocated + requested)}) fit the device.")
    return f"Verdict: {o.verdict}."


def _blocker_words(b: Any) -> str:
    age = f", {fmt_seconds(b.age_s)} old" if b.age_s >= 0 else ", from before the log"
    return f"{fmt_bytes(b.size)} at {b.site} (phase {b.phase}{age})"


def alternatives_sentence(o: OomRow) -> str:
    """'Replayed up to the failure: phase_arena would have needed 120.0 MiB and fits; caching ...'."""
    assert o.usable is not None
    said = []
    for k, alt in enumerate(o.alternatives):
        verb = "would have needed" if k == 0 else "needed"
        fit = "fits" if alt.fits else "does not fit"
        cost = " (but one device call per request: slow)" if alt.policy == "exact" else ""
        said.append(f"{alt.policy} {verb} {fmt_bytes(alt.needed)} and {fit}{cost}")
    cap = (f"the device has {fmt_bytes(o.usable)}" if not o.limit and not o.held_elsewhere
           else f"torchalloc could use {fmt_bytes(o.usable)}")
    return "Replayed up to the failure: " + "; ".join(said) + f"; {cap}."
