"""The terms of reserved memory, computed piece by piece as the second pass reads the log.

Takes, piece after piece of one device's event table, its segment records
and its blocks (those allocated in the piece, those that ended in it);
gives `Terms`: the segments (`Segments` rows), each new block's segment
(`Terms.owners`), and after every event of the piece the running sums
reserved is split with (`Terms.step`, then `split`). The reserve
section's follower (reserve/__init__.py) feeds it the pieces of the
second pass (passes/second.py) and builds the rows (rows.py) from what it
gives.

- A segment row is what one SEGMENT_ALLOC record mapped. A SEGMENT_FREE
  unmaps the range it names from every mapped row it overlaps (with
  expandable segments one free may span several mapped runs, or part of
  one); what a row keeps outside the range stays mapped as a new row,
  made at the free.
- A block's segment: of the rows mapped when it was allocated whose range
  holds its address, the one starting highest (the last made, of those
  starting there): ranges.holders. In a consistent log there is one.
- The sums after each event: bytes of non-expandable segments with no live
  block (cached), of those with live blocks (occupied), of mapped
  expandable runs (mapped), and the live blocks' bytes in each kind.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any

import numpy as np

from ...._records import SEGMENT_ALLOC, SEGMENT_EXPANDABLE, SEGMENT_FREE
from ...passes.ranges import holders

NEVER = np.iinfo(np.int64).max  # the free index of a segment never unmapped


@dataclasses.dataclass
class Segments:
    """Segment rows (runs of expandable granules, or whole segments): those held at a moment (`Terms.at`), with
    their ids (in order of appearance)."""

    start: np.ndarray  # uint64 address
    size: np.ndarray  # int64 bytes
    alloc_i: np.ndarray  # event index of its SEGMENT_ALLOC (or of the partial unmap that left it)
    free_i: np.ndarray  # event index of the SEGMENT_FREE that unmapped it; NEVER while mapped then
    expandable: np.ndarray  # bool
    ids: np.ndarray  # int64, ascending

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Positions here of the rows with these ids (held here)."""
        return np.searchsorted(self.ids, ids)


class _Rows:
    """The segment rows still needed, as columns in order of their ids (a log may map millions of runs: no
    Python object per row, and a row goes once it is unmapped and holds no live block)."""

    def __init__(self) -> None:
        self.n = 0
        self.cols = {"id": np.zeros(64, np.int64), "start": np.zeros(64, np.uint64), "size": np.zeros(64, np.int64),
                     "alloc_i": np.zeros(64, np.int64), "free_i": np.zeros(64, np.int64),
                     "expandable": np.zeros(64, bool), "count": np.zeros(64, np.int64),
                     "persistent": np.zeros(64, np.int64)}

    def extend(self, made: list[tuple[int, int, int, int, bool]]) -> None:
        """New rows: (id, start, size, alloc index, expandable), ids ascending and above those held."""
        if not made:
            return
        need = self.n + len(made)
        if need > len(self.cols["id"]):
            self.cols = {k: np.concatenate((v[: self.n], np.zeros(max(need, 2 * self.n), v.dtype)))
                         for k, v in self.cols.items()}
        for name, values in zip(("id", "start", "size", "alloc_i", "expandable"), zip(*made)):
            self.cols[name][self.n: need] = values
        for name in ("count", "persistent"):
            self.cols[name][self.n: need] = 0
        self.cols["free_i"][self.n: need] = NEVER
        self.n = need

    def at(self, ids: Any) -> Any:
        """Positions of rows (by id) in the columns."""
        return np.searchsorted(self.cols["id"][: self.n], ids)

    def prune(self) -> None:
        """Drop the rows unmapped that hold no live block: nothing asks for them again."""
        keep = np.flatnonzero((self["free_i"] == NEVER) | (self["count"] > 0))
        if keep.size == self.n:
            return
        self.cols = {k: np.concatenate((v[keep], np.zeros(max(64, keep.size), v.dtype))) for k, v in self.cols.items()}
        self.n = keep.size

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name][: self.n]


class Terms:
    """The segments, the blocks' segments and the running sums, fed piece by piece (module docstring).
    Per piece: `segments` (its segment records), then `owners` (its new blocks), then `step`. `moments`: the
    event indices whose rows `at` gives afterwards."""

    def __init__(self, moments: Any = ()) -> None:
        self.rows = _Rows()
        self.count = 0  # segment rows the log made: the next row's id
        self.live: dict[int, tuple[int, int, bool]] = {}  # start -> (row id, size, expandable) of the mapped rows
        self.starts: list[int] = []  # their starts, sorted
        self.widest = 0  # the largest size a mapped row ever had: how far below a range a row may reach into it
        self.overlapped = False  # two mapped rows overlapped once (a damaged log): an unmap looks further down
        self.open: set[int] = set()  # rows with no free yet
        self.made: list[tuple[int, int, int, int, bool]] = []  # rows made in the current piece (_Rows.extend's)
        self.unmapped: list[tuple[int, int]] = []  # (row id, free index) of the rows unmapped in it
        self.sums = np.zeros(5, dtype=np.int64)  # cached, occupied, mapped, in plain segments, in expandable ones
        self.moments = np.unique(np.asarray(moments, dtype=np.int64))
        self.captured: dict[int, Segments] = {}

    # -- segment records ---------------------------------------------------------------------------
    def segments(self, base: int, kind: np.ndarray, addr: np.ndarray, size: np.ndarray, flags: np.ndarray) -> None:
        """The piece's records (event indices base + row); only its SEGMENT_ALLOC and SEGMENT_FREE ones count.
        The records are followed in Python dicts; the columns take the piece's rows and unmaps at once."""
        self.made, self.unmapped = [], []
        rows = np.flatnonzero((kind == SEGMENT_ALLOC) | (kind == SEGMENT_FREE))
        for r, k, a, z, f in zip(rows.tolist(), kind[rows].tolist(), addr[rows].tolist(), size[rows].tolist(),
                                 flags[rows].tolist()):
            if k == SEGMENT_ALLOC:
                self._map(a, z, base + r, bool(f & SEGMENT_EXPANDABLE))
            else:
                self._unmap(a, z, base + r)
        self.rows.extend(self.made)
        if self.unmapped:
            ids, at = zip(*self.unmapped)
            self.rows.cols["free_i"][self.rows.at(np.array(ids, dtype=np.int64))] = at

    def _map(self, a: int, z: int, i: int, expandable: bool) -> None:
        k = self.count
        self.count += 1
        self.made.append((k, a, z, i, expandable))
        if a not in self.live:  # (mapped again over a mapped start: the older row stays mapped, unreachable)
            j = bisect.bisect_left(self.starts, a)
            below = self.starts[j - 1] if j else None
            if (below is not None and below + self.live[below][1] > a) or \
                    (j < len(self.starts) and self.starts[j] < a + z):
                self.overlapped = True
            self.starts.insert(j, a)
        self.live[a] = (k, z, expandable)
        self.open.add(k)
        self.widest = max(self.widest, z)

    def _unmap(self, a: int, z: int, i: int) -> None:
        hi = a + max(z, 1)
        # mapped rows never overlap in a sound log: only the one starting at or below `a` may reach into the range
        lo_k = bisect.bisect_right(self.starts, a - self.widest if self.overlapped else a)
        lo_k = lo_k if self.overlapped else max(lo_k - 1, 0)
        hi_k = bisect.bisect_left(self.starts, hi)
        hits = [s for s in self.starts[lo_k:hi_k] if s + self.live[s][1] > a]
        # none: a segment made before the log began
        for s in hits:
            k, size, x = self.live.pop(s)
            del self.starts[bisect.bisect_left(self.starts, s)]
            self.open.discard(k)
            self.unmapped.append((k, i))
            e = s + size
            if a > s:  # the part before the unmapped range stays mapped
                self._map(s, a - s, i, x)
            if a + z < e:
                self._map(a + z, e - a - z, i, x)

    def at(self, i: int) -> Segments:
        """The rows held just after moment i (one of `moments`): every row mapped then, and every row holding a
        block live then."""
        return self.captured[i]

    # -- blocks ------------------------------------------------------------------------------------
    def owners(self, addr: np.ndarray, alloc_i: np.ndarray) -> np.ndarray:
        """The segment row (id) of each block allocated in the current piece (-1: none the log saw)."""
        cand = np.array(sorted(self.open.union(k for k, _ in self.unmapped)), dtype=np.int64)
        if not cand.size:
            return np.full(len(addr), -1, dtype=np.int64)
        r = self.rows
        j = r.at(cand)
        got = holders(addr, np.asarray(alloc_i, dtype=np.int64), r["start"][j], r["size"][j], r["alloc_i"][j],
                      r["free_i"][j])
        return np.where(got >= 0, cand[np.maximum(got, 0)], -1)

    def step(self, base: int, m: int, new: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
             ended: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """After each of the piece's m events: the sums (5 rows: cached, occupied, mapped, bytes in plain
        segments, bytes in expandable ones). `new`: the blocks allocated in it (owner, event index, size,
        whether it is never freed); `ended`: those that ended in it (owner, event index, size)."""
        r = self.rows
        owner, idx, size, persistent = new
        mine = owner >= 0
        np.add.at(r.cols["persistent"], r.at(owner[mine & persistent]), 1)
        e_owner, e_idx, e_size = ended
        gone = e_owner >= 0
        seg = r.at(np.concatenate((owner[mine], e_owner[gone])))  # positions in the columns
        at = np.concatenate((idx[mine], e_idx[gone])) - base
        step = np.concatenate((np.ones(int(mine.sum()), np.int64), -np.ones(int(gone.sum()), np.int64)))
        nbytes = np.concatenate((size[mine], -e_size[gone])).astype(np.int64)
        delta = np.zeros((5, m), dtype=np.int64)
        if seg.size:
            # per segment, its live-block count after each of its block events (sorted by segment, then event)
            order = np.lexsort((at, seg))
            seg, at, step, nbytes = seg[order], at[order], step[order], nbytes[order]
            first = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))
            lengths = np.diff(np.concatenate((first, [seg.size])))
            count = np.cumsum(step)
            count = count - np.repeat((count - step)[first], lengths) + np.repeat(r["count"][seg[first]], lengths)
            last = np.concatenate((first[1:] - 1, [seg.size - 1]))
            r.cols["count"][seg[last]] = count[last]
            became_empty = (count == 0).astype(np.int64) - (count - step == 0).astype(np.int64)  # +1 emptied
            plain = ~r["expandable"][seg]
            z = r["size"][seg]
            np.add.at(delta[0], at[plain], became_empty[plain] * z[plain])
            np.add.at(delta[1], at[plain], -became_empty[plain] * z[plain])
            np.add.at(delta[3], at[plain], nbytes[plain])
            np.add.at(delta[4], at[~plain], nbytes[~plain])
        if self.made:  # the piece's segment records
            j = r.at(np.array([row[0] for row in self.made], dtype=np.int64))
            np.add.at(delta, (np.where(r["expandable"][j], 2, 0), r["alloc_i"][j] - base), r["size"][j])
        if self.unmapped:
            j = r.at(np.array([k for k, _ in self.unmapped], dtype=np.int64))
            # a plain segment unmapped while it holds a block never freed leaves the occupied bytes
            term = np.where(r["expandable"][j], 2, np.where(r["persistent"][j] == 0, 0, 1))
            np.subtract.at(delta, (term, r["free_i"][j] - base), r["size"][j])
        sums = self.sums[:, None] + np.cumsum(delta, axis=1)
        if m:
            self.sums = sums[:, -1].copy()
        for i in self.moments[(self.moments >= base) & (self.moments < base + m)].tolist():
            self.captured[i] = Segments(*(r[c].copy() for c in ("start", "size", "alloc_i", "free_i", "expandable",
                                                                 "id")))
        r.prune()
        return sums


def split(reserved: Any, allocated: Any, fragmented: Any, cached: Any, mapped_free: Any) -> tuple[Any, Any]:
    """mapped_free and before_log (the rest of reserved) from the other terms, at any number of events."""
    before_log = reserved - allocated - fragmented - cached - mapped_free
    # With expandable:reclaim a granule the device may still be using is mapped at its new address before its
    # old one is unmapped: for a while the log's mapped runs hold more than the device memory reserved. Count
    # such granules once (out of mapped_free), so no term goes below zero.
    aliased = np.minimum(np.maximum(-before_log, 0), np.maximum(mapped_free, 0))
    return mapped_free - aliased, before_log + aliased


