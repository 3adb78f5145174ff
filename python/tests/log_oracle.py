"""What a log says about its blocks, read straight from the file: the ground truth the report's tests hold the
report against, without the analysis' own per-block arrays (which a log read in pieces does not have).

    o = LogOracle(path)            # or LogOracle(path, device=1)
    o.blocks[k]                    # Block: addr, size, block_size, alloc_i, free_i, stacks, phases
    o.live_after(i)                # ids of the blocks live just after event i, ascending
    o.allocated_after(i)           # their block bytes

Plain loops over the records, on purpose: a second, obviously right reading of the log, not the analysis'
vectorised one. What it must agree with the analysis on, and how it was made to:

- which events: the analysis reads one device (the one with the most alloc records, unless told) and the
  records about no device (markers, phases, modules, the end record), in file order, without the records no
  writer produces (torchalloc.log.checks.impossible); the event index i counts those;
- the opening row: when some block's free comes before any alloc of its address (it was allocated before the
  log began), the analysis puts a row first (kind LOG_OPENED, 0) so that the level with every such block live
  has an index: then every log event's index is one more;
- which blocks: each alloc is paired with the next record on its address; a free ends it there, another alloc
  ends it there too (its free was lost); a free with no alloc before it is a block from before the log;
- block ids: blocks from before the log first (by address, then free index), then in the order of their
  allocs -- the ids the page's data and its clicks use.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from torchalloc._records import ALLOC, FREE, MARKER
from torchalloc.log import read_log
from torchalloc.log.checks import impossible

LOG_OPENED = 0  # the kind of the analysis' opening row (not a record kind of the log)


@dataclasses.dataclass(frozen=True)
class Block:
    id: int
    addr: int
    size: int  # requested bytes
    block_size: int
    alloc_i: int  # event index of its alloc; -1: allocated before the log began
    free_i: int  # event index of its free (or of the alloc that reused its address); -1: never freed
    alloc_stack: int  # stack id; 0 without one (and for a block from before the log)
    free_stack: int  # stack id of its free record; 0 without one, when never freed, or when its free was lost
    alloc_phase: int  # phase id; -1 for a block from before the log
    free_phase: int  # -1 when never freed
    lost_free: bool  # ended by another alloc of its address, not by a free record

    @property
    def never_freed(self) -> bool:
        return self.free_i < 0

    def live_after(self, i: int) -> bool:
        return self.alloc_i <= i and (self.free_i < 0 or self.free_i > i)


class LogOracle:
    def __init__(self, path: str | os.PathLike[str], device: int | None = None) -> None:
        log = read_log(path)
        self.strings = log.strings
        records = log.records
        bad, _ = impossible(records, header_size=log.header.header_size, path=str(path))
        records = records[~bad]
        kind, dev = records["kind"].astype(np.int64), records["device"].astype(np.int64)
        if device is None:
            counts: dict[int, int] = {}
            for d in dev[kind == ALLOC].tolist():
                counts[d] = counts.get(d, 0) + 1
            if counts:  # the most allocs; of two with as many, the lower number
                device = min(counts, key=lambda d: (-counts[d], d))
            else:
                device = min([d for d in dev.tolist() if d >= 0], default=0)
        self.device = device
        self.records = records[(dev == device) | (dev < 0)]
        self.blocks, self.opened = self._pair()
        self.n = len(self.records) + self.opened  # events as the analysis numbers them
        self._alloc = np.array([b.alloc_i for b in self.blocks], dtype=np.int64)
        self._free = np.array([b.free_i if b.free_i >= 0 else np.iinfo(np.int64).max for b in self.blocks],
                              dtype=np.int64)
        self._bytes = np.array([b.block_size for b in self.blocks], dtype=np.int64)

    def _pair(self) -> tuple[list[Block], bool]:
        live: dict[int, dict[str, Any]] = {}  # addr -> the open block's fields
        ended: list[dict[str, Any]] = []
        cols = {name: self.records[name].tolist() for name in ("kind", "addr", "size", "block_size", "stack", "phase")}
        for r, values in enumerate(zip(*cols.values())):
            row = dict(zip(cols, values))
            kind, addr = int(row["kind"]), int(row["addr"])
            if kind == ALLOC:
                if addr in live:  # a lost free: the old block ends at this alloc
                    ended.append(dict(live.pop(addr), free_r=r, free_stack=0, free_phase=int(row["phase"]),
                                      lost_free=True))
                live[addr] = dict(addr=addr, size=int(row["size"]), block_size=int(row["block_size"]), alloc_r=r,
                                  alloc_stack=int(row["stack"]), alloc_phase=int(row["phase"]))
            elif kind == FREE:
                if addr in live:
                    ended.append(dict(live.pop(addr), free_r=r, free_stack=int(row["stack"]),
                                      free_phase=int(row["phase"]), lost_free=False))
                else:  # allocated before the log began
                    ended.append(dict(addr=addr, size=int(row["size"]), block_size=int(row["block_size"]),
                                      alloc_r=None, alloc_stack=0, alloc_phase=-1, free_r=r,
                                      free_stack=int(row["stack"]), free_phase=int(row["phase"]), lost_free=False))
        for b in live.values():
            ended.append(dict(b, free_r=None, free_stack=0, free_phase=-1, lost_free=False))
        opened = any(b["alloc_r"] is None for b in ended)
        shift = 1 if opened else 0
        before = sorted((b for b in ended if b["alloc_r"] is None), key=lambda b: (b["addr"], b["free_r"]))
        after = sorted((b for b in ended if b["alloc_r"] is not None), key=lambda b: b["alloc_r"])
        blocks = []
        for k, b in enumerate(before + after):
            blocks.append(Block(
                id=k, addr=b["addr"], size=b["size"], block_size=b["block_size"],
                alloc_i=-1 if b["alloc_r"] is None else b["alloc_r"] + shift,
                free_i=-1 if b["free_r"] is None else b["free_r"] + shift,
                alloc_stack=b["alloc_stack"], free_stack=b["free_stack"], alloc_phase=b["alloc_phase"],
                free_phase=b["free_phase"], lost_free=b["lost_free"]))
        return blocks, opened

    # questions ---------------------------------------------------------------
    def record(self, i: int) -> dict[str, Any] | None:
        """The log record that is event i (None for the opening row)."""
        r = i - self.opened
        if r < 0:
            return None
        return dict(zip(self.records.dtype.names, self.records[r].tolist()))

    def kind(self, i: int) -> int:
        rec = self.record(i)
        return LOG_OPENED if rec is None else int(rec["kind"])

    def label(self, i: int) -> str:
        """A marker's text."""
        rec = self.record(i)
        assert rec is not None and int(rec["kind"]) == MARKER, f"event {i} is no marker"
        return self.strings.get(int(rec["stack"]), "")

    def live_after(self, i: int) -> list[int]:
        """The ids of the blocks live just after event i (one its event freed is gone, one it made is there)."""
        return np.flatnonzero((self._alloc <= i) & (self._free > i)).tolist()

    def allocated_after(self, i: int) -> int:
        return int(self._bytes[(self._alloc <= i) & (self._free > i)].sum())

    def allocated(self) -> np.ndarray:
        """The live block bytes after every event."""
        delta = np.zeros(self.n + 1, dtype=np.int64)
        for b in self.blocks:
            delta[max(b.alloc_i, 0)] += b.block_size
            if b.free_i >= 0:
                delta[b.free_i] -= b.block_size
        return np.cumsum(delta)[: self.n]

    def largest_live(self, i: int) -> list[int]:
        """live_after(i), largest block first (ties: the lower id first)."""
        return sorted(self.live_after(i), key=lambda k: (-self.blocks[k].block_size, k))
