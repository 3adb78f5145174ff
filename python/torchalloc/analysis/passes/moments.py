"""The moments the second pass keeps the live blocks at, known after the first pass.

Takes the first pass' `Scan` (and the log's strings, for marker labels);
gives the anatomies' moments (the peak, the first marker of each of the
first MARKER_ANATOMIES labels, the moments asked for with --at) and the
HTML page's (report/data.py's moments: the timeline's samples, the markers
it draws, the peak, every OOM; the first OOMs and the peak always held).
The sections add the moments their followers need (section.Part.moments:
the peak of reserved, each OOM), which `analyze` gathers.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...log.chunks import ChunkedLog
from ...printable import printable
from .first import Scan

# The marker labels whose anatomy the JSON report carries (the first ones): one 'step N' marker per step gives a
# label per step, and each anatomy keeps and groups the blocks live at its moment, so without a cap
# `report --json` grew with steps times blocks.
MARKER_ANATOMIES = 1000
PAGE_MAX_MARKERS = 200  # report/svg.py's MAX_MARKERS: the markers the page draws (the analysis imports no report)
PRIORITY_OOMS = 10  # report/data.py's PRIORITY_OOMS


def is_time(x: Any) -> bool:
    """Whether Analysis.index_at would read `x` as a time (a number, or text that parses as one once "s" is cut)."""
    if isinstance(x, (int, float)):
        return True
    if x in ("peak", "peak_reserved", "end", "oom"):
        return False
    try:
        float(str(x).rstrip("s"))
        return True
    except ValueError:
        return False


def anatomy_moments(log: ChunkedLog, s: Scan, at: Sequence[str | float]) -> list[int]:
    """The peak, the first marker of each label (the first MARKER_ANATOMIES labels), and the `at` moments."""
    if not s.n:
        return []
    first_of_text: dict[str, int] = {}
    for lid, i in s.marker_first.items():
        text = printable(log.strings.get(lid, ""))
        first_of_text[text] = min(i, first_of_text.get(text, i))
    out = {s.peak_i}
    shown: set[str] = set()  # a set: a list's `in` made this markers times labels
    for _, label, _, _ in s.markers:
        text = printable(log.strings.get(label, ""))
        if text not in shown:
            shown.add(text)
            if len(shown) > MARKER_ANATOMIES:
                break
            out.add(first_of_text[text])
    special = {"peak": s.peak_i, "peak_reserved": s.rpeak_i, "end": s.n - 1}
    if s.ooms:
        special["oom"] = int(s.ooms[0]["index"])
    for x in at:
        if isinstance(x, str) and x in special:
            out.add(special[x])
        elif isinstance(x, str) and x in first_of_text:
            out.add(first_of_text[x])
        elif is_time(x):
            out.add(s.at_time[float(x.rstrip("s")) if isinstance(x, str) else float(x)])
    return sorted(out)


def page_moments(s: Scan) -> tuple[np.ndarray, set[int]]:
    """The page's moments (report/data.py's): the samples, the first markers, the peak and every OOM; and those
    whose largest blocks the page always holds (the peak, the first OOMs)."""
    marks = [m[0] for m in s.markers[:PAGE_MAX_MARKERS]]
    ooms = [int(o["index"]) for o in s.ooms]
    moments = np.unique(np.concatenate((s.samples, np.asarray(marks, dtype=np.int64),
                                        np.asarray([s.peak_i] + ooms, dtype=np.int64))))
    return moments.astype(np.int64), {s.peak_i, *ooms[:PRIORITY_OOMS]}
