"""The lifetime rows as they fill: per row its blocks' count, bytes, phases and lifetimes.

Takes, piece by piece, the blocks that ended (or, at the end of the log,
the persistent ones) with their row's key -- site, reason, free site, returning function, rerun, category -- and keeps
per row what the row shows: counts and sums, the set of allocating phases,
the block that speaks for it (the lowest block index), and the lifetimes
for the typical one: exact while few (`EXACT_LIFETIMES` per row,
`EXACT_BUDGET` over all rows), then a histogram with bins 0.1 % wide, so a
row costs at most a few hundred KB however many blocks it has.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

EXACT_LIFETIMES = 1 << 16  # a lifetime row's blocks whose lifetimes are kept exactly; past it, a histogram
EXACT_BUDGET = 1 << 22  # exact lifetimes kept over all rows (32 MiB): past it, the largest rows go to histograms
MANTISSA_BITS = 10  # the histogram's bins: 2^10 per power of two (0.1 % wide)
INT_MAX = np.iinfo(np.int64).max


class Lifetimes:
    """A lifetime row's lifetimes (ns): exact while few, then a histogram with bins 0.1 % wide (its median within a
    bin of the exact one), kept as two arrays (bin keys, counts)."""

    def __init__(self) -> None:
        self.exact: list[np.ndarray] = []
        self.count = 0
        self.keys: np.ndarray | None = None  # None: exact
        self.counts = np.zeros(0, dtype=np.int64)

    @property
    def hist(self) -> bool:
        return self.keys is not None

    @property
    def exact_count(self) -> int:
        return 0 if self.hist else self.count

    def add(self, ns: np.ndarray) -> None:
        self.count += ns.size
        if self.keys is None:
            self.exact.append(ns)
            if self.count > EXACT_LIFETIMES:
                self.to_histogram()
        else:
            self._bin(ns)

    def to_histogram(self) -> None:
        if self.keys is None:
            self.keys = np.zeros(0, dtype=np.int64)
            self._bin(np.concatenate(self.exact) if self.exact else np.zeros(0, dtype=np.int64))
            self.exact = []

    def _bin(self, ns: np.ndarray) -> None:
        assert self.keys is not None
        keys, counts = np.unique(_bin_of(ns), return_counts=True)
        merged = np.concatenate((self.keys, keys))
        uniq, inv = np.unique(merged, return_inverse=True)
        total = np.zeros(uniq.size, dtype=np.int64)
        np.add.at(total, inv.reshape(-1), np.concatenate((self.counts, counts)))
        self.keys, self.counts = uniq, total

    def median_s(self) -> float:
        """np.median of the lifetimes in seconds (exactly, or from the histogram's bins)."""
        if self.keys is None:
            return float(np.median(np.concatenate(self.exact) / 1e9))
        cum = np.cumsum(self.counts)
        n = int(cum[-1])
        lo = _bin_value(self.keys[np.searchsorted(cum, (n - 1) // 2, side="right")])
        hi = _bin_value(self.keys[np.searchsorted(cum, n // 2, side="right")])
        return (lo + hi) / 2 / 1e9


def _bin_of(ns: np.ndarray) -> np.ndarray:
    """Histogram bin of each lifetime (ns >= 0): its exponent and the next MANTISSA_BITS bits."""
    x = np.maximum(ns, 0).astype(np.int64)
    small = x < (1 << MANTISSA_BITS)
    e = np.zeros(x.size, dtype=np.int64)
    big = ~small
    e[big] = np.floor(np.log2(x[big].astype(np.float64))).astype(np.int64) - MANTISSA_BITS
    e[big] = np.maximum(e[big], 0)
    mant = np.where(big, x >> e, x)
    fix = big & (mant >= (2 << MANTISSA_BITS))  # log2 of a float rounded up
    mant[fix] >>= 1
    e[fix] += 1
    return (e << 20) | mant


def _bin_value(key: int) -> float:
    e, mant = int(key) >> 20, int(key) & ((1 << 20) - 1)
    return float((mant << e) + ((1 << e) - 1) / 2) if e else float(mant)


@dataclasses.dataclass
class Group:
    """The blocks of one lifetime row so far."""

    count: int = 0
    bytes: int = 0
    largest: int = 0
    phases: set[int] = dataclasses.field(default_factory=set)
    persistent: bool = False
    negative: bool = False  # a lifetime below 0 (clocks of two threads): the row's typical lifetime is then -1
    lives: Lifetimes = dataclasses.field(default_factory=Lifetimes)
    first: int = INT_MAX  # the lowest block index: the block that speaks for the row
    rep: dict[str, Any] = dataclasses.field(default_factory=dict)


_KEY = ("site", "reason", "free_site", "returned", "rerun", "category")
# bits of each key column in one int64 (the +1 columns may be -1): site, reason, free_site + 1, returned + 1, rerun,
# category
_WIDTHS = (20, 4, 20, 14, 1, 4)


def group_keys(cols: dict[str, np.ndarray]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct lifetime-row keys of these blocks, and each block's: one int64 per block when the ids fit
    (they do but in huge logs of distinct call sites), else rows of the key."""
    shift = (0, 0, 1, 1, 0, 0)
    values = [cols[c].astype(np.int64) + d for c, d in zip(_KEY, shift)]
    if all(int(v.max(initial=0)) < (1 << w) for v, w in zip(values, _WIDTHS)):
        packed = np.zeros(values[0].size, dtype=np.int64)
        for v, w in zip(values, _WIDTHS):
            packed = (packed << w) | v
        uniq, inv = np.unique(packed, return_inverse=True)
        out = []
        for u in uniq.tolist():
            parts = []
            for w in reversed(_WIDTHS):
                parts.append(u & ((1 << w) - 1))
                u >>= w
            parts.reverse()
            out.append(tuple(x - d for x, d in zip(parts, shift)))
        return out, inv.reshape(-1)
    key = np.stack([cols[c] for c in _KEY], axis=1)
    uniq2, inv = np.unique(key, axis=0, return_inverse=True)
    return [tuple(int(x) for x in row) for row in uniq2], inv.reshape(-1)
