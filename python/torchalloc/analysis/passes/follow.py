"""What a report section declares: its `Section` entry, and when its rows need the second pass, its `Follower`.

The second pass (second.py) reads the log piece by piece and calls
each follower's hooks, in this order, per piece:

1. `new_blocks`: the piece's records and its new blocks; gives the values of
   the follower's `columns` for them (each column is added to the pass'
   block table, carried with a block while it lives, filled with its
   default where the follower gives none);
2. `piece`: the piece's blocks, before their ends are handled (a follower
   may still change its columns);
3. `ended` (blocks of the table that ended, with their end columns and
   reason) and `orphans_ended` (blocks from before the log freed);
4. `step`: the piece's new and ended blocks together, once reasons are known;
5. `at_moment`: at each anatomy moment in the piece, the blocks live then;

then `finish` with the blocks live at the end of the log. `orphan` gives a
block from before the log's values of the columns that a block's details
show (details.py). Every hook does nothing unless the follower says
otherwise, so a follower writes only those it needs.

A section is declared once, in its own module, by its `Section` entry
(its key, title, view) that sections.SECTIONS lists; when its rows need
the pass, the entry names its `Part` (its key, how to make its follower
from the log and the first pass' Scan, how to build its rows from the
analysis and the follower). result.py asks the registry, not the section.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Protocol

import numpy as np

from ...log.chunks import ChunkedLog
from .first import Scan
from ..views import Analyzed, SectionView

Blocks = dict[str, np.ndarray]  # the pass' block table: one column per name, one row per block live in the piece


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

    def orphans_ended(self, k: np.ndarray, free_i: np.ndarray) -> None:
        """Blocks from before the log (their indices) freed in this piece, at events `free_i`."""

    def step(self, bt: Blocks, nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        """The piece (`m` events from `base`): its new blocks (table rows from nc on) and those ended (rows `ended`,
        at events `end_i`)."""

    def at_moment(self, i: int, bt: Blocks, rows: np.ndarray, orphans: np.ndarray, orphan_reasons: np.ndarray,
                  t: Any, base: int) -> None:
        """Anatomy moment i, in piece t: the table's blocks live then (positions `rows`), those from before the log
        (indices `orphans`, with their reasons); the snapshot's order is the orphans', then the rows'."""

    def orphan(self, k: int) -> dict[str, int]:
        """Block k from before the log: its values of the columns a block's details show (stream_details)."""
        return {}

    def finish(self, bt: Blocks) -> None:
        """The end of the log: the blocks still live."""


@dataclasses.dataclass(frozen=True)
class Part:
    """A section's part of the second pass, declared once in the section's module."""

    key: str  # what Analysis.followers and Analysis.section_rows know it by
    follow: Callable[[ChunkedLog, Scan], Follower | None]  # its follower for a log (None: nothing to follow)
    rows: Callable[[Any, Follower | None], Any]  # (analysis, its follower) -> the section's rows
    in_details: bool = False  # its columns show in blocks' details: the page's extra pass follows it too


def end_columns(t: Any, base: int, rows: np.ndarray, real: np.ndarray, free_site: np.ndarray, returned: np.ndarray,
                rerun: np.ndarray, reason: np.ndarray) -> dict[str, np.ndarray]:
    """The end columns handed to `Follower.ended` of blocks that ended at rows `rows` of piece t (its first event:
    `base`), by a free where `real`, with their reason and what it names."""
    return {"free_i": base + rows, "free_t": t.time_ns[rows], "free_phase": t.phase[rows].astype(np.int64),
            "free_stack": np.where(real, t.stack[rows], 0), "free_site": free_site, "returned": returned,
            "rerun": np.asarray(rerun).astype(np.int64), "reason": reason}


@dataclasses.dataclass(frozen=True)
class Section:
    """A section of the report after the timeline and the anatomy (sections.SECTIONS lists them in order)."""

    key: str  # its name in the JSON
    title: str
    intro: str  # a line under the title in the HTML page ("" for none)
    view: Callable[[Analyzed, int], SectionView | None]  # (analysis, rows to show) -> what to show, or None
    part: Part | None = None  # its part of the second pass, when its rows need one
