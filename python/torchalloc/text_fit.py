"""Plain-text tables and paragraphs that fit the terminal: $COLUMNS, the terminal's width, else 100 columns.

For the commands whose tables are plain columns of figures (replay, compare,
info). A table too wide on one line per header first puts its headers on
several lines (broken at spaces), then splits its columns into several
tables, each led again by the first column, so that a row's figures stay on
one line: what a reader compares runs down a column, not across a wrapped
row. A paragraph is broken at spaces, never inside a word (a path longer
than the width stays whole).

Shared module: pure Python, no numpy.
"""
from __future__ import annotations

import re
import shutil
import textwrap
from typing import Sequence

DEFAULT_WIDTH = 100
GAP = "  "
_FIGURE = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|s|ms)\b")  # a number and its unit: one word when breaking lines
_GLUE = "\x1f"


def terminal_width() -> int:
    """$COLUMNS when set, else the terminal's width, else DEFAULT_WIDTH."""
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def paragraph(text: str, width: int, indent: str = "", more: str = "  ") -> list[str]:
    """`text` in lines of at most `width` columns (a word longer than that on a line of its own; a figure and its
    unit kept together), the first after `indent`, the others after `indent + more`."""
    if len(indent) + len(text) <= width:
        return [indent + text]
    glued = _FIGURE.sub(lambda m: m.group(1) + _GLUE + m.group(2), text)  # textwrap does not break at _GLUE
    lines = textwrap.wrap(glued, width=width, initial_indent=indent, subsequent_indent=indent + more,
                          break_long_words=False, break_on_hyphens=False)
    return [line.replace(_GLUE, " ") for line in lines] or [indent]


def _header_lines(header: str, width: int) -> list[str]:
    """A header broken at spaces into lines of at most `width` (words joined while they fit)."""
    lines: list[str] = []
    for word in _words(header):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def _words(text: str) -> list[str]:
    """The words of `text`, a number and its unit as one."""
    glued = _FIGURE.sub(lambda m: m.group(1) + _GLUE + m.group(2), text)
    return [w.replace(_GLUE, " ") for w in glued.split(" ") if w]  # split(" "): str.split() breaks at _GLUE too


def _render(headers: Sequence[str], rows: Sequence[Sequence[str]], columns: Sequence[int], left: int,
            stacked: bool) -> list[str]:
    """The columns `columns` of the table: headers (on several lines when `stacked`), a rule, the rows."""
    widths = {}
    for k in columns:
        cells = max((len(r[k]) for r in rows), default=0)
        words = max((len(w) for w in _words(headers[k])), default=0)
        widths[k] = max(cells, words) if stacked else max(cells, len(headers[k]))
    split = {k: _header_lines(headers[k], widths[k]) if stacked else [headers[k]] for k in columns}
    height = max(len(s) for s in split.values())

    def line(cells: dict[int, str]) -> str:
        return GAP.join(cells[k].ljust(widths[k]) if k < left else cells[k].rjust(widths[k])
                        for k in columns).rstrip()

    out = [line({k: ([""] * (height - len(split[k])) + split[k])[i] for k in columns}) for i in range(height)]
    out.append(GAP.join("-" * widths[k] for k in columns))
    out += [line({k: r[k] for k in columns}) for r in rows]
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, *, left: int = 1) -> list[str]:
    """The table's lines, within `width` where it can be: its first `left` columns left-aligned (the first is the
    row's name), the others right-aligned. One line per header when that fits; else headers on several lines;
    else the columns in several tables, each starting with the first column, a blank line between them."""
    every = list(range(len(headers)))
    for stacked in (False, True):
        lines = _render(headers, rows, every, left, stacked)
        if max(len(x) for x in lines) <= width:
            return lines
    out: list[str] = []
    group: list[int] = [0]
    for k in every[1:]:
        if len(group) > 1 and max(len(x) for x in _render(headers, rows, group + [k], left, True)) > width:
            out += ([""] if out else []) + _render(headers, rows, group, left, True)
            group = [0]
        group.append(k)
    return out + ([""] if out else []) + _render(headers, rows, group, left, True)
