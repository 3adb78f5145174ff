"""`torchalloc report LOG`: why memory stayed alive, in text, JSON, HTML or PNG.

    torchalloc report run.talog                  # text: summary, timeline, peak anatomy, sections (COLUMNS wide)
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
describes the two passes over the log; torchalloc.analysis.rules.classify's gives
the rules behind every reason). The command line is cli/report.py.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Sequence

from ..analysis import Analysis, Anatomy, analyze
from ..plan import Brief, brief_of, report_follower
from ..analysis.sections import SECTIONS
from ..analysis.sections.views import SectionView
from ..analysis.summary import Summary
from ..printable import printable
from ..units import fmt_bytes, fmt_seconds, fmt_time, fmt_times
from .text_table import table_lines, text_table, wrap

__all__ = ["report", "render_text"]

WIDTH = 100  # columns of the report where neither COLUMNS nor a terminal says
MIN_WIDTH = 40  # a narrower COLUMNS is read as this: below, a table's figures alone overflow
SUMMARY_LINES = 25  # the report's first lines, which the summary ends within (one screen); its markers are cut to fit
LABEL_CHARS = 60  # a marker text longer than this is cut: one label is text from the log, of any length


def report(
    log: str | os.PathLike[str] | Any,
    *,
    device: int | None = None,
    at: Sequence[str | float] = (),
    top: int = 50,
) -> dict[str, Any]:
    """The report as plain data (what `torchalloc report --json` prints), for a log's path (or its bytes)."""
    follower = report_follower()  # the trace for the plan gathered as the log is analysed
    a = analyze(log, device=device, at=at, followers=[follower])
    data = a.to_dict(top=top)
    data["at"] = [a.anatomy(x, top=top).to_dict() for x in at]
    data["plan"] = brief_of(log, a, follower).to_dict()
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


def _anatomy_text(an: Anatomy, top: int, width: int) -> list[str]:
    out = [f"At {an.at} ({fmt_time(an.t_s)}): {fmt_bytes(an.allocated)} allocated, {fmt_bytes(an.reserved)} reserved, "
           f"{sum(r.count for r in an.rows)} live blocks"]
    rows = [(fmt_bytes(r.bytes), r.count, r.phase, r.category, r.reason, r.site) for r in an.rows[:top]]
    out += ["  " + line for line in text_table(["bytes", "blocks", "phase", "category", "reason", "allocated at"], rows,
                                               right=(0, 1), width=width - 2)]
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


def _section_text(title: str, view: SectionView, width: int) -> list[str]:
    """One section of SECTIONS: its title, its table (each row followed by its notes), its sentences."""
    out = [f"== {title}"]
    table = view.table
    if table is not None:
        head, rows = table_lines(table.headers, table.rows, right=table.right, width=width - 2)
        out += ["  " + line for line in head]
        for k, lines in enumerate(rows):
            out += ["  " + line for line in lines]
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


def _in(phase: str) -> str:
    return f" (in {phase})" if phase else ""


def _summary_text(s: Summary, width: int, above: int = 0, plan: Brief | None = None) -> list[str]:
    """The summary (analysis/summary.py) in lines of `width` columns that end within the report's first
    SUMMARY_LINES, `above` lines coming before it (the title, the notes): the markers it lists are those that fit."""
    def said(text: str, indent: str = "") -> list[str]:
        return wrap(text, width, indent, "    ")

    p = s.peak
    when, r_when = fmt_times([p.allocated_t_s, p.reserved_t_s])
    at_least = " (at least: the log began mid-run)" if p.at_least else ""
    head = said(f"Peak: {fmt_bytes(p.allocated)} allocated{at_least} at {when}{_in(p.allocated_phase)}; "
                f"{fmt_bytes(p.reserved)} reserved at {r_when}{_in(p.reserved_phase)}")
    if s.reserve is not None:
        r = s.reserve
        terms = [f"{fmt_bytes(r.allocated)} allocated", f"{fmt_bytes(r.fragmentation)} fragmentation",
                 f"{fmt_bytes(r.cache)} cache"]
        terms += [f"{fmt_bytes(r.mapped_free)} mapped free (expandable)"] if r.mapped_free else []
        terms += [f"{fmt_bytes(r.before_log)} before the log"] if r.before_log else []
        head += said(f"At the peak allocated, reserved {fmt_bytes(r.reserved)} = " + " + ".join(terms))
    if s.live:
        head.append("Live at the peak, the largest (sites with a source line first):")
        rows = [(fmt_bytes(x.bytes), x.reason, x.category, x.site) for x in s.live]
        _, body = table_lines(["bytes", "reason", "category", "allocated at"], rows, right=(0,), width=width - 2)
        head += ["  " + line for lines in body for line in lines]  # the columns without their header
    for leak in s.leaks:
        head += said(f"Leak: {leak.words()}")
    short = s.leak_check.too_few()
    if short is not None:
        head += said(f"Leaks: {short}")
    if s.leak_count > len(s.leaks):
        more = s.leak_count - len(s.leaks)
        head.append(f"  ... {more} more growing site{'s' if more != 1 else ''}: see 'Leaks' below")
    tail: list[str] = []
    if s.change is not None:
        tail += said(f"The change to try first: {s.change.words()}")
    if s.oom is not None:
        o = s.oom
        which = f" (the last of {o.count})" if o.count > 1 else ""
        first = o.explanation.split(". ")[0].rstrip(".")  # the rest: the section "Out of memory"
        tail += said(f"Out of memory{which} at {fmt_time(o.t_s)} asking {fmt_bytes(o.requested)}: {first}")
        if o.advice:
            tail += said(f"First advice: {o.advice} ({o.advice_check})", "  ")
    room = SUMMARY_LINES - above - 1 - len(head) - len(tail) - 2  # the heading; the markers' heading, a "more" line
    batch = said(plan.line) if plan is not None and plan.line else []
    if len(batch) <= room:  # before the markers, when the summary has room for it (--json and the page carry it)
        tail += batch
        room -= len(batch)
    return ["== Summary", *head, *_summary_markers(s, room, said), *tail]


def _summary_markers(s: Summary, room: int, said: Callable[[str, str], list[str]]) -> list[str]:
    """The summary's marker lines, in `room` lines: markers of a kind seen once before those that repeat (the
    special ones before 'step N'), shown in the log's order."""
    entries = []
    for m in s.markers:
        kind = f" (1st of {m.kind_count} like it)" if m.kind_count > 1 else ""
        text = f"'{m.label}'{kind} {fmt_time(m.t_s)}: {fmt_bytes(m.live)} live; freed {fmt_bytes(m.freed)}"
        if m.freed_top is not None:
            text += f", most {m.freed_top.short()}"
        if m.kept_top is not None and m.kept_top.bytes * 100 >= s.peak.allocated:  # 1% of the peak: worth a word
            text += f"; kept {fmt_bytes(m.kept)}, most {m.kept_top.short()}"
        entries.append(said(text, "  "))
    chosen: set[int] = set()
    used = 0
    for k in sorted(range(len(entries)), key=lambda k: (s.markers[k].kind_count > 1, k)):
        if used + len(entries[k]) <= room:
            chosen.add(k)
            used += len(entries[k])
    if not entries:
        return []
    out = ["Markers: live at each; what the run freed and kept from it to the next marker:"]
    out += [line for k in sorted(chosen) for line in entries[k]]
    left = s.marker_kinds - len(chosen)
    if left:
        out.append(f"  ... {left} more kind{'s' if left != 1 else ''} of markers: see 'Between markers' below")
    return out


def render_text(a: Analysis, *, top: int = 15, at: Sequence[str | float] = (), width: int | None = None,
                plan: Brief | None = None) -> str:
    """The human report in lines of at most `width` columns (default: $COLUMNS, the terminal's, or 100; at least
    MIN_WIDTH): the summary first, then the timeline, the peak anatomy, the sections. `plan`: what the summary
    says of the batch (plan/brief.py)."""
    if width is None:
        width = shutil.get_terminal_size((WIDTH, 24)).columns
    width = max(width, MIN_WIDTH)
    t, tl = a.table, a.timeline
    out = [f"torchalloc report: {t.path or 'log'} -- device {a.device}, {len(t)} events, {len(a.blocks)} blocks"]
    for note in a.notes:
        out.append(f"note: {note}")
    out.append("")
    if len(a.blocks) == 0 and not a.ooms():
        out.append(f"Nothing to report: the log holds no allocation on device {a.device}. Either the process "
                   "allocated nothing while the log was open, or torchalloc was not its allocator "
                   "(torchalloc.install() must run before the first CUDA tensor).")
        return _fitted(out, width)
    out += _summary_text(a.summary(), width, above=_fitted(out, width).count("\n"), plan=plan)
    out.append("")
    out.append("== Timeline")
    at_least = " (at least: the log began mid-run)" if a.blocks.before_log else ""
    when, r_when = fmt_times([tl.peak_t, tl.peak_reserved_t])
    out.append(f"peak allocated {fmt_bytes(tl.peak_allocated)}{at_least} at {when}; peak reserved "
               f"{fmt_bytes(tl.peak_reserved)} at {r_when}; {fmt_seconds(tl.duration_s)} in all")
    if len(tl.allocated):
        spark = max(8, min(64, width - 23))  # "allocated |" and "| 1023.9 MiB" beside it
        out.append(f"allocated |{_sparkline(tl.allocated.tolist(), spark)}| {fmt_bytes(tl.peak_allocated)}")
        out.append(f"reserved  |{_sparkline(tl.reserved.tolist(), spark)}| {fmt_bytes(tl.peak_reserved)}")
    if tl.markers:
        out += _markers_text(tl.markers, top, width)
    out.append("")
    if len(t):
        out.append("== Peak anatomy: what was live at the peak, by allocation site and phase")
        out += _anatomy_text(a.anatomy("peak"), top, width)
        out.append("")
    for x in at:
        out += _anatomy_text(a.anatomy(x), top, width)
        out.append("")
    for section in SECTIONS:
        view = section.view(a, top)
        if view is not None:
            out += _section_text(section.title, view, width)
    while out and not out[-1]:
        out.pop()
    return _fitted(out, width)


def _fitted(lines: list[str], width: int) -> str:
    """The lines, each longer than `width` wrapped (figures kept whole), its next lines indented two more."""
    out = []
    for line in lines:
        body = line.lstrip(" ")
        out += wrap(body, width, line[:len(line) - len(body)])
    return "\n".join(out) + "\n"
