"""The analysis' common ground: one device's events piece by piece, and blocks paired across pieces.

Takes the pieces of a `ChunkedLog` (log/chunks.py); gives, per piece, a
`PieceTable` of the device's rows (the columns below; `base` is the index
of its first row in the whole device table) and `pair_piece`, which pairs
each alloc with the next event on its address, carrying the blocks still
live from one piece to the next (`Carry`). Both passes of the analysis
pair the same way, so a block has the same ordinal (its alloc's rank among
the device's allocs) in both. And the report's time zero,
`report_start_ns`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np

from ..._records import ALLOC, FREE
from ...log.chunks import ChunkedLog

# The columns a piece's rows are read as, and their dtypes; `kind` holds the record kinds of torchalloc._records.
_COLUMNS: dict[str, Any] = {
    "kind": np.uint8,
    "time_ns": np.int64,
    "addr": np.uint64,
    "size": np.int64,
    "block_size": np.int64,
    "stream": np.uint64,
    "tid": np.int64,
    "stack": np.int64,
    "phase": np.int32,
    "device": np.int16,
    "seq": np.int64,
    "flags": np.uint8,
    "policy": np.uint8,  # the registry id of the policy that made a block or segment (alloc, free, segment records)
}


def report_start_ns(opened_ns: int | None, first_ns: int) -> int:
    """Time zero of a report: when the log was opened, unless its first event is before that or more than an
    hour after (a clock the header does not share: then the first event)."""
    if opened_ns is not None and 0 <= first_ns - opened_ns < 3600 * 10**9:
        return opened_ns
    return first_ns


class PieceTable:
    """One piece's rows as columns (_COLUMNS' names and dtypes), each made when first asked for: most passes
    read a few of them."""

    def __init__(self, records: np.ndarray) -> None:
        self._records = records
        self._n = len(records)

    def __len__(self) -> int:
        return self._n

    @property
    def records(self) -> np.ndarray:
        """The piece's rows as log records (RECORD_DTYPE)."""
        return self._records

    def __getattr__(self, name: str) -> np.ndarray:
        dtype = _COLUMNS.get(name)
        if dtype is None:
            raise AttributeError(name)
        field = self._records[name]
        if field.dtype.itemsize == np.dtype(dtype).itemsize and field.dtype.kind in "iu" and np.dtype(dtype).kind in "iu":
            col = np.ascontiguousarray(field).view(dtype)  # u8 -> i8 as astype wraps: one copy, no conversion
        else:
            col = np.asarray(field).astype(dtype)
        self.__dict__[name] = col
        return col


@dataclasses.dataclass
class Piece:
    """One piece of the device table: its rows, and where they start in the whole table."""

    table: PieceTable
    base: int

    def __len__(self) -> int:
        return len(self.table)


def device_pieces(log: ChunkedLog, device: int | None) -> Iterator[Piece]:
    """The device's rows (device == `device` or < 0), piece by piece; `device` None: every row."""
    base = 0
    for _, records in log.chunks():
        if device is not None:
            dev = records["device"]
            records = records[(dev == device) | (dev < 0)]
        if not len(records):
            continue
        table = PieceTable(records)
        yield Piece(table, base)
        base += len(table)


class Carry:
    """Blocks live at the end of a piece: named columns of equal length (addr, alloc_i, ordinal, ...)."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns

    @classmethod
    def empty(cls, dtypes: dict[str, Any]) -> "Carry":
        return cls({name: np.zeros(0, dtype=dt) for name, dt in dtypes.items()})

    def __len__(self) -> int:
        return len(self.columns["addr"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]


@dataclasses.dataclass
class Paired:
    """What pairing one piece found. Indices `*_i` are global (device table); `src` indexes the
    concatenation [carried blocks, the piece's rows] (`combined` gives that column)."""

    ended_src: np.ndarray  # blocks that ended in this piece: their alloc, in `combined` positions
    ended_at: np.ndarray  # the row (in the piece) of the event that ended each: its free, or the next alloc
    ended_real: np.ndarray  # bool: ended by a free (False: the next alloc of the address, a lost free)
    orphan_rows: np.ndarray  # rows of frees of addresses not live: blocks allocated before the log
    new_rows: np.ndarray  # rows of the piece's allocs, in order
    new_ordinals: np.ndarray  # their ordinals
    live_src: np.ndarray  # blocks still live after the piece, in `combined` positions, by ordinal
    rel: np.ndarray  # the piece's alloc and free rows: combined position n_carried + k is row rel[k]
    n_carried: int

    def combined(self, carried: np.ndarray, piece_column: np.ndarray) -> np.ndarray:
        """A column over [carried blocks, the piece's alloc and free rows], from the carried blocks' values and
        the piece's column (all rows)."""
        return np.concatenate((carried, piece_column[self.rel]))

    def ordinals(self, carried: np.ndarray) -> np.ndarray:
        """Each combined position's block ordinal (-1 for a free)."""
        per_row = np.full(self.rel.size, -1, dtype=np.int64)
        per_row[np.searchsorted(self.rel, self.new_rows)] = self.new_ordinals
        return np.concatenate((carried, per_row))


def pair_piece(piece: Piece, carry: Carry, next_ordinal: int) -> Paired:
    """Pair the piece's allocs and frees with each other and with the carried live blocks (the rules: an alloc
    ends at the next event on its address, a free with no live alloc before it is a block allocated before the
    log)."""
    t = piece.table
    kind = t.kind
    is_alloc_row = kind == ALLOC
    rel = np.flatnonzero(is_alloc_row | (kind == FREE))
    nc = len(carry)
    addr = np.concatenate((carry["addr"], t.addr[rel]))
    # positions in the combined sequence: carried first (they precede the piece), then the rows in order;
    # a stable sort by address keeps that order among the events of one address
    order = np.argsort(addr, kind="stable")
    m = order.size
    is_alloc = np.concatenate((np.ones(nc, dtype=bool), is_alloc_row[rel]))[order]
    same_next = np.zeros(m, dtype=bool)
    if m > 1:
        same_next[:-1] = addr[order[1:]] == addr[order[:-1]]
    next_is_free = np.zeros(m, dtype=bool)
    next_is_free[:-1] = ~is_alloc[1:]
    ends = is_alloc & same_next  # the next event on the address ends it: its free, or a lost free
    prev_is_alloc = np.zeros(m, dtype=bool)
    prev_is_alloc[1:] = is_alloc[:-1] & same_next[:-1]
    orphan = ~is_alloc & ~prev_is_alloc
    pos = np.flatnonzero(ends)
    ended_src = order[pos]
    ended_at = rel[order[pos + 1] - nc]
    ended_real = next_is_free[pos]
    still = order[is_alloc & ~same_next]
    still.sort()  # carried (kept by ordinal) first, then the piece's allocs in order: by ordinal
    new_rows = np.flatnonzero(is_alloc_row)
    orphan_rows = np.sort(rel[order[orphan] - nc])
    # the ended blocks by ordinal: carried ones (older) first, then the piece's in order
    by_alloc = np.argsort(ended_src, kind="stable")
    return Paired(ended_src[by_alloc], ended_at[by_alloc], ended_real[by_alloc], orphan_rows, new_rows,
                  next_ordinal + np.arange(new_rows.size, dtype=np.int64), still, rel, nc)
