"""Which rank each of a job's logs belongs to, from the ranks their headers carry."""
from __future__ import annotations

from typing import Sequence


def assign_ranks(header_ranks: Sequence[int]) -> tuple[list[int], list[str]]:
    """The rank of each log: its header's, or -- when a log has none, or two logs claim one -- its position."""
    known = [r for r in header_ranks if r >= 0]
    if len(known) == len(header_ranks) and len(set(known)) == len(known):
        return list(header_ranks), []
    if len(header_ranks) == 1:  # one log without $RANK: rank 0 of a job of one, nothing to number
        return [0], []
    why = ("some logs were written without $RANK (no launcher)" if len(known) < len(header_ranks)
           else "two logs have the same $RANK (different jobs?)")
    return list(range(len(header_ranks))), [f"{why}: ranks are numbered by the logs' order on the command line"]
