"""`torchalloc report LOG`: why memory stayed alive, in text, JSON, HTML or PNG.

    torchalloc report run.talog                  # text: timeline, peak anatomy, lifetimes, phases, estimate
    torchalloc report run.talog --json           # the same as one JSON object
    torchalloc report run.talog --html run.html  # self-contained page with the timeline drawn
    torchalloc report run.talog --png run.png    # the timeline as a picture (needs matplotlib)
    torchalloc report run.talog --at "after forward" --at 1.5
    torchalloc report run.0.talog run.1.talog    # a job: one log per rank, compared (job_text.py)
    torchalloc report 'run.*.talog' --html job.html

From Python the same data:

    from torchalloc.report import report
    data = report("run.talog")                   # dict, as --json prints it
    print(render_text(analyze("run.talog")))     # the text

The analysis itself is the torchalloc.analysis package (its docstring
describes the two passes over the log; torchalloc.analysis.classify's gives
the rules behind every reason). The command line is cli/report.py.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Sequence

from ..analysis import Analysis, Anatomy, analyze
from ..analysis.sections import SECTIONS
from ..analysis.views import SectionView
from ..printable import printable
from ..units import fmt_bytes, fmt_seconds, fmt_time
from .text_table import text_table

__all__ = ["report", "render_text"]

WIDTH = 100  # columns of the markers line where neither COLUMNS nor a terminal says
LABEL_CHARS = 60  # a marker text longer than this is cut: one label is text from the log, of any length


def report(
    log: str | os.PathLike[str] | Any,
    *,
    device: int | None = None,
    at: Sequence[str | float] = (),
    top: int = 50,
) -> dict[str, Any]:
    """The report as plain data (what `torchalloc report --json` prints), for a log's path (or its bytes)."""
    a = analyze(log, device=device, at=at)
    data = a.to_dict(top=top)
    data["at"] = [a.anatomy(x, top=top).to_dict() for x in at]
    return data


# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------


def _sparkline(values: Sequence[int], width: int = 64) -> str:
    """Allocated over time as one line of block characters (max per column)."""
    bars = " ▁▂▃▄▅▆▇█"
    if not len(values):
        return ""
    top = max(values) or 1
    n = len(values)
    cols = []
    for c in range(min(width, n)):
        lo, hi = c * n // min(width, n), max((c + 1) * n // min(width, n), c * n // min(width, n) + 1)
        v = max(values[lo:hi])
        cols.append(bars[min(len(bars) - 1, round(v / top * (len(bars) - 1)))])
    return "".join(cols)


def _anatomy_text(an: Anatomy, top: int) -> list[str]:
    out = [f"At {an.at} ({fmt_time(an.t_s)}): {fmt_bytes(an.allocated)} allocated, {fmt_bytes(an.reserved)} reserved, "
           f"{sum(r.count for r in an.rows)} live blocks"]
    rows = [(fmt_bytes(r.bytes), r.count, r.phase, r.category, r.reason, r.site) for r in an.rows[:top]]
    out += ["  " + line for line in text_table(["bytes", "blocks", "phase", "category", "reason", "allocated at"], rows, right=(0, 1))]
    if len(an.rows) > top:
        rest = an.rows[top:]
        out.append(f"  ... {len(rest)} more sites, {fmt_bytes(sum(r.bytes for r in rest))}")
    if an.by_category:
        out.append("  by category: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in an.by_category.items()))
    return out


def _clip(label: str) -> str:
    label = printable(label)  # escaped before it is cut and wrapped, so the widths are those printed
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 3] + "..."


def _markers_text(markers: Sequence[tuple[float, str, str]], top: int, width: int) -> list[str]:
    """The markers, at most `top` of them (the first and the last ones, and how many between), wrapped to
    `width` columns. Every marker on one line made a 4 MB line of a log with a marker per step."""
    def said(m: tuple[float, str, str]) -> str:
        return f"'{_clip(m[1])}' at {fmt_time(m[0])}"

    if len(markers) <= top:
        items = [said(m) for m in markers]
    else:
        head, tail = (top + 1) // 2, top // 2
        items = [said(m) for m in markers[:head]] + [f"... {len(markers) - head - tail} more ..."]
        items += [said(m) for m in markers[len(markers) - tail:]]
    # broken between markers, not inside one: an item is at most a cut label and a time
    lines: list[str] = []
    line = f"markers ({len(markers)}):"
    for k, item in enumerate(items):
        item += "," if k + 1 < len(items) else ""
        if len(line) + 1 + len(item) > max(width, 40) and line.strip():
            lines.append(line)
            line = " "  # the next line indented by two: this space and the one before the item
        line += " " + item
    return lines + [line]


def _section_text(title: str, view: SectionView) -> list[str]:
    """One section of SECTIONS: its title, its table (each row followed by its notes), its sentences."""
    out = [f"== {title}"]
    table = view.table
    if table is not None:
        lines = text_table(table.headers, table.rows, right=table.right)
        out += ["  " + line for line in lines[:2]]
        for k, line in enumerate(lines[2:]):
            out.append("  " + line)
            out += [f"      {note}" for note in (table.row_notes[k] if k < len(table.row_notes) else [])]
        if table.more:
            out.append(f"  {table.more}")
    out += [f"  {s}" for s in view.sentences]
    for checked in view.lists:
        out.append(f"  {checked.title}:")
        for line in checked.lines:
            out.append(f"    {line.number}. {line.text}")
            out.append(f"       -> {line.check}")
    out.append("")
    return out


def render_text(a: Analysis, *, top: int = 15, at: Sequence[str | float] = (), width: int | None = None) -> str:
    """The human report; the markers line wrapped to `width` columns (default: $COLUMNS, the terminal's, or 100)."""
    if width is None:
        width = shutil.get_terminal_size((WIDTH, 24)).columns
    t, tl = a.table, a.timeline
    out = [f"torchalloc report: {t.path or 'log'} -- device {a.device}, {len(t)} events, {len(a.blocks)} blocks"]
    for note in a.notes:
        out.append(f"note: {note}")
    out.append("")
    if len(a.blocks) == 0 and not a.ooms():
        out.append(f"Nothing to report: the log holds no allocation on device {a.device}. Either the process "
                   "allocated nothing while the log was open, or torchalloc was not its allocator "
                   "(torchalloc.install() must run before the first CUDA tensor).")
        return "\n".join(out) + "\n"
    out.append("== Timeline")
    at_least = " (at least: the log began mid-run)" if a.blocks.before_log else ""
    out.append(f"peak allocated {fmt_bytes(tl.peak_allocated)}{at_least} at {fmt_time(tl.peak_t)}; peak reserved "
               f"{fmt_bytes(tl.peak_reserved)} at {fmt_time(tl.peak_reserved_t)}; {fmt_seconds(tl.duration_s)} in all")
    if len(tl.allocated):
        out.append(f"allocated |{_sparkline(tl.allocated.tolist())}| {fmt_bytes(tl.peak_allocated)}")
        out.append(f"reserved  |{_sparkline(tl.reserved.tolist())}| {fmt_bytes(tl.peak_reserved)}")
    if tl.markers:
        out += _markers_text(tl.markers, top, width)
    out.append("")
    if len(t):
        out.append("== Peak anatomy: what was live at the peak, by allocation site and phase")
        out += _anatomy_text(a.anatomy("peak"), top)
        out.append("")
    for x in at:
        out += _anatomy_text(a.anatomy(x), top)
        out.append("")
    for section in SECTIONS:
        view = section.view(a, top)
        if view is not None:
            out += _section_text(section.title, view)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"
