"""Lifetimes: per allocation site and reason, how many blocks, how many bytes, how long they lived.

Holds `LifetimeRow`: one per group of blocks that share site, reason, free
site, returning function, whether the line ran again (rebinding) and
category, largest first, with the sentence for the group (written from the
block that speaks for it: the rows are numbers, the words are wording.py's).
The second pass adds each block to its row as it ends, or at the end of the
log when it never does (sections/lifetimes.py); Analysis.lifetime_rows
(result.py) builds the rows.
"""
from __future__ import annotations

import dataclasses
from typing import Any


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


