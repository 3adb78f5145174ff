"""Where the largest multiple that fits must be: the bytes live at a multiple of the batch, counted without a
replay.

At any moment a policy holds at least the blocks live then, each at least
its request rounded up to 512 B (the trace's `peak_rounded`: no policy
needs less). So above the largest multiple at which the peak of those
bytes fits a capacity, no policy fits; the policies that reclaim or
compact their cache fit at or just below it (on the bundled traces the
default fits within one step of it). predict.py starts its search for the
largest multiple there when asked to (the report's line): the answer is the
bisection's, found in a replay or two instead of a dozen.

Counting needs each block's end: an alloc pairs with the next free (or
alloc) on its address, as the trace's live peaks pair them; a free of an
address not live frees nothing.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..log.trace import ALLOC, FREE
from .model import Model, TooLarge

ROUND = 512  # every request rounded up to this: no policy serves it with less


def largest_where(ok: Callable[[int], bool], start: int, top: int) -> int:
    """The largest n in 1..top where ok(n) holds (0: none), for an `ok` that holds up to some n and not past it:
    from `start`, gaps doubling outward until ok changes, then bisection -- about 2 log2 of the distance from
    `start` probes, the same answer as a bisection of 1..top."""
    n = min(max(start, 1), top)
    if ok(n):
        lo, hi, gap = n, top + 1, 1
        while lo < top:
            probe = min(lo + gap, top)
            if not ok(probe):
                hi = probe
                break
            lo, gap = probe, gap * 2
    else:
        lo, hi, gap = 0, n, 1
        while hi - gap > 0:
            probe = hi - gap
            if ok(probe):
                lo = probe
                break
            hi, gap = probe, gap * 2
    return bisect_between(ok, lo, hi)


def bisect_between(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest n in [lo, hi) where ok(n) holds, for ok true at lo (or lo 0, untried) and false at hi and an
    `ok` that holds up to some n and not past it."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


class LiveBytes:
    """The peak of live bytes of a model's trace at any multiple (module docstring)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        events = model.trace.events if model.trace.chunks is None else model.trace.chunks.array()
        kind, addr = events["kind"], events["addr"]
        named = np.flatnonzero(((kind == ALLOC) & (events["size"] > 0)) | (kind == FREE))
        order = named[np.argsort(addr[named], kind="stable")]
        closes = np.zeros(order.size, dtype=bool)  # the previous event on the same address is an alloc: this ends it
        closes[1:] = (addr[order[1:]] == addr[order[:-1]]) & (kind[order[:-1]] == ALLOC)
        rank = np.cumsum(kind == ALLOC) - 1  # each alloc event's place among the allocations (Model.sizes_at's)
        self.n = len(events)
        self.allocs = np.flatnonzero(kind == ALLOC)
        self.ends = order[closes]  # the events that end a block
        self.ended = rank[order[np.flatnonzero(closes) - 1]]  # the allocation each of them ends

    def peak(self, x: float) -> int | None:
        """The peak of live bytes at multiple x, each block rounded up to ROUND; None past what replay takes."""
        sizes = self._sizes(x)
        if sizes is None:
            return None
        sizes = np.where(sizes > 0, np.maximum(-(-sizes // ROUND) * ROUND, ROUND), 0)
        return int(self._levels(sizes).max()) if self.n else 0

    def _sizes(self, x: float) -> np.ndarray | None:
        try:
            return self.model.sizes_at(x).astype(np.int64)
        except TooLarge:
            return None

    def _levels(self, sizes: np.ndarray) -> np.ndarray:
        """The bytes live after each event, each allocation at `sizes`."""
        delta = np.zeros(self.n, dtype=np.int64)
        delta[self.allocs] = sizes
        delta[self.ends] -= sizes[self.ended]  # an event ends one block at most
        return np.cumsum(delta)

    def fits(self, n: int, step: float, capacity: int) -> bool:
        peak = self.peak(n * step)
        return peak is not None and peak <= capacity

    def ceiling(self, capacity: int, step: float, top: int) -> int:
        """The largest n <= top whose multiple n * step holds its live bytes within `capacity` (0: none): no
        policy fits above it. Searched from where the line through the live bytes at 1x and 2x reaches the
        capacity (a handful of counts)."""
        guess = self._guess(capacity)
        start = int(min(max(guess / step, 1), top)) if np.isfinite(guess) else top
        return largest_where(lambda n: self.fits(n, step, capacity), start, top)

    def _guess(self, capacity: int) -> float:
        """The multiple where the line through each moment's live bytes at 1x and at 2x first reaches
        `capacity` (inf: nothing grows)."""
        at_1, at_2 = self._sizes(1.0), self._sizes(2.0)
        if at_1 is None or at_2 is None or not self.n:
            return 1.0
        levels = [self._levels(at_1), self._levels(at_2)]
        grows = levels[1] > levels[0]
        if not grows.any():
            return float("inf")
        at = (capacity - levels[0][grows]) / (levels[1][grows] - levels[0][grows])
        return float(1.0 + at.min())
