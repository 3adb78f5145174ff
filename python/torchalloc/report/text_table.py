"""Columns of plain text, for every text output of the report (one log and a job's logs)."""
from __future__ import annotations

from typing import Any, Sequence


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> list[str]:
    """The header, a rule and the rows, each column as wide as its widest cell; columns in `right` right-aligned."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells]
