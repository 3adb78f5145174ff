"""Records no torchalloc writer produces, in a log whose checksums hold.

A checksum says a record is as written, not that torchalloc wrote it: a
hand-made log, a log from a broken tool, or one a bug wrote can hold
an allocation of 2^63 bytes, a block record about no device, or a phase
occurrence begun twice. Summed into int64 levels such records give a wrong
peak or an exception deep in the analysis, so the tools check every record
first (`impossible`): `report` and `export` drop the ones that cannot be
and say so in a note naming each (its sequence number and byte offset) and
why; `replay` refuses the log, naming the first.

The bounds are the C core's: no request above TA_MAX_REQUEST
(allocator/base/common.h) is ever served, logged or recorded in an OOM (alloc_api.c
refuses it before the heap sees it), so no block or segment exceeds that
request rounded up to 2 MiB, and no device or total comes near 2^50 bytes;
phase ids are below TORCHALLOC_MAX_PHASES. Record times are below 2^63 ns
(CLOCK_MONOTONIC would need 292 years of uptime; past it int64 times wrap).

Every reader of event records applies these checks: read_log's callers,
the pieces of a ChunkedLog (report, export, replay) and `top`'s LiveReader.
"""
from __future__ import annotations

import numpy as np

from .._lib import MAX_PHASES
from .._records import (
    ALLOC,
    DEVICE,
    FREE,
    OOM,
    OOM_DEVICE,
    PHASE_BEGIN,
    PHASE_END,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    TRIM,
)
from .format import HEADER_SIZE, RECORD_SIZE, LogFormatError

MAX_REQUEST = (1 << 40) - (2 << 20)  # TA_MAX_REQUEST: larger requests are refused before they reach a heap
MAX_BLOCK = 1 << 40  # the largest request rounded up: no block or segment is larger
MAX_TOTAL = 1 << 50  # device totals, reserved bytes at an OOM: beyond any device
# All the bytes a log's blocks and segments ever take, added up: below this no level summed in int64 can
# overflow (4 EiB; a run allocating 100 GB a second would need a year and a half to reach it).
MAX_SUM = 1 << 62
MAX_TIME_NS = (1 << 63) - 1  # the latest time an int64 holds: every tool computes with signed times
LISTED = 5  # records named per kind of problem; the rest are counted

_BLOCKS = (ALLOC, FREE)
_SEGMENTS = (SEGMENT_ALLOC, SEGMENT_FREE)
_ABOUT_A_DEVICE = _BLOCKS + _SEGMENTS + (OOM, OOM_DEVICE, DEVICE)


def _over(values: np.ndarray, limit: int) -> np.ndarray:
    return values.astype(np.uint64) > np.uint64(limit)


def _size_problems(r: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """(mask, why) for each impossible field value."""
    kind = r["kind"]
    blocks, segments = np.isin(kind, _BLOCKS), np.isin(kind, _SEGMENTS)
    oom, oom_device = kind == OOM, kind == OOM_DEVICE
    return [
        (_over(r["time_ns"], MAX_TIME_NS), "a time at or past 2^63 ns (no clock reaches it)"),
        (r["phase"] >= MAX_PHASES, f"a phase id above {MAX_PHASES - 1} (a process has at most {MAX_PHASES} phases)"),
        (np.isin(kind, _ABOUT_A_DEVICE) & (r["device"] < 0), "a block, segment, OOM or device record about no device"),
        (blocks & _over(r["size"], MAX_REQUEST), f"a block of more than {MAX_REQUEST} bytes requested "
         "(the largest request the allocator accepts)"),
        (blocks & _over(r["block_size"], MAX_BLOCK), f"a block of more than {MAX_BLOCK} bytes"),
        (segments & _over(r["size"], MAX_BLOCK), f"a segment of more than {MAX_BLOCK} bytes"),
        (oom & _over(r["size"], MAX_REQUEST), f"an OOM asking for more than {MAX_REQUEST} bytes "
         "(larger requests are refused without an OOM)"),
        (oom & (_over(r["block_size"], MAX_TOTAL) | _over(r["addr"], MAX_TOTAL)),
         f"an OOM with more than {MAX_TOTAL} bytes reserved or free"),
        (oom_device & (_over(r["addr"], MAX_TOTAL) | _over(r["size"], MAX_TOTAL) | _over(r["block_size"], MAX_TOTAL)
                       | _over(r["stream"], MAX_TOTAL)), f"an OOM device record with more than {MAX_TOTAL} bytes"),
        ((kind == TRIM) & _over(r["size"], MAX_TOTAL), f"a trim of more than {MAX_TOTAL} bytes"),
        ((kind == DEVICE) & (_over(r["addr"], MAX_TOTAL) | _over(r["size"], MAX_TOTAL)),
         f"a device record with more than {MAX_TOTAL} bytes"),
    ]


class PhaseStates:
    """The state of every (phase, occurrence) seen: open (True) or ended (False). Occurrences ended in a run
    from the first one seen of a phase are kept as a range, so a log of millions of occurrences holds only
    its open ones (and any out of order)."""

    def __init__(self) -> None:
        self.rest: dict[tuple[int, int], bool] = {}
        self.ended: dict[int, tuple[int, int]] = {}  # phase -> [lo, hi): occurrences all ended

    def get(self, key: tuple[int, int]) -> bool | None:
        lo, hi = self.ended.get(key[0], (0, 0))
        return False if lo <= key[1] < hi else self.rest.get(key)

    def set(self, key: tuple[int, int], open_: bool) -> None:
        phase, occurrence = key
        self.rest[key] = open_
        lo, hi = self.ended.setdefault(phase, (occurrence, occurrence))
        while self.rest.get((phase, hi)) is False:
            del self.rest[(phase, hi)]
            hi += 1
        self.ended[phase] = (lo, hi)


def _phase_problems(r: np.ndarray, dropped: np.ndarray, state: PhaseStates | None = None
                    ) -> list[tuple[np.ndarray, str]]:
    """Phase records that break docs/LOG_FORMAT.md's rule: each (phase, occurrence) begins once,
    before it ends, and ends at most once. `state`: what earlier pieces of the log left."""
    idx = np.flatnonzero(np.isin(r["kind"], (PHASE_BEGIN, PHASE_END)) & ~dropped)
    again = np.zeros(len(r), dtype=bool)
    unopened = np.zeros(len(r), dtype=bool)
    state = PhaseStates() if state is None else state
    kinds, phases, occurrences = r["kind"][idx].tolist(), r["phase"][idx].tolist(), r["size"][idx].tolist()
    for i, kind, phase, occurrence in zip(idx.tolist(), kinds, phases, occurrences):
        key = (phase, occurrence)
        if kind == PHASE_BEGIN:
            if state.get(key) is not None:
                again[i] = True
            else:
                state.set(key, True)
        elif not state.get(key):
            unopened[i] = True
        else:
            state.set(key, False)
    return [(again, "a phase occurrence begun a second time"),
            (unopened, "a phase end with no open occurrence of that phase and number")]


def impossible(records: np.ndarray, *, header_size: int = HEADER_SIZE, path: str = "the log"
               ) -> tuple[np.ndarray, list[str]]:
    """A mask of the records no torchalloc writer produces, and one line per kind of problem naming them
    ("2 impossible records (why): record 5 (byte offset 448), record 6 (byte offset 512)").

    `records` is `Log.records` (torchalloc.log.RECORD_DTYPE); a record's
    byte offset is found from its sequence number. LogFormatError when the
    sane records' blocks and segments add up to more than MAX_SUM bytes:
    no record is to blame then, and int64 levels could overflow.
    """
    checker = Checker(header_size=header_size, path=path)
    bad = checker.piece(records)
    total = checker.total
    if total > MAX_SUM:
        raise LogFormatError(f"{path}: its blocks and segments add up to {total:.3g} bytes, more than {MAX_SUM} "
                             "(2^62): beyond what 64-bit sums hold, and beyond any real run; a damaged or "
                             "hand-made log")
    return bad, checker.notes()


class Checker:
    """`impossible` over a log read in pieces (log/chunks.py), in order: `piece` gives each piece's mask,
    `notes` the same lines `impossible` gives for all the records at once, once every piece was seen. The phase rule
    carries across pieces (PhaseStates); the sum is checked as it grows, so a log past MAX_SUM is refused
    at the piece that takes it there."""

    def __init__(self, *, header_size: int = HEADER_SIZE, path: str = "the log") -> None:
        self.header_size, self.path = header_size, path
        self.phases = PhaseStates()
        self.total = 0.0
        self.counts: dict[str, int] = {}  # why -> records, in the order the reasons are listed
        self.shown: dict[str, list[str]] = {}  # why -> the first LISTED records, named
        self.order: list[str] = []

    def piece(self, records: np.ndarray) -> np.ndarray:
        bad = np.zeros(len(records), dtype=bool)
        sizes = _size_problems(records)
        dropped_for_size = np.logical_or.reduce([mask for mask, _ in sizes]) if len(records) else bad
        for mask, why in sizes + _phase_problems(records, dropped_for_size, self.phases):
            if why not in self.counts:
                self.counts[why], self.shown[why] = 0, []
                self.order.append(why)
            at = np.flatnonzero(mask & ~bad)  # each record named once, for its first problem
            if at.size:
                bad |= mask
                self.counts[why] += int(at.size)
                room = LISTED - len(self.shown[why])
                self.shown[why] += [f"record {s} (byte offset {self.header_size + s * RECORD_SIZE})"
                                    for s in records["seq"][at[:room]].tolist()] if room > 0 else []
        kind, kept = records["kind"], ~bad
        self.total += (float(records["block_size"][kept & (kind == ALLOC)].sum(dtype=np.float64))
                       + float(records["size"][kept & (kind == SEGMENT_ALLOC)].sum(dtype=np.float64)))
        return bad

    def check_sum(self) -> None:
        """LogFormatError once the sum passed MAX_SUM (a lower bound of the log's: pieces may follow)."""
        if self.total > MAX_SUM:
            raise LogFormatError(f"{self.path}: its blocks and segments add up to {self.total:.3g} bytes or more, "
                                 f"more than {MAX_SUM} (2^62): beyond what 64-bit sums hold, and beyond any real "
                                 "run; a damaged or hand-made log")

    def notes(self) -> list[str]:
        out = []
        for why in self.order:
            n = self.counts[why]
            if n:
                shown = ", ".join(self.shown[why])
                out.append(f"{n} impossible record{'s' if n > 1 else ''} ({why}): {shown}"
                           + (f" and {n - LISTED} more" if n > LISTED else ""))
        return out
