"""Columns and lines of plain text, for every text output of the report (one log and a job's logs), fitted to a
width when one is given.

Numbers are never cut: a figure and its unit ("1.2 GiB", "t=14.900 s") stay
on one line, a right-aligned (number) column keeps its widest cell, and a
line is broken only at spaces between words (a word longer than the width,
a long path, is broken where it must). Text cells (sites, reasons) are
wrapped onto more lines, never cut.
"""
from __future__ import annotations

import re
import textwrap
from typing import Any, Sequence

_GLUE = "\x1f"  # joins a figure to its unit while wrapping (printable() escapes control characters in log text)
_FIGURE = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|s|ms|µs|ns|blocks?)\b")
_FIGURE_WORD = re.compile(r"[\d.,]+ (B|KiB|MiB|GiB|TiB|s|ms|µs|ns|blocks?)\b")  # a whole figure and its unit
MAX_WORD = 30  # a text column is not narrowed below its longest word (a site's file and line) up to this...
MIN_TEXT_COLUMN = 8  # ...unless the table does not fit otherwise: then down to this


def wrap(text: str, width: int, indent: str = "", more: str = "  ") -> list[str]:
    """`text` in lines of at most `width` columns, the first after `indent`, the next after `indent + more`;
    a figure and its unit kept together."""
    if len(indent) + len(text) <= width:
        return [indent + text]
    if len(indent) + len(more) > width // 2:  # an indent that leaves too little room: none
        indent, more = "", "  "
    glued = _FIGURE.sub(lambda m: m.group(1) + _GLUE + m.group(2), text)
    lines = textwrap.wrap(glued, width=max(width, len(indent + more) + 8), initial_indent=indent,
                          subsequent_indent=indent + more, break_on_hyphens=False)
    return [line.replace(_GLUE, " ") for line in lines] or [indent]


def _cell_lines(text: str, width: int) -> list[str]:
    """A cell in lines of `width` (broken at spaces; a longer word where it must)."""
    if len(text) <= width:
        return [text]
    glued = _FIGURE.sub(lambda m: m.group(1) + _GLUE + m.group(2), text)
    return [line.replace(_GLUE, " ") for line in textwrap.wrap(glued, width=width, break_on_hyphens=False)] or [""]


def _fit(headers: Sequence[str], cells: list[list[str]], right: Sequence[int], width: int) -> list[int]:
    """Column widths within `width`, narrowed a column at a time, the one that adds the fewest lines first, down to
    a floor: a number column's widest cell, a text column's longest word (at most MAX_WORD) -- and when that does
    not fit, MIN_TEXT_COLUMN; a header's longest word and a figure with its unit for both."""
    natural = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    glued = [[_FIGURE.sub(lambda m: m.group(1) + _GLUE + m.group(2), c) for c in r] for r in cells]
    words = [max((len(w) for w in h.split()), default=0) for h in headers]
    figures = [max((len(f.group(0)) for r in cells for f in _FIGURE_WORD.finditer(r[i])), default=0)
               for i in range(len(headers))]
    longest = [max((len(w) for r in glued for w in r[i].split()), default=0) for i in range(len(headers))]
    widest = [max((len(r[i]) for r in cells), default=0) for i in range(len(headers))]
    by_words = [max(words[i], widest[i] if i in right else min(longest[i], MAX_WORD)) for i in range(len(headers))]
    last = [by_words[i] if i in right else max(words[i], figures[i], min(longest[i], MIN_TEXT_COLUMN))
            for i in range(len(headers))]
    widths = natural
    for floor in (by_words, last):
        widths = list(natural)

        def height(k: int) -> int:  # the table's lines (about: n characters in w columns take n/w) with column k
            # one narrower: a row is as tall as its tallest cell, so narrowing a cell no taller than that is free
            w = [x - (i == k) for i, x in enumerate(widths)]
            return sum(max(-(-len(c) // w[i]) for i, c in enumerate(r)) for r in cells)

        while sum(widths) + 2 * (len(widths) - 1) > width:
            room = [k for k in range(len(widths)) if widths[k] > floor[k]]
            if not room:
                break  # as narrow as it goes
            widths[min(room, key=lambda k: (height(k), floor[k] - widths[k]))] -= 1  # fewest lines, most room
        if sum(widths) + 2 * (len(widths) - 1) <= width:
            break
    return widths  # still wider than `width` when even the last floors do not fit: the caller wraps its lines


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = (),
                width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """The header's lines and a rule, and each row's lines (text_table's, the rows apart: notes go under them)."""
    cells = [[str(c) for c in r] for r in rows]
    if width is None:
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    else:
        widths = _fit(headers, cells, right, width)

    def lines(values: Sequence[str]) -> list[str]:
        parts = [_cell_lines(v, widths[i]) for i, v in enumerate(values)]
        out = []
        for k in range(max(len(p) for p in parts)):
            line = [p[k] if k < len(p) else "" for p in parts]
            out.append("  ".join(v.rjust(widths[i]) if i in right else v.ljust(widths[i])
                                 for i, v in enumerate(line)).rstrip())
        return out

    head = lines(headers) + ["  ".join("-" * w for w in widths)]
    return head, [lines(r) for r in cells]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = (),
               width: int | None = None) -> list[str]:
    """The header, a rule and the rows, each column as wide as its widest cell; columns in `right` right-aligned.
    With `width`, the columns are narrowed to fit it (module docstring): a header or a row may then take several
    lines."""
    head, body = table_lines(headers, rows, right, width)
    return head + [line for r in body for line in r]
