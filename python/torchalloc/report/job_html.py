"""The job's report as one self-contained HTML page: every rank's timeline on one plot, and the tables.

A static page (no script: nothing to go wrong between ranks' ids): an SVG
with each rank's allocated bytes as a solid line and its reserved bytes as
a dashed line of the same colour, on one clock (the ranks' logs are aligned
by their wall-clock start, so a rank that fell behind shows as shifted);
then the tables of `torchalloc report LOG LOG ...`, and per rank a folded
section with its peak anatomy and phases. One rank's interactive page is
`torchalloc report LOG --html`. Nothing is fetched from the network.
"""
from __future__ import annotations

import html
import os
from typing import Any, Sequence

from ..analysis.job import GroupRow, Job, RankDetail
from .html import _anatomy_html, _asset, _rows_html
from .svg import PALETTE
from ..units import fmt_bytes, fmt_time

__all__ = ["render_job_html", "write_job_html"]

W, H = 1100, 360
LEFT, RIGHT, TOP, BOTTOM = 84, 24, 20, 60


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _starts_s(details: Sequence[RankDetail]) -> list[float]:
    """Each rank's time zero on the job's clock: seconds after the earliest rank's (wall-clock aligned)."""
    walls = [d.wall_start_ns for d in details]
    first = min(walls) if walls else 0
    return [(w - first) / 1e9 for w in walls]


def render_job_svg(job: Job) -> str:
    """Allocated (solid) and reserved (dashed) over the job's time, one colour per rank."""
    starts = _starts_s(job.details)
    ends = [s + float(d.t_s[-1]) if len(d.t_s) else s for s, d in zip(starts, job.details)]
    span = max(max(ends, default=0.0), 1e-9)
    top = max([r.peak_reserved for r in job.ranks] + [r.peak_allocated for r in job.ranks] + [1])
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + pw * t / span

    def y(v: float) -> float:
        return TOP + ph * (1 - v / top)

    parts = [f'<svg class="job-timeline" viewBox="0 0 {W} {H}" width="100%" role="img" '
             f'aria-label="allocated and reserved bytes of every rank over time">',
             f'<rect x={LEFT} y={TOP} width={pw} height={ph} fill="#fbfbfd" stroke="#ddd"/>']
    for k in range(5):
        v = top * k / 4
        parts.append(f'<line x1={LEFT} x2={W - RIGHT} y1={y(v):.1f} y2={y(v):.1f} stroke="#eee"/>'
                     f'<text class="tick" x={LEFT - 6} y={y(v) + 4:.1f} text-anchor="end">{_e(fmt_bytes(v))}</text>')
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"  # the ends stay inside the picture
        parts.append(f'<text class="tick" x={x(span * k / 4):.1f} y={H - BOTTOM + 16} text-anchor="{anchor}">'
                     f'{_e(fmt_time(span * k / 4))}</text>')
    for k, (r, d, start) in enumerate(zip(job.ranks, job.details, starts)):
        color = PALETTE[k % len(PALETTE)]
        for values, dash in ((d.allocated, ""), (d.reserved, ' stroke-dasharray="5 3"')):
            points = " ".join(f"{x(start + float(t)):.1f},{y(float(v)):.1f}" for t, v in zip(d.t_s, values))
            parts.append(f'<polyline class="rank-line" data-rank={r.rank} fill="none" stroke="{color}" '
                         f'stroke-width=1.5{dash} points="{points}"/>')
        px, py = x(start + r.peak_t_s), y(r.peak_allocated)
        parts.append(f'<circle cx={px:.1f} cy={py:.1f} r=3.5 fill="{color}"><title>rank {r.rank} peak: '
                     f'{_e(fmt_bytes(r.peak_allocated))} at {_e(fmt_time(start + r.peak_t_s))}</title></circle>')
        lx = LEFT + 10 + 150 * k
        parts.append(f'<line x1={lx} x2={lx + 22} y1={H - 18} y2={H - 18} stroke="{color}" stroke-width="2"/>'
                     f'<text class="legend" x={lx + 28} y={H - 14}>rank {r.rank}</text>')
    parts.append(f'<text class="legend" x={W - RIGHT} y={H - 14} text-anchor="end">solid: allocated; dashed: '
                 'reserved</text></svg>')
    return "".join(parts)


def _groups_html(job: Job, groups: Sequence[GroupRow], cls: str, top: int) -> str:
    rows = [[g.site, fmt_bytes(g.block_size), g.category] + [f"{c} = {fmt_bytes(n)}" if c else "-"
                                                              for c, n in zip(g.counts, g.bytes)] for g in groups[:top]]
    headers = ["allocated at", "block", "category"] + [f"rank {r.rank}" for r in job.ranks]
    more = f"<p class=small>... {len(groups) - top} more groups</p>" if len(groups) > top else ""
    return _rows_html(headers, rows, cls, range(3, 3 + len(job.ranks))) + more


def render_job_html(job: Job, *, top: int = 30) -> str:
    """The whole page."""
    ranks = job.ranks
    title = f"torchalloc report: {len(ranks)} ranks"
    world = f", world size {job.world_size}" if job.world_size else ""
    body = [f"<h1>{_e(title)}</h1>",
            f"<p class=small>ranks {_e(', '.join(str(r.rank) for r in ranks))}{_e(world)}: "
            f"{_e(', '.join(os.path.basename(r.path) for r in ranks))}</p>"]
    body += [f'<p class="note">{_e(n)}</p>' for n in job.notes]
    body.append("<h2>Timeline</h2>")
    body.append(f'<div class="plot">{render_job_svg(job)}</div>')
    body.append(f'<p class="why-highest"><b>{_e(job.why_highest())}</b></p>')
    body.append(f'<p class="ooms">{_e(job.oom_sentence())}</p>')
    body.append("<h2>Ranks side by side</h2>")
    rows = [(r.rank, r.device, r.pid, fmt_bytes(r.peak_allocated), fmt_time(r.peak_t_s), fmt_bytes(r.peak_reserved),
             r.phase_at_peak, r.top_sites[0][0] if r.top_sites else "-") for r in ranks]
    body.append(_rows_html(["rank", "device", "pid", "peak allocated", "at", "peak reserved", "phase at peak",
                            "largest site"], rows, "ranks", (0, 1, 2, 3, 4, 5)))
    categories = list(dict.fromkeys(c for r in ranks for c in r.by_category))
    if categories:
        crow = [[c] + [fmt_bytes(r.by_category.get(c, 0)) for r in ranks] for c in categories]
        body.append("<h3>Live at each rank's peak, by category</h3>")
        body.append(_rows_html(["category"] + [f"rank {r.rank}" for r in ranks], crow, "categories",
                               range(1, 1 + len(ranks))))
    body.append(f"<h2>Shared by every rank: {_e(fmt_bytes(job.shared_bytes))} per rank</h2><p class=small>Blocks of "
                "the same allocation site and size, as many in every rank, at each rank's peak.</p>")
    body.append(_groups_html(job, job.shared, "shared", top))
    body.append("<h2>Where the ranks differ</h2><p class=small>Blocks of one site and size held in different numbers "
                "(or by some ranks only), largest spread first.</p>")
    body.append(_groups_html(job, job.differ, "differ", top) if job.differ else "<p>Nowhere.</p>")
    for r, d in zip(ranks, job.details):
        notes = "".join(f'<p class="note">{_e(n)}</p>' for n in d.notes)
        ptable = _rows_html(["phase", "occurrences", "allocated", "freed", "peak", "reserved growth", "persistent",
                             "handed on", "transient"], [p.cells() for p in d.phases], "phases",
                            range(1, 9)) if d.phases else ""
        anatomy = _anatomy_html(d.anatomy, "anatomy", top) if d.anatomy is not None else "<p>No events.</p>"
        body.append(f'<details class="rank" data-rank={r.rank}><summary>Rank {r.rank}: {_e(r.path)}</summary>'
                    f"{notes}<h3>Peak anatomy</h3>{anatomy}<h3>Phases</h3>{ptable}</details>")
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'><title>{_e(title)}</title>"
            f"<style>{_asset('page.css')}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_job_html(job: Job, path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_job_html(job))
