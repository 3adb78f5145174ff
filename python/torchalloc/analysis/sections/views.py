"""What a report section shows of an analysis, as plain data: the types every section's view gives.

A section's view (sections.SECTIONS lists them) turns its rows into a
`SectionView`: its `Table` (headers, cells as shown, the lines under each
row), the sentences under the table, its JSON, and any `CheckedList`. The
text report (report/text.py), the HTML page (report/html.py) and the JSON
render these and nothing else. `Analyzed` is what a view may read of an
analysis (front.Analysis answers it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence


class Analyzed(Protocol):
    """What a section's view reads of an analysis (front.Analysis answers it)."""

    def section_rows(self, key: str) -> Any: ...  # the rows of a section's part (section.Part), built once


@dataclasses.dataclass
class Table:
    headers: Sequence[str]
    rows: list[Sequence[str]]  # cells as shown
    right: Sequence[int] = ()  # columns aligned right (numbers)
    css: str = ""  # the HTML table's class
    row_notes: list[list[str]] = dataclasses.field(default_factory=list)  # lines under each row (may be empty)
    more: str = ""  # what the rows leave out, when they were cut
    row_key: str = ""  # HTML: the first cell of row k gets the attribute row_key=k (the page's script uses it)
    row_titles: list[str] = dataclasses.field(default_factory=list)  # HTML: the first cell's hover text per row


@dataclasses.dataclass
class CheckedLine:
    """A numbered statement (a line of advice, say) and what checked it."""
    number: int
    text: str
    check: str
    status: str  # "confirmed", "refuted" or "unchecked"


@dataclasses.dataclass
class CheckedList:
    title: str
    lines: list[CheckedLine]
    css: str = ""  # the HTML list's class


@dataclasses.dataclass
class SectionView:
    table: Table | None
    sentences: list[str]
    json: Any
    lists: list[CheckedList] = dataclasses.field(default_factory=list)  # under the sentences
