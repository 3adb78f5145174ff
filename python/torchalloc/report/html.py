"""The report as one self-contained HTML page: an interactive timeline, and tables.

Nothing is fetched from the network (no CDN, no fonts, no scripts from
elsewhere): the page opens from a file on an offline machine or as a CI
artifact. Its parts:

- the timeline as a static SVG (svg.py) and the tables, drawn here:
  the whole report, with JavaScript off;
- the data the script needs, as JSON in a <script type="application/json">
  element (data.py: bounded, escaped);
- the script (page.js, after units.js: numbers and ticks, and labels.js: where the
  marker labels go) and the style (page.css), inlined:
  zoom and pan, a tooltip, the blocks live at a clicked moment, a block's
  or a site's stacks and reason, buttons for the peak and each OOM. Its
  controls and panels carry `needs-script` and stay hidden without it.

It leads with the answer (summary_html.py: the report's summary,
analysis/summary.py, as the text and JSON reports give it first), then the timeline, the peak's anatomy and the
sections the summary links to (out of memory, reserved memory, the
policies); each marker's anatomy follows folded (<details>), markers with the
same table sharing one. The page ends with its help (page_help.py, from the
packaged page_help.md); docs/REPORT.md shows the page.
"""
from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Sequence

from ..analysis import Analysis, Anatomy
from ..plan import Brief
from ..analysis.sections import SECTIONS
from ..analysis.sections.views import CheckedList, SectionView
from .data import embed_json, page_data
from .page_help import help_html
from .plan_html import plan_html
from .summary_html import summary_html
from .svg import PALETTE, phase_colors, render_svg
from ..units import fmt_bytes, fmt_time

__all__ = ["render_html", "write_html", "render_svg", "phase_colors", "PALETTE"]


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _rows_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], cls: str, numeric: Sequence[int] = ()) -> str:
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{_e(h)}</th>' for i, h in enumerate(headers))
    body = "\n".join(
        "<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{_e(c)}</td>' for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>'


def _anatomy_html(an: Anatomy, cls: str, top: int) -> str:
    rows = [(fmt_bytes(r.bytes), r.count, r.phase, r.category, r.reason, r.site) for r in an.rows[:top]]
    title = (f"<p>At <b>{_e(an.at)}</b> ({fmt_time(an.t_s)}): {_e(fmt_bytes(an.allocated))} allocated, "
             f"{_e(fmt_bytes(an.reserved))} reserved.</p>")
    cats = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in an.by_category.items())
    return title + _rows_html(["bytes", "blocks", "phase", "category", "reason", "allocated at"], rows, cls, (0, 1)) + \
        (f"<p class=small>By category: {_e(cats)}</p>" if cats else "")


def _checked_html(checked: CheckedList) -> str:
    """A numbered list, each line with what checked it (class confirmed, refuted or unchecked)."""
    items = [f'<li value={line.number}>{_e(line.text)}<br><span class="check {line.status}">{_e(line.check)}</span></li>'
             for line in checked.lines]
    return f"<h3>{_e(checked.title)}</h3>" + f'<ol class="{checked.css}">' + "".join(items) + "</ol>"


_ASSETS = Path(__file__).resolve().parent


def _asset(name: str) -> str:
    """page.css or a script (units.js, labels.js, page.js), to inline: the page fetches nothing."""
    text = (_ASSETS / name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise RuntimeError(f"{name} holds an end tag: inlined, it would end its element early")
    return text


def _controls_html(data: dict[str, Any]) -> str:
    """The buttons above the timeline: the peak, each OOM, zoom."""
    parts = ['<div class="controls needs-script" hidden>']
    peak = data["peak"]
    if peak:
        parts.append(f'<button type=button id="btn-peak" class="btn-peak">peak: {_e(fmt_bytes(peak["allocated"]))} at '
                     f'{_e(fmt_time(peak["t"]))}</button>')
    for k, o in enumerate(data["ooms"]):
        parts.append(f'<button type=button class="btn-oom" data-oom={k}>OOM {k + 1}: {_e(fmt_bytes(o["requested"]))} '
                     f'asked at {_e(fmt_time(o["t"]))}</button>')
    parts.append('<span class=sep></span><button type=button id="zoom-in" aria-label="zoom in">+</button>'
                 '<button type=button id="zoom-out" aria-label="zoom out">−</button>'
                 '<button type=button id="zoom-reset">whole run</button>'
                 '<span class=small>wheel or +/− to zoom, drag or ←/→ to pan, '
                 'click to list the blocks live then</span></div>')
    return "".join(parts)


def _panels_html(data: dict[str, Any]) -> str:
    """The selected moment's listing and the detail panel, under a note of which blocks the page holds."""
    b = data["budget"]
    parts = []
    if b["held"] < b["blocks"]:
        cut = (f"; the budget cut the rest, so a moment lists at least its {b['exact']} largest, the peak and each "
               f"OOM their {b['per_moment']} largest" if b["cut"] else "")
        parts.append(f'<p class="note needs-script" hidden>This page holds {b["held"]} of the log\'s {b["blocks"]} '
                     f"blocks: the largest live at each moment a click can select (the timeline's samples, the peak, "
                     f"the OOMs, the markers), up to {b['per_moment']} per moment and {b['total']} in all{cut}. "
                     "A listing that is short says so.</p>")
    parts.append('<div class="panels needs-script" hidden>'
                 '<section id="moment" class="panel" aria-live="polite"><h3>Moment</h3><p class=small>Click the '
                 'timeline, or press peak, to list the blocks live then.</p></section>'
                 '<section id="detail" class="panel" aria-live="polite"><h3>Block</h3><p class=small>Click a listed '
                 'block, or a site in the lifetimes table, for its stacks and why it lived as long as it did.</p>'
                 '</section></div>')
    return "".join(parts)


def _drawing_note(data: dict[str, Any]) -> str:
    """What the timeline leaves out (with or without the script: both draw the same bounded lists)."""
    cuts = [f"the first {len(data[k])} of {data[k + '_total']} {what}" for k, what in
            (("spans", "phase occurrences (the strip under the plot)"), ("markers", "markers"))
            if data[k + "_total"] > len(data[k])]
    return f'<p class="note">The timeline draws {" and ".join(cuts)}.</p>' if cuts else ""


def _notes_html(notes: Sequence[str]) -> str:
    """A row's notes: an indented line belongs to the line above it (a segment's blocks under the segment), so
    indented lines become a list nested under theirs; notes without indentation stay lines."""
    if not any(n[:1].isspace() for n in notes):
        return "<br>".join(_e(n) for n in notes)
    items: list[tuple[str, list[str]]] = []
    for n in notes:
        if n[:1].isspace() and items:
            items[-1][1].append(n.strip())
        else:
            items.append((n.strip(), []))
    return '<ul class="tree">' + "".join(
        f"<li>{_e(head)}" + (f'<ul>{"".join(f"<li>{_e(c)}</li>" for c in children)}</ul>' if children else "")
        + "</li>" for head, children in items) + "</ul>"


def _section_html(key: str, title: str, intro: str, view: SectionView) -> str:
    """One section of SECTIONS: its title, its table (each row's notes in a row under it), its sentences."""
    parts = [f'<h2 id="{_e(key)}">{_e(title)}</h2>']
    if intro:
        parts.append(f"<p class=small>{_e(intro)}</p>")
    table = view.table
    if table is not None:
        head = "".join(f"<th{' class=num' if i in table.right else ''}>{_e(h)}</th>" for i, h in enumerate(table.headers))
        rows = []
        for k, row in enumerate(table.rows):
            key = f" {table.row_key}={k}" if table.row_key else ""
            if k < len(table.row_titles):
                key += f' title="{_e(table.row_titles[k])}"'
            cells = "".join(f"<td{key if i == 0 else ''}{' class=num' if i in table.right else ''}>{_e(c)}</td>"
                            for i, c in enumerate(row))
            rows.append(f"<tr>{cells}</tr>")
            notes = table.row_notes[k] if k < len(table.row_notes) else []
            if notes:
                rows.append(f"<tr class=why><td colspan={len(table.headers)}>{_notes_html(notes)}</td></tr>")
        parts.append(f'<table class="{table.css}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
        if table.more:
            parts.append(f"<p class=small>{_e(table.more)}</p>")
    parts += [f'<p class="sentence">{_e(s)}</p>' for s in view.sentences]
    parts += [_checked_html(checked) for checked in view.lists]
    return "".join(parts)


def _same_table(an: Anatomy) -> tuple[Any, ...]:
    """What an anatomy's table shows: two markers with the same are listed once."""
    return (an.allocated, an.reserved, tuple((r.bytes, r.count, r.phase, r.category, r.reason, r.site)
                                            for r in an.rows))


def marker_groups(a: Analysis) -> list[list[tuple[str, Anatomy]]]:
    """The markers' anatomies (each label's first marker, as the text report lists them), those with the same
    table in one group, in the order of each group's first marker."""
    groups: dict[tuple[Any, ...], list[tuple[str, Anatomy]]] = {}
    for label in a.marker_labels():
        an = a.anatomy(label)
        groups.setdefault(_same_table(an), []).append((label, an))
    return list(groups.values())


def _markers_html(groups: Sequence[Sequence[tuple[str, Anatomy]]], top: int) -> str:
    """Each group's anatomy, folded: its summary line names every marker it stands for."""
    parts = ['<h2 id="markers">At each marker</h2><p class=small>The blocks live at each marker, grouped as in the '
             "peak anatomy; click a line to open its table. Markers with the same table share one.</p>"]
    for group in groups:
        an = group[0][1]
        names = ", ".join(f"<b>{_e(label)}</b> ({_e(fmt_time(m.t_s))})" for label, m in group)
        parts.append(f'<details class="marker-anatomy" data-markers="{_e(chr(10).join(label for label, _ in group))}">'
                     f"<summary>At marker{'s' if len(group) > 1 else ''} {names}: {_e(fmt_bytes(an.allocated))} "
                     f"allocated, {_e(fmt_bytes(an.reserved))} reserved</summary>"
                     f'{_anatomy_html(an, "anatomy marker-anatomy", top)}</details>')
    return "".join(parts)


# The sections the summary links to, put right after the peak's anatomy (in this order); the others follow the
# markers' anatomies in the order of SECTIONS.
FIRST_SECTIONS = ("ooms", "reserve", "reserve_replays")


def render_html(a: Analysis, *, at: Sequence[str | float] = (), top: int = 30, plan: Brief | None = None) -> str:
    """The whole page; `plan`: what fits at another batch size (plan/brief.py), its line in the summary and its
    plot after the policies."""
    t, tl = a.table, a.timeline
    title = f"torchalloc report: {os.path.basename(t.path) or 'log'}"
    body = [f"<h1>{_e(title)}</h1>",
            f"<p class=small>{_e(t.path)} — device {a.device}, {len(t)} events, {len(a.blocks)} blocks; peak allocated "
            f"<b>{_e(fmt_bytes(tl.peak_allocated))}</b> at {fmt_time(tl.peak_t)}, peak reserved "
            f"<b>{_e(fmt_bytes(tl.peak_reserved))}</b> at {fmt_time(tl.peak_reserved_t)}.</p>"]
    body += [f'<p class="note">{_e(n)}</p>' for n in a.notes]
    peak = a.anatomy("peak") if len(t) else None
    groups = marker_groups(a)
    if peak is not None:
        body.append(summary_html(a, plan.line if plan is not None else ""))
    body.append('<h2>Timeline</h2>')
    body.append("<p class=small>Allocated bytes stacked by the phase that allocated them; above them, the yellow band "
                "is fragmentation (free bytes in segments that hold live blocks) and the blue band the cache (segments "
                "with no live block, and free mapped granules of expandable segments), up to the dashed line, "
                'reserved. Markers are the labels passed to torchalloc.mark(). <a href="#help">Help</a> (at the end of '
                "the page) says how to use it.</p>")
    data = page_data(a, lifetimes_shown=top * 2, modules_shown=top * 2)
    body.append(_controls_html(data))
    body.append(f'<div class="plot">{render_svg(a)}<div id="tooltip" class="tooltip" role="status" hidden></div></div>')
    body.append(_drawing_note(data))
    body.append(_panels_html(data))
    body.append(f'<script type="application/json" id="report-data">{embed_json(data)}</script>')

    if peak is not None:
        body.append('<h2 id="peak-anatomy">Peak anatomy</h2>')
        body.append(_anatomy_html(peak, "anatomy", top))
    first = sorted((s for s in SECTIONS if s.key in FIRST_SECTIONS), key=lambda s: FIRST_SECTIONS.index(s.key))
    for section in first:
        view = section.view(a, top * 2)
        if view is not None:
            body.append(_section_html(section.key, section.title, section.intro, view))
    body.append(plan_html(plan))
    if groups:
        body.append(_markers_html(groups, top))
    labels = {label for group in groups for label, _ in group}
    for x in at:
        if isinstance(x, str) and x in labels:
            continue
        body.append(f"<h2>At {_e(x)}</h2>")
        body.append(_anatomy_html(a.anatomy(x), "anatomy", top))
    for section in (s for s in SECTIONS if s.key not in FIRST_SECTIONS):
        view = section.view(a, top * 2)
        if view is not None:
            body.append(_section_html(section.key, section.title, section.intro, view))
    body.append(help_html())

    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'><title>{_e(title)}</title>"
            f"<style>{_asset('page.css')}</style></head><body>\n" + "\n".join(body) +
            f"\n<script>\n{_asset('units.js')}{_asset('labels.js')}{_asset('page.js')}</script>\n</body></html>\n")


def write_html(a: Analysis, path: str | os.PathLike[str], *, at: Sequence[str | float] = (),
               plan: Brief | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(a, at=at, plan=plan))
