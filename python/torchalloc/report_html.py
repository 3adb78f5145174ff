"""The report as one self-contained HTML page: an inline SVG timeline and tables.

Nothing is fetched from the network (no CDN, no fonts, no scripts from
elsewhere): the page opens from a file on an offline machine or as a CI
artifact. The SVG is drawn here in Python:

- one filled area per phase (`path.phase-area`, `data-phase=NAME`), stacked:
  the allocated bytes of the blocks each phase allocated;
- reserved bytes as a dashed line (`path.reserved-line`);
- markers as labelled vertical lines (`g.marker`), OOMs as red crosses;
- the peak of allocated as a labelled dot (`g.peak-marker`);
- the phase occurrences as a strip under the plot.

A few lines of inline JavaScript show the values under the mouse; the
page is complete without them.
"""
from __future__ import annotations

import html
import json
import math
import os
from typing import Any, Sequence

import numpy as np

from .analysis import Analysis, Anatomy
from .units import byte_unit, fmt_axis_seconds, fmt_bytes, fmt_seconds, fmt_time

__all__ = ["render_html", "write_html", "PALETTE"]

# Tableau 10: distinct, readable on white, colour-blind friendly enough.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")

W, H = 1100, 400
LEFT, RIGHT, TOP, BOTTOM = 84, 24, 28, 62
STRIP = 10  # height of the phase strip under the plot


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _byte_ticks(top: float) -> list[int]:
    """About five round tick values in binary units up to `top`."""
    if top <= 0:
        return [0]
    _, unit = byte_unit(top)
    step = _nice_step(top / unit, 5) * unit
    return [int(i * step) for i in range(int(top // step) + 1)]


def phase_colors(names: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def render_svg(a: Analysis) -> str:
    """The timeline as an SVG element."""
    tl = a.timeline
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    x_max = max(tl.duration_s, float(tl.t_s[-1]) if len(tl.t_s) else 0.0) or 1.0
    y_max = max(tl.peak_reserved, tl.peak_allocated, 1) * 1.08

    def X(t: float | np.ndarray) -> Any:
        return LEFT + np.asarray(t, dtype=np.float64) / x_max * plot_w

    def Y(v: float | np.ndarray) -> Any:
        return TOP + plot_h - np.asarray(v, dtype=np.float64) / y_max * plot_h

    parts = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
             f'role="img" aria-label="allocated and reserved bytes over time">']
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fbfbfd" stroke="#d0d0d8"/>')
    # grid and axes
    for v in _byte_ticks(y_max):
        y = float(Y(v))
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e6ee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_e(fmt_bytes(v))}</text>')
    step = _nice_step(x_max, 8)
    k = 0
    while k * step <= x_max * 1.0001:
        x = float(X(k * step))
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#eeeef4"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + STRIP + 18}" text-anchor="middle" class="tick">'
                     f'{_e(fmt_axis_seconds(k * step, x_max))}</text>')
        k += 1
    # stacked phase areas
    names = list(tl.by_phase)
    colors = phase_colors(names)
    # levels hold until the next event: draw steps (each x twice, each value from the previous x)
    xs = np.repeat(X(tl.t_s), 2)[1:] if len(tl.t_s) else np.zeros(0)

    def step(v: np.ndarray) -> np.ndarray:
        return np.repeat(np.asarray(v, dtype=np.float64), 2)[:-1]

    lower = np.zeros(len(xs), dtype=np.float64)
    for name in names:
        upper = lower + step(tl.by_phase[name])
        if len(xs) and upper.max() > 0:
            top_pts = " L".join(f"{x:.2f},{y:.2f}" for x, y in zip(xs, Y(upper)))
            bot_pts = " L".join(f"{x:.2f},{y:.2f}" for x, y in zip(xs[::-1], Y(lower)[::-1]))
            parts.append(f'<path class="phase-area" data-phase="{_e(name)}" fill="{colors[name]}" fill-opacity="0.82" '
                         f'stroke="{colors[name]}" stroke-width="0.6" d="M{top_pts} L{bot_pts} Z">'
                         f'<title>allocated by {_e(name)}</title></path>')
        lower = upper
    # reserved
    if len(xs):
        pts = " L".join(f"{x:.2f},{y:.2f}" for x, y in zip(xs, Y(step(tl.reserved))))
        parts.append(f'<path class="reserved-line" fill="none" stroke="#222" stroke-width="1.6" stroke-dasharray="6 3" '
                     f'd="M{pts}"><title>reserved</title></path>')
    # phase strip
    strip_y = TOP + plot_h + 2
    for name, t0, t1 in tl.phase_spans[:4000]:
        x0, x1 = float(X(t0)), float(X(t1))
        parts.append(f'<rect class="phase-span" data-phase="{_e(name)}" x="{x0:.2f}" y="{strip_y}" '
                     f'width="{max(x1 - x0, 0.8):.2f}" height="{STRIP}" fill="{colors.get(name, "#999")}">'
                     f'<title>{_e(name)}: {_e(fmt_time(t0))} to {_e(fmt_seconds(t1))}</title></rect>')
    # markers
    for i, (ts, label, phase) in enumerate(tl.markers[:200]):
        x = float(X(ts))
        ly = TOP + 12 + (i % 4) * 13
        parts.append(f'<g class="marker" data-label="{_e(label)}"><line x1="{x:.2f}" x2="{x:.2f}" y1="{TOP}" '
                     f'y2="{TOP + plot_h}" stroke="#6b4fa0" stroke-width="1" stroke-dasharray="2 2"/>'
                     f'<text x="{x + 3:.2f}" y="{ly}" class="marker-label">{_e(label)}</text>'
                     f'<title>marker {_e(label)} at {_e(fmt_time(ts))} ({_e(phase)})</title></g>')
    # OOMs
    for ts, size in tl.ooms:
        x, y = float(X(ts)), float(Y(tl.peak_reserved))
        parts.append(f'<g class="oom-marker"><path d="M{x - 6:.1f},{y - 6:.1f} L{x + 6:.1f},{y + 6:.1f} M{x - 6:.1f},'
                     f'{y + 6:.1f} L{x + 6:.1f},{y - 6:.1f}" stroke="#d62728" stroke-width="3"/>'
                     f'<title>out of memory: {_e(fmt_bytes(size))} asked at {_e(fmt_time(ts))}</title></g>')
    # peak
    if tl.peak_allocated:
        px, py = float(X(tl.peak_t)), float(Y(tl.peak_allocated))
        anchor = "end" if px > LEFT + plot_w * 0.75 else "start"
        dx = -9 if anchor == "end" else 9
        parts.append(f'<g class="peak-marker"><circle cx="{px:.2f}" cy="{py:.2f}" r="5.5" fill="#d62728" stroke="#fff" '
                     f'stroke-width="1.5"/><text x="{px + dx:.2f}" y="{max(py - 8, TOP + 12):.2f}" text-anchor="{anchor}" '
                     f'class="peak-label">peak {_e(fmt_bytes(tl.peak_allocated))} at {fmt_time(tl.peak_t)}</text></g>')
    # legend
    lx, ly = LEFT, H - 14
    for name in names:
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="10" fill="{colors[name]}"/>'
                     f'<text x="{lx + 16}" y="{ly}" class="legend">{_e(name)}</text>')
        lx += 28 + 7 * len(name)
    parts.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{ly - 4}" y2="{ly - 4}" stroke="#222" stroke-width="1.6" '
                 f'stroke-dasharray="6 3"/><text x="{lx + 26}" y="{ly}" class="legend">reserved</text>')
    parts.append(f'<line id="cursor" x1="0" x2="0" y1="{TOP}" y2="{TOP + plot_h}" stroke="#888" visibility="hidden"/>')
    parts.append("</svg>")
    return "\n".join(parts)


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
