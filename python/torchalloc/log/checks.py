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
(allocator/common.h) is ever served, logged or recorded in an OOM (entry.c
refuses it before the heap sees it), so no block or segment exceeds that
request rounded up to 2 MiB, and no device or total comes near 2^50 bytes;
phase ids are below TORCHALLOC_MAX_PHASES.
"""
from __future__ import annotations

import numpy as np

from .._lib import MAX_PHASES
from .._records import (
    ALLOC,
    FREE,
    OOM,
    OOM_DEVICE,
    PHASE_BEGIN,
    PHASE_END,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    TRIM,
)
from .reader import LogFormatError

MAX_REQUEST = (1 << 40) - (2 << 20)  # TA_MAX_REQUEST: larger requests are refused before they reach a heap
MAX_BLOCK = 1 << 40  # the largest request rounded up: no block or segment is larger
MAX_TOTAL = 1 << 50  # device totals, reserved bytes at an OOM: beyond any device
# All the bytes a log's blocks and segments ever take, added up: below this no level summed in int64 can
# overflow (4 EiB; a run allocating 100 GB a second would need a year and a half to reach it).
MAX_SUM = 1 << 62
LISTED = 5  # records named per kind of problem; the rest are counted
HEADER_SIZE = 128
RECORD_SIZE = 64

_BLOCKS = (ALLOC, FREE)
_SEGMENTS = (SEGMENT_ALLOC, SEGMENT_FREE)
_ABOUT_A_DEVICE = _BLOCKS + _SEGMENTS + (OOM, OOM_DEVICE)


def _over(values: np.ndarray, limit: int) -> np.ndarray:
    return values.astype(np.uint64) > np.uint64(limit)


def _size_problems(r: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """(mask, why) for each impossible field value."""
    kind = r["kind"]
    blocks, segments = np.isin(kind, _BLOCKS), np.isin(kind, _SEGMENTS)
    oom, oom_device = kind == OOM, kind == OOM_DEVICE
    return [
        (r["phase"] >= MAX_PHASES, f"a phase id above {MAX_PHASES - 1} (a process has at most {MAX_PHASES} phases)"),
        (np.isin(kind, _ABOUT_A_DEVICE) & (r["device"] < 0), "a block, segment or OOM record about no device"),
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
    ]


def _phase_problems(r: np.ndarray, dropped: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """Phase records that break docs/LOG_FORMAT.md's rule: each (phase, occurrence) begins once,
    before it ends, and ends at most once."""
    idx = np.flatnonzero(np.isin(r["kind"], (PHASE_BEGIN, PHASE_END)) & ~dropped)
    again = np.zeros(len(r), dtype=bool)
    unopened = np.zeros(len(r), dtype=bool)
    state: dict[tuple[int, int], bool] = {}  # (phase, occurrence) -> still open
    kinds, phases, occurrences = r["kind"][idx].tolist(), r["phase"][idx].tolist(), r["size"][idx].tolist()
    for i, kind, phase, occurrence in zip(idx.tolist(), kinds, phases, occurrences):
        key = (phase, occurrence)
        if kind == PHASE_BEGIN:
            if key in state:
                again[i] = True
            else:
                state[key] = True
        elif not state.get(key, False):
            unopened[i] = True
        else:
            state[key] = False
    return [(again, "a phase occurrence begun a second time"),
            (unopened, "a phase end with no open occurrence of that phase and number")]


def _where(r: np.ndarray, at: np.ndarray, header_size: int) -> str:
    seqs = r["seq"][at[:LISTED]].tolist()
    shown = ", ".join(f"record {s} (byte offset {header_size + s * RECORD_SIZE})" for s in seqs)
    return shown + (f" and {at.size - LISTED} more" if at.size > LISTED else "")


def impossible(records: np.ndarray, *, header_size: int = HEADER_SIZE, path: str = "the log"
               ) -> tuple[np.ndarray, list[str]]:
    """A mask of the records no torchalloc writer produces, and one line per kind of problem naming them
    ("2 impossible records (why): record 5 (byte offset 448), record 6 (byte offset 512)").

    `records` is `Log.records` (torchalloc.log.RECORD_DTYPE); a record's
    byte offset is found from its sequence number. LogFormatError when the
    sane records' blocks and segments add up to more than MAX_SUM bytes:
    no record is to blame then, and int64 levels could overflow.
    """
    bad = np.zeros(len(records), dtype=bool)
    notes: list[str] = []
    sizes = _size_problems(records)
    dropped_for_size = np.logical_or.reduce([mask for mask, _ in sizes]) if len(records) else bad
    for mask, why in sizes + _phase_problems(records, dropped_for_size):
        at = np.flatnonzero(mask & ~bad)  # each record named once, for its first problem
        if at.size:
            bad |= mask
            notes.append(f"{at.size} impossible record{'s' if at.size > 1 else ''} ({why}): "
                         f"{_where(records, at, header_size)}")
    kind, kept = records["kind"], ~bad
    total = (float(records["block_size"][kept & (kind == ALLOC)].sum(dtype=np.float64))
             + float(records["size"][kept & (kind == SEGMENT_ALLOC)].sum(dtype=np.float64)))
    if total > MAX_SUM:
        raise LogFormatError(f"{path}: its blocks and segments add up to {total:.3g} bytes, more than {MAX_SUM} "
                             "(2^62): beyond what 64-bit sums hold, and beyond any real run; a damaged or "
                             "hand-made log")
    return bad, notes
