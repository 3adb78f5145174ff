"""The page's section on what fits at another batch size: the predicted peak reserved against the multiple of the
recorded batch, one line per policy, the default's peak allocated dashed under them, the capacity as a line, and
the recorded run as a point (plan/brief.py computes them; `torchalloc plan` says how and with what limits).

A static SVG: nothing here needs the page's script. Its legend is HTML, under the plot.
"""
from __future__ import annotations

import html
from typing import Any

from ..plan import Brief, fmt_capacity
from ..units import fmt_bytes
from .svg import PALETTE, byte_ticks, nice_step

__all__ = ["plan_html"]

W, H = 760, 330
LEFT, RIGHT, TOP, BOTTOM = 84, 24, 18, 46


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _svg(b: Brief, colors: dict[str, str]) -> str:
    plan, points = b.plan, b.points or {}
    assert plan is not None
    drawn = {k: [p for p in got if p is not None] for k, got in points.items()}
    x_max = max((p[0] for line in drawn.values() for p in line), default=4.0)
    tops = [p[2] for line in drawn.values() for p in line] + [plan.recorded_allocated, plan.capacity or 0]
    y_max = max(tops + [1]) * 1.08

    def X(x: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * x / x_max

    def Y(y: float) -> float:
        return H - BOTTOM - (H - TOP - BOTTOM) * y / y_max

    parts = [f'<svg class="plan-plot" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
             f'aria-label="predicted peak reserved against the batch, per policy">']
    for tick in byte_ticks(y_max):
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{Y(tick):.1f}" y2="{Y(tick):.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{LEFT - 6}" y="{Y(tick) + 4:.1f}" text-anchor="end" class="tick">'
                     f"{_e(fmt_bytes(tick))}</text>")
    step = nice_step(x_max, 8)
    k = 0
    while k * step <= x_max + 1e-9:
        x = k * step
        parts.append(f'<line x1="{X(x):.1f}" x2="{X(x):.1f}" y1="{H - BOTTOM}" y2="{H - BOTTOM + 4}" stroke="#888"/>'
                     f'<text x="{X(x):.1f}" y="{H - BOTTOM + 17}" text-anchor="middle" class="tick">{x:g}x</text>')
        k += 1
    parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}" stroke="#888"/>'
                 f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 8}" text-anchor="middle" class="legend">multiple '
                 "of the recorded batch</text>")
    if plan.capacity:
        assumed = " (assumed)" if b.assumed else ""
        parts.append(f'<g class="plan-capacity"><line x1="{LEFT}" x2="{W - RIGHT}" y1="{Y(plan.capacity):.1f}" '
                     f'y2="{Y(plan.capacity):.1f}" stroke="#b01e1e" stroke-dasharray="6 3"/><text x="{W - RIGHT}" '
                     f'y="{Y(plan.capacity) - 5:.1f}" text-anchor="end" class="legend">capacity '
                     f"{_e(fmt_capacity(plan.capacity))}{assumed}</text></g>")
    default = plan.default
    for policy, line in drawn.items():
        if not line:
            continue
        width = 2.6 if default is not None and policy == default.policy else 1.3
        path = " ".join(f"{'M' if j == 0 else 'L'}{X(x):.1f},{Y(r):.1f}" for j, (x, _, r) in enumerate(line))
        parts.append(f'<path class="plan-line" data-policy="{_e(policy)}" d="{path}" fill="none" '
                     f'stroke="{colors[policy]}" stroke-width="{width}"><title>{_e(policy)}: peak reserved</title>'
                     "</path>")
        parts.extend(f'<circle class="plan-point" cx="{X(x):.1f}" cy="{Y(r):.1f}" r="2.2" fill="{colors[policy]}">'
                     f"<title>{_e(policy)} at {x:g}x: {_e(fmt_bytes(r))} reserved</title></circle>"
                     for x, _, r in line)
    if default is not None and drawn.get(default.policy):
        path = " ".join(f"{'M' if j == 0 else 'L'}{X(x):.1f},{Y(a):.1f}"
                        for j, (x, a, _) in enumerate(drawn[default.policy]))
        parts.append(f'<path class="plan-allocated" d="{path}" fill="none" stroke="#555" stroke-dasharray="3 3" '
                     f'stroke-width="1.2"><title>{_e(default.policy)}: peak allocated</title></path>')
    recorded = plan.recorded_reserved if plan.recorded_reserved is not None else plan.recorded_allocated
    parts.append(f'<g class="plan-recorded"><circle cx="{X(1):.1f}" cy="{Y(recorded):.1f}" r="4.5" fill="#000"/>'
                 f"<title>recorded at 1x: {_e(fmt_bytes(plan.recorded_allocated))} allocated, "
                 f"{_e(fmt_bytes(plan.recorded_reserved))} reserved ({_e(plan.recorded_by)})</title></g>")
    parts.append("</svg>")
    return "".join(parts)


def plan_html(b: Brief | None) -> str:
    """The section: its title, the summary's line, the plot and its legend ("" without a plan or its points)."""
    if b is None:
        return ""
    head = '<h2 id="plan">What fits at another batch size</h2>'
    if b.plan is None or not b.points:
        return head + f'<p class="sentence">{_e(b.line)}</p>' if b.line else ""
    colors = {policy: PALETTE[k % len(PALETTE)] for k, policy in enumerate(b.points)}
    default = b.plan.default
    keys = "".join(f'<li><span class="key" style="background:{c}"></span>{_e(p)}'
                   f'{" (the default)" if default is not None and p == default.policy else ""}</li>'
                   for p, c in colors.items())
    keys += ('<li><span class="key plan-key-allocated"></span>peak allocated (the default)</li>'
             '<li><span class="key plan-key-recorded"></span>recorded run</li>')
    return (head + '<p class=small>Predicted from this run (<code>torchalloc plan</code>): activations and '
            "temporaries grow with the batch, parameters, gradients and optimizer state do not; each point "
            "replays the run with its sizes grown, under each policy, on the simulated device: at 1x the run as "
            "recorded (What each policy would have reserved, above), the default at 2x (the line above), and every "
            "policy where the bytes live at once reach the capacity, beyond which no policy fits (at least 4x, at "
            "most 160x); the lines are straight between the points. "
            "torchalloc plan says what the prediction assumes and how far off it can be.</p>"
            f'<p class="sentence">{_e(b.line)}</p><div class="plan-plot">{_svg(b, colors)}</div>'
            f'<ul class="plan-legend">{keys}</ul>')
