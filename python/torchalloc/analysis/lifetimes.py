"""Lifetimes: per allocation site and reason, how many blocks, how many bytes, how long they lived.

Takes a `Derived` and the wording stage's `explain(block, phases)` (the
sentence for a group, from one of its blocks: the rows are numbers, the
words are wording.py's); gives `LifetimeRow`s, one per group of blocks that
share site, reason, free site, returning function and category, largest
first.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .categorize import CATEGORIES
from .classify import REASONS
from .derived import Derived

# Why block b was freed when it was, for a group whose blocks were allocated in `phases`.
Explain = Callable[[int, list[str]], str]


@dataclasses.dataclass
class LifetimeRow:
    site: str
    location: str
    reason: str
    category: str
    phases: list[str]
    count: int
    bytes: int  # block bytes, summed over the blocks
    largest: int
    typical_lifetime_s: float  # median; -1 for blocks never freed
    free_site: str | None
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def lifetime_rows(d: Derived, explain: Explain, top: int | None = None) -> list[LifetimeRow]:
    """Per allocation site and reason: count, bytes, typical lifetime, and why it was freed then."""
    c, b = d.classified, d.blocks
    key = np.stack([c.site, c.reason.astype(np.int64), c.free_site, c.returned, c.rerun.astype(np.int64),
                    c.category.astype(np.int64)], axis=1)
    if key.shape[0] == 0:
        return []
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.concatenate(([True], inverse[order][1:] != inverse[order][:-1], [True])))
    life = np.where(b.persistent, -1.0, (b.free_t - b.alloc_t) / 1e9)
    rows = []
    for g in range(len(uniq)):
        members = order[bounds[g]:bounds[g + 1]]
        first = int(members[0])
        sizes = b.block_size[members]
        phases = sorted({d.phase_name(int(p)) for p in b.alloc_phase[members].tolist()})
        fs = int(c.free_site[first])
        lifes = life[members]
        typical = float(np.median(lifes)) if (lifes >= 0).all() else -1.0
        rows.append(LifetimeRow(
            site=d.sites[c.site[first]].label,
            location=d.sites[c.site[first]].location,
            reason=str(REASONS[c.reason[first]]),
            category=str(CATEGORIES[c.category[first]]),
            phases=phases,
            count=int(members.size),
            bytes=int(sizes.sum()),
            largest=int(sizes.max()),
            typical_lifetime_s=typical,
            free_site=d.sites[fs].label if fs >= 0 else None,
            explanation=explain(first, phases),
        ))
    rows.sort(key=lambda r: (-r.bytes, r.site, r.reason))
    return rows[:top] if top else rows
