"""The report's timeline as a static inline SVG, drawn in Python.

The page shows it as it is when JavaScript is off; with JavaScript the
page's script (page.js) redraws the same picture from the embedded
data, zoomed and panned, with the same classes and colours. Drawn here:

- one filled area per phase (`path.phase-area`, `data-phase=NAME`), stacked:
  the allocated bytes of the blocks each phase allocated;
- the free bytes in segments that hold live blocks (fragmentation) as a band
  on top of allocated (`path.fragmented-area`), the wholly free segments
  (cache) as a band on top of that up to reserved (`path.cache-area`), and
  reserved bytes as a dashed line (`path.reserved-line`);
- markers as vertical lines (`g.marker`), their labels in rows above the
  plot (labels.py: none overlaps another), each with a leader to its line;
  OOMs as red crosses;
- the peak of allocated as a labelled dot (`g.peak-marker`);
- the phase occurrences as a strip under the plot.

The time axis spans the logged activity: from just before the first event
(a log often opens long before the first allocation: imports, data loading)
to the end of the log.
"""
from __future__ import annotations

import html
import math
from typing import Any, Sequence

import numpy as np

from ..analysis import Analysis
from ..units import byte_unit, fmt_axis_seconds, fmt_bytes, fmt_seconds, fmt_time
from .labels import place_labels, text_width

__all__ = ["render_svg", "phase_colors", "plot_extent", "plot_top", "nice_step", "byte_ticks", "PALETTE", "W", "H",
           "LEFT", "RIGHT", "TOP", "BOTTOM", "STRIP", "LABEL_ROWS", "ROW_H", "MAX_SPANS", "MAX_MARKERS", "CACHE_FILL",
           "FRAG_FILL"]

def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


# Tableau 10: distinct, readable on white, colour-blind friendly enough.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")

W, H = 1100, 400  # H: without markers; their labels' rows add LABEL_ROWS * ROW_H above the plot
LEFT, RIGHT, TOP, BOTTOM = 84, 24, 28, 62
LABEL_ROWS, ROW_H = 3, 13  # rows of marker labels above the plot, and their height
STRIP = 10  # height of the phase strip under the plot
FRAG_FILL, CACHE_FILL = "#f2c14e", "#9fbbe0"  # fragmentation's band, the cache's band
MAX_SPANS = 4000  # phase occurrences drawn in the strip
MAX_MARKERS = 200  # markers drawn


def nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def byte_ticks(top: float) -> list[int]:
    """About five round tick values in binary units up to `top`."""
    if top <= 0:
        return [0]
    _, unit = byte_unit(top)
    step = nice_step(top / unit, 5) * unit
    return [int(i * step) for i in range(int(top // step) + 1)]


def phase_colors(names: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def plot_extent(tl: Any) -> tuple[float, float, float]:
    """The plot's left and right ends in seconds and its top in bytes (room above the highest curve): the SVG and
    the page's script draw to the same scales. The left end is 1 % of the activity's span before its first event
    (the first sample, marker or phase occurrence), not the log's opening."""
    x_max = max(tl.duration_s, float(tl.t_s[-1]) if len(tl.t_s) else 0.0)
    starts = [float(tl.t_s[0])] if len(tl.t_s) else []
    starts += [float(tl.markers[0][0])] if tl.markers else []
    starts += [float(tl.phase_spans[0][1])] if tl.phase_spans else []
    first = min(starts, default=0.0)
    x_min = max(0.0, first - 0.01 * (x_max - first))
    if x_max <= x_min:  # no span at all (one event): a second after it
        x_max = x_min + 1.0
    return x_min, x_max, max(tl.peak_reserved, tl.peak_allocated, 1) * 1.08


def _tick_label(value: float, step: float, x_min: float, span: float) -> str:
    """A time tick's label: in the unit the span suits (units.py), or, for a plot that starts a second or more
    into the log, in seconds with the decimals the step needs (15.0001 s reads better than 15000100 µs), as
    page.js labels its ticks."""
    if x_min < 1:
        return fmt_axis_seconds(value, span)
    decimals = len(f"{step:.12f}".rstrip("0").split(".")[1])
    return f"{value:.{decimals}f} s"


def plot_top(has_markers: bool) -> int:
    """The plot's top edge: below the rows of marker labels when there are markers."""
    return TOP + (LABEL_ROWS * ROW_H if has_markers else 0)


def _markers_svg(tl: Any, X: Any, top: int, bottom: float) -> list[str]:
    """The markers: a line each, its label in a row above the plot (labels.py) with a leader down to the line."""
    markers = tl.markers[:MAX_MARKERS]
    xs = [float(X(ts)) for ts, _, _ in markers]
    places = place_labels(xs, [text_width(label) for _, label, _ in markers], LEFT, W - RIGHT, LABEL_ROWS)
    parts = []
    for (ts, label, phase), x, place in zip(markers, xs, places):
        drawn = ""
        if place is not None:
            base = top - 14 - (LABEL_ROWS - 1 - place.row) * ROW_H  # row 0 at the top: the longest leaders
            centre = place.left + text_width(label) / 2
            drawn = (f'<line class="marker-leader" x1="{centre:.2f}" y1="{base + 3}" x2="{x:.2f}" y2="{top}" '
                     f'stroke="#6b4fa0" stroke-width="0.7" stroke-opacity="0.6"/>'
                     f'<text x="{place.left:.2f}" y="{base}" class="marker-label" data-row="{place.row}">'
                     f'{_e(label)}</text>')
        parts.append(f'<g class="marker" data-label="{_e(label)}"><line x1="{x:.2f}" x2="{x:.2f}" y1="{top}" '
                     f'y2="{bottom}" stroke="#6b4fa0" stroke-width="1" stroke-dasharray="2 2"/>{drawn}'
                     f'<title>marker {_e(label)} at {_e(fmt_time(ts))} ({_e(phase)})</title></g>')
    return parts


def _legend_svg(names: list[str], colors: dict[str, str], y: int) -> list[str]:
    """The legend: each phase's colour, the two bands above allocated, the reserved line."""
    parts, lx = [], LEFT
    for name in names:
        parts.append(f'<rect x="{lx}" y="{y - 9}" width="12" height="10" fill="{colors[name]}"/>'
                     f'<text x="{lx + 16}" y="{y}" class="legend">{_e(name)}</text>')
        lx += 28 + 7 * len(name)
    for cls, fill, stroke, text in (("legend-fragmentation", FRAG_FILL, "#b07a00", "fragmentation"),
                                    ("legend-cache", CACHE_FILL, "#5b7fb0", "cache (free segments)")):
        parts.append(f'<rect class="{cls}" x="{lx}" y="{y - 9}" width="12" height="10" fill="{fill}" '
                     f'fill-opacity="0.55" stroke="{stroke}"/><text x="{lx + 16}" y="{y}" class="legend">{text}</text>')
        lx += 28 + 7 * len(text)
    parts.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{y - 4}" y2="{y - 4}" stroke="#222" stroke-width="1.6" '
                 f'stroke-dasharray="6 3"/><text x="{lx + 26}" y="{y}" class="legend">reserved</text>')
    return parts


def _band(xs: np.ndarray, Y: Any, lower: np.ndarray, upper: np.ndarray) -> str:
    """The path of the area between two step curves."""
    top_pts = " L".join(f"{x:.2f},{y:.2f}" for x, y in zip(xs, Y(upper)))
    bot_pts = " L".join(f"{x:.2f},{y:.2f}" for x, y in zip(xs[::-1], Y(lower)[::-1]))
    return f"M{top_pts} L{bot_pts} Z"


def render_svg(a: Analysis) -> str:
    """The timeline as an SVG element."""
    tl = a.timeline
    top = plot_top(bool(tl.markers))
    height = H + top - TOP
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    x_min, x_max, y_max = plot_extent(tl)

    def X(t: float | np.ndarray) -> Any:
        return LEFT + (np.asarray(t, dtype=np.float64) - x_min) / (x_max - x_min) * plot_w

    def Y(v: float | np.ndarray) -> Any:
        return top + plot_h - np.asarray(v, dtype=np.float64) / y_max * plot_h

    parts = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" '
             f'height="{height}" role="img" aria-label="allocated and reserved bytes over time">']
    parts.append(f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fbfbfd" stroke="#d0d0d8"/>')
    # grid and axes
    for v in byte_ticks(y_max):
        y = float(Y(v))
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e6ee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_e(fmt_bytes(v))}</text>')
    step = nice_step(x_max - x_min, 8)
    k = math.ceil(x_min / step - 1e-9)
    while k * step <= x_max * 1.0001:
        x = float(X(k * step))
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" stroke="#eeeef4"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + STRIP + 18}" text-anchor="middle" class="tick">'
                     f'{_e(_tick_label(k * step, step, x_min, x_max - x_min))}</text>')
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
            parts.append(f'<path class="phase-area" data-phase="{_e(name)}" fill="{colors[name]}" fill-opacity="0.82" '
                         f'stroke="{colors[name]}" stroke-width="0.6" d="{_band(xs, Y, lower, upper)}">'
                         f'<title>allocated by {_e(name)}</title></path>')
        lower = upper
    # fragmentation: free bytes in segments that hold live blocks, as a band above allocated; the cache (wholly
    # free segments) above it, up to reserved
    frag = np.asarray(a.fragmented_samples(), dtype=np.float64)
    if len(xs) and frag.size == len(tl.t_s):
        frag_top = lower + step(frag)
        if frag.max(initial=0) > 0:
            parts.append(f'<path class="fragmented-area" fill="{FRAG_FILL}" fill-opacity="0.55" stroke="#b07a00" '
                         f'stroke-width="0.5" d="{_band(xs, Y, lower, frag_top)}"><title>free in segments that hold '
                         f'live blocks (fragmentation)</title></path>')
        reserved = np.maximum(step(tl.reserved), frag_top)
        if (reserved > frag_top).any():
            parts.append(f'<path class="cache-area" fill="{CACHE_FILL}" fill-opacity="0.55" stroke="#5b7fb0" '
                         f'stroke-width="0.5" d="{_band(xs, Y, frag_top, reserved)}"><title>wholly free segments '
                         f'(cache) and free mapped granules of expandable segments: reserved, no live block in '
                         f'them</title></path>')
    # reserved
    if len(xs):
        pts = " L".join(f"{x:.2f},{y:.2f}" for x, y in zip(xs, Y(step(tl.reserved))))
        parts.append(f'<path class="reserved-line" fill="none" stroke="#222" stroke-width="1.6" stroke-dasharray="6 3" '
                     f'd="M{pts}"><title>reserved</title></path>')
    # phase strip
    strip_y = top + plot_h + 2
    for name, t0, t1 in tl.phase_spans[:MAX_SPANS]:
        x0, x1 = float(X(t0)), float(X(t1))
        parts.append(f'<rect class="phase-span" data-phase="{_e(name)}" x="{x0:.2f}" y="{strip_y}" '
                     f'width="{max(x1 - x0, 0.8):.2f}" height="{STRIP}" fill="{colors.get(name, "#999")}">'
                     f'<title>{_e(name)}: {_e(fmt_time(t0))} to {_e(fmt_seconds(t1))}</title></rect>')
    parts += _markers_svg(tl, X, top, top + plot_h)
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
                     f'stroke-width="1.5"/><text x="{px + dx:.2f}" y="{max(py - 8, top + 12):.2f}" text-anchor="{anchor}" '
                     f'class="peak-label">peak {_e(fmt_bytes(tl.peak_allocated))} at {fmt_time(tl.peak_t)}</text></g>')
    parts += _legend_svg(names, colors, height - 14)
    parts.append(f'<line id="cursor" x1="0" x2="0" y1="{top}" y2="{top + plot_h}" stroke="#888" visibility="hidden"/>')
    parts.append("</svg>")
    return "\n".join(parts)
