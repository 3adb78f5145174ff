"""Where the timeline's marker labels go: rows above the plot, no two labels overlapping.

A run's markers often come in bursts (a step, a checkpoint, a stray
reference cleared, all within a few milliseconds), so a label cannot simply
stand at its marker's line. `place_labels` puts each label in one of at most
`rows` rows, as near its marker as the others allow (each row is packed left
to right, then pushed back inside the plot); the page draws a leader from
the label to its marker. When even `rows` rows cannot hold every label, every
second (third, ...) marker keeps its label and the others are left to the
line's hover title and the tooltip.

labels.js (for page.js) does the same with the widths the browser measures; svg.py, with
`text_width`'s estimate (generous, so that a wider font still fits).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

__all__ = ["Placed", "place_labels", "text_width", "CHAR_W", "GAP"]

CHAR_W = 7.0  # px per character of an 11 px label: above DejaVu Sans' average, the widest common default
GAP = 8.0  # px between two labels of one row


class Placed(NamedTuple):
    """A label's place: its row (0 at the top) and the x of its left edge."""
    row: int
    left: float


def text_width(text: str) -> float:
    return CHAR_W * len(text)


def _fits(widths: Sequence[float], room: float) -> bool:
    return sum(widths) + GAP * max(len(widths) - 1, 0) <= room


def _pack(xs: Sequence[float], widths: Sequence[float], lo: float, hi: float) -> list[float]:
    """Left edges for one row's labels (in x order, known to fit between lo and hi): each centred on its marker,
    pushed right past the one before it, then pulled back left so that the last ends by hi."""
    lefts = [min(max(x - w / 2, lo), hi - w) for x, w in zip(xs, widths)]
    for k in range(1, len(lefts)):
        lefts[k] = max(lefts[k], lefts[k - 1] + widths[k - 1] + GAP)
    for k in range(len(lefts) - 1, -1, -1):
        end = hi if k == len(lefts) - 1 else lefts[k + 1] - GAP
        lefts[k] = min(lefts[k], end - widths[k])
    return lefts


def place_labels(xs: Sequence[float], widths: Sequence[float], lo: float, hi: float, rows: int
                 ) -> list[Placed | None]:
    """Each label's place (None: not drawn), for markers at `xs` (ascending) with labels `widths` wide, between
    x=lo and x=hi. The fewest labels left out, then the fewest rows."""
    n = len(xs)
    for stride in range(1, n + 1):
        shown = list(range(0, n, stride))
        for used in range(1, rows + 1):
            members = [shown[r::used] for r in range(used)]
            if all(_fits([widths[k] for k in m], hi - lo) for m in members):
                out: list[Placed | None] = [None] * n
                for r, m in enumerate(members):
                    for k, left in zip(m, _pack([xs[k] for k in m], [widths[k] for k in m], lo, hi)):
                        out[k] = Placed(r, left)
                return out
    return [None] * n
