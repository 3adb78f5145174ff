"""The report as one self-contained HTML page: an inline SVG timeline and tables.

Nothing is fetched from the network (no CDN, no fonts, no scripts from
elsewhere): the page opens from a file on an offline machine or as a CI
artifact. The timeline is report_svg.py's; the tables are drawn here.

A few lines of inline JavaScript show the values under the mouse; the
page is complete without them.
"""
from __future__ import annotations

import html
import json
import os
from typing import Any, Sequence

from .analysis import Analysis, Anatomy
from .report_svg import LEFT, PALETTE, RIGHT, W, phase_colors, render_svg
from .units import fmt_bytes, fmt_seconds, fmt_time

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


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1180px;
       color: #1d1d24; background: #fff; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #e3e3ea; }
.small, .note { color: #555; font-size: 12.5px; } .note { background: #fff8e1; padding: 4px 8px; border-radius: 4px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; margin: 6px 0; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #ececf2; vertical-align: top; }
th { background: #f4f4f8; font-weight: 600; } td.num, th.num { text-align: right; white-space: nowrap; }
tr.why td { color: #444; border-bottom: 1px solid #e0e0ea; padding-top: 0; font-size: 12.5px; }
svg text.tick { font-size: 11px; fill: #555; } svg text.legend { font-size: 12px; fill: #333; }
svg text.marker-label { font-size: 11px; fill: #6b4fa0; } svg text.peak-label { font-size: 12px; font-weight: 600; fill: #b01e1e; }
#readout { font: 12px ui-monospace, monospace; color: #333; min-height: 1.4em; }
.sentence { margin: 2px 0 2px 8px; }
"""

_JS = """
(function () {
  var d = JSON.parse(document.getElementById('timeline-data').textContent);
  var svg = document.getElementById('timeline'), out = document.getElementById('readout');
  var cursor = document.getElementById('cursor');
  if (!svg || !d.t.length) return;
  function fmt(n) { var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0; while (Math.abs(n) >= 1024 && i < 4) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + ' ' + u[i]; }
  svg.addEventListener('mousemove', function (ev) {
    var r = svg.getBoundingClientRect(), x = (ev.clientX - r.left) * d.w / r.width;
    var t = (x - d.left) / d.pw * d.xmax, lo = 0, hi = d.t.length - 1;
    while (lo < hi) { var m = (lo + hi + 1) >> 1; if (d.t[m] <= t) lo = m; else hi = m - 1; }
    cursor.setAttribute('x1', x); cursor.setAttribute('x2', x); cursor.setAttribute('visibility', 'visible');
    out.textContent = 't=' + d.t[lo].toFixed(4) + ' s   allocated ' + fmt(d.a[lo]) + '   reserved ' + fmt(d.r[lo]);
  });
})();
"""


def render_html(a: Analysis, *, at: Sequence[str | float] = (), top: int = 30) -> str:
    """The whole page."""
    t, tl = a.table, a.timeline
    title = f"torchalloc report: {os.path.basename(t.path) or 'log'}"
    body = [f"<h1>{_e(title)}</h1>",
            f"<p class=small>{_e(t.path)} — device {a.device}, {len(t)} events, {len(a.blocks)} blocks; peak allocated "
            f"<b>{_e(fmt_bytes(tl.peak_allocated))}</b> at {fmt_time(tl.peak_t)}, peak reserved "
            f"<b>{_e(fmt_bytes(tl.peak_reserved))}</b> at {fmt_time(tl.peak_reserved_t)}.</p>"]
    body += [f'<p class="note">{_e(n)}</p>' for n in a.notes]
    body.append("<h2>Timeline</h2>")
    body.append("<p class=small>Allocated bytes stacked by the phase that allocated them; the dashed line is "
                "reserved. Markers are the labels passed to torchalloc.mark().</p>")
    body.append(render_svg(a))
    body.append('<div id="readout"></div>')
    data = {"t": [round(float(x), 6) for x in tl.t_s], "a": tl.allocated.tolist(), "r": tl.reserved.tolist(),
            "w": W, "left": LEFT, "pw": W - LEFT - RIGHT,
            "xmax": max(tl.duration_s, float(tl.t_s[-1]) if len(tl.t_s) else 0.0) or 1.0}
    payload = json.dumps(data).replace("</", "<\\/")  # never closes the script element early
    body.append(f'<script type="application/json" id="timeline-data">{payload}</script>')

    if len(t):
        body.append("<h2>Peak anatomy</h2>")
        body.append(_anatomy_html(a.anatomy("peak"), "anatomy", top))
    for label in [m[1] for m in tl.markers][:20]:
        body.append(f"<h2>At marker {_e(label)}</h2>")
        body.append(_anatomy_html(a.anatomy(label), "anatomy marker-anatomy", top))
    for x in at:
        if isinstance(x, str) and x in [m[1] for m in tl.markers][:20]:
            continue
        body.append(f"<h2>At {_e(x)}</h2>")
        body.append(_anatomy_html(a.anatomy(x), "anatomy", top))

    body.append("<h2>Lifetimes</h2><p class=small>Per allocation site: why its blocks were freed when they were.</p>")
    head = "".join(f"<th{c}>{h}</th>" for h, c in (("allocated at", ""), ("reason", ""), ("category", ""),
                                                   ("blocks", " class=num"), ("bytes", " class=num"),
                                                   ("typical lifetime", " class=num"), ("phases", "")))
    rows = []
    for r in a.lifetimes()[:top * 2]:
        life = fmt_seconds(r.typical_lifetime_s) if r.typical_lifetime_s >= 0 else "until the end"
        rows.append(f"<tr><td title=\"{_e(r.location)}\">{_e(r.site)}</td><td>{_e(r.reason)}</td><td>{_e(r.category)}</td>"
                    f"<td class=num>{r.count}</td><td class=num>{_e(fmt_bytes(r.bytes))}</td><td class=num>{_e(life)}</td>"
                    f"<td>{_e(', '.join(r.phases))}</td></tr>"
                    f"<tr class=why><td colspan=7>{_e(r.explanation)}</td></tr>")
    body.append(f'<table class="lifetimes"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')

    phases = a.phases()
    if phases:
        body.append("<h2>Phases</h2>")
        prow = [p.cells() for p in phases]
        body.append(_rows_html(["phase", "occurrences", "allocated", "freed", "peak", "reserved growth", "persistent",
                                "handed on", "transient"], prow, "phases", range(1, 9)))
        body += [f'<p class="sentence">{_e(p.sentence)}</p>' for p in phases]

    est = a.estimate()
    body.append("<h2>The usual estimate, measured</h2>")
    erow = [(term, fmt_bytes(n)) for term, n in est.rows()]
    body.append(_rows_html(["term (peak live bytes)", "bytes"], erow, "estimate", (1,)))
    body.append(f"<p>{_e(est.sentence)}</p>")

    ooms = a.ooms()
    if ooms:
        body.append("<h2>Out of memory</h2>")
        orow = [(fmt_time(o.t_s), o.phase, o.site, fmt_bytes(o.requested), fmt_bytes(o.allocated), fmt_bytes(o.reserved),
                 fmt_bytes(o.largest_free_range), o.verdict, o.explanation) for o in ooms]
        body.append(_rows_html(["time", "phase", "at", "asked", "allocated", "reserved", "largest free range", "verdict",
                                "why"], orow, "ooms", (3, 4, 5, 6)))

    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + f"\n<script>{_JS}</script>\n</body></html>\n")


def write_html(a: Analysis, path: str | os.PathLike[str], *, at: Sequence[str | float] = ()) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(a, at=at))
