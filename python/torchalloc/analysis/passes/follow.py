"""The hooks of the second pass: what a section's `Follower` is handed, piece by piece.

The second pass (second.py) reads the log piece by piece and calls
each follower's hooks, in this order, per piece:

1. `new_blocks`: the piece's records and its new blocks; gives the values of
   the follower's `columns` for them (each column is added to the pass'
   block table, carried with a block while it lives, filled with its
   default where the follower gives none);
2. `piece`: the piece's blocks, before their ends are handled (a follower
   may still change its columns);
3. `ended` (blocks of the table that ended, with their end columns and
   reason) and `orphans_ended` (blocks from before the log freed, as
   `FreedOrphans`);
4. `step`: the piece's new and ended blocks together, once reasons are known;
5. `at_moment`: at each anatomy moment in the piece, the blocks live then;

then `finish` with the blocks live at the end of the log. `orphan` gives a
block from before the log's values of the columns that a block's details
show (details.py). Every hook does nothing unless the follower says
otherwise, so a follower writes only those it needs.

The pass knows its followers by these hooks alone: which section a
follower serves, and what it makes of what it is handed, is the section's
(sections/section.py: the `Part` that names a section's follower).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Protocol

import numpy as np

Blocks = dict[str, np.ndarray]  # the pass' block table: one column per name, one row per block live in the piece


@dataclasses.dataclass(frozen=True)
class FreedOrphans:
    """Blocks from before the log freed in one piece, as `Follower.orphans_ended` is handed them."""

    k: np.ndarray  # their indices (the first pass' Scan.orphans order: the first of the blocks' order)
    free_i: np.ndarray  # the events that freed them
    reason: np.ndarray  # why they were freed when they were (the classify rules: persistent or other)
    site: int  # the pass' site id of the blocks from before the log
    detail: Callable[[int], dict[str, Any]]  # detail(j): block k[j]'s details (details.py, every follower's columns)


class Follower(Protocol):
    """A section's part of the second pass (module docstring). Subclass it to inherit the no-op hooks."""

    columns: ClassVar[Mapping[str, int]] = {}  # the block table's columns it adds, each with its default

    def new_blocks(self, t: Any, base: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Piece `t` (its first event: `base`); its new blocks at rows `rows`: their values of `columns`."""
        return {}

    def piece(self, bt: Blocks, t: Any, base: int) -> None:
        """The piece's blocks (carried first, then new), each with its end (INT_MAX: live after the piece)."""

    def ended(self, bt: Blocks, ended: np.ndarray, ends: dict[str, np.ndarray]) -> None:
        """Blocks of the table (positions `ended`) ended in this piece; `ends`: their end columns (end_columns)."""

    def orphans_ended(self, freed: FreedOrphans) -> None:
        """Blocks from before the log freed in this piece."""

    def step(self, bt: Blocks, nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        """The piece (`m` events from `base`): its new blocks (table rows from nc on) and those ended (rows `ended`,
        at events `end_i`)."""

    def at_moment(self, i: int, bt: Blocks, rows: np.ndarray, orphans: np.ndarray, orphan_reasons: np.ndarray,
                  t: Any, base: int) -> None:
        """Anatomy moment i, in piece t: the table's blocks live then (positions `rows`), those from before the log
        (indices `orphans`, with their reasons); the snapshot's order is the orphans', then the rows'."""

    def orphan(self, k: int) -> dict[str, int]:
        """Block k from before the log: its values of the columns a block's details show (details.py)."""
        return {}

    def finish(self, bt: Blocks) -> None:
        """The end of the log: the blocks still live."""


def end_columns(t: Any, base: int, rows: np.ndarray, real: np.ndarray, free_site: np.ndarray, returned: np.ndarray,
                rerun: np.ndarray, reason: np.ndarray) -> dict[str, np.ndarray]:
    """The end columns handed to `Follower.ended` of blocks that ended at rows `rows` of piece t (its first event:
    `base`), by a free where `real`, with their reason and what it names (details.END_COLUMNS)."""
    return {"free_i": base + rows, "free_t": t.time_ns[rows], "free_phase": t.phase[rows].astype(np.int64),
            "free_stack": np.where(real, t.stack[rows], 0), "free_site": free_site, "returned": returned,
            "rerun": np.asarray(rerun).astype(np.int64), "reason": reason}
