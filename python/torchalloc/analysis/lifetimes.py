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


