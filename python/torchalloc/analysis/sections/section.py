"""What a section declares: its `Section` entry, and its `Part` of the second pass.

Every section of the report after the timeline and the anatomy is one
module of sections/ (or a small package, as reserve/ and ooms/) holding
its follower of the second pass (passes/follow.py's hooks), its rows,
their words and its view, and declaring:

- its `Part`: its key, how to make its follower from the log and the
  first pass' Scan (None: nothing to follow in this log), how to build its
  rows from the analysis and the follower, and the moments whose live
  blocks the follower needs beside those the report shows;
- its `Section` entry (or entries, when one part feeds two): its key in
  the JSON, its title, the line under the title in the HTML page, and its
  view -- what it shows of an analysis as plain data (views.py) -- naming
  its Part.

sections/__init__.py lists the entries in the report's order: the one
place a section is registered. `analyze` (front.py) makes the followers of
every registered Part and hands them to the pass; `Analysis.section_rows`
builds a Part's rows once, when asked.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from ...log.chunks import ChunkedLog
from ..passes.first import Scan
from ..passes.follow import Follower
from .views import Analyzed, SectionView


def no_moments(scan: Scan) -> Sequence[int]:
    return ()


@dataclasses.dataclass(frozen=True)
class Part:
    """A section's part of the second pass, declared once in the section's module."""

    key: str  # what Analysis.followers and Analysis.section_rows know it by
    follow: Callable[[ChunkedLog, Scan], Follower | None]  # its follower for a log (None: nothing to follow)
    rows: Callable[[Any, Follower | None], Any]  # (analysis, its follower) -> the section's rows
    in_details: bool = False  # its columns show in blocks' details: the page's extra pass follows it too
    moments: Callable[[Scan], Sequence[int]] = no_moments  # events whose live blocks it needs (at_moment, snapshots)


@dataclasses.dataclass(frozen=True)
class Section:
    """A section of the report after the timeline and the anatomy (sections.SECTIONS lists them in order)."""

    key: str  # its name in the JSON
    title: str
    intro: str  # a line under the title in the HTML page ("" for none)
    view: Callable[[Analyzed, int], SectionView | None]  # (analysis, rows to show) -> what to show, or None
    part: Part  # its part of the second pass: its follower and how its rows are built
