"""The answer, at the top of the HTML page: what the rest of the page shows in detail, in a few lines.

- the peak: allocated and reserved then, when, in which phase; the peak of
  reserved when it came at another moment;
- reserved memory split into allocated, fragmentation (free bytes in
  segments that hold live blocks) and cache (wholly free segments), at the
  peak of reserved and at the peak of allocated, as bars;
- the three largest groups of blocks live at the peak, with their reason and
  the source line that allocated them;
- one line per marker (markers with the same live blocks share a line);
- the one change that would have saved the most (the replays' sentence);
- the first OOM's verdict and the first line of its advice.

Each line links to the section that has the rest. Built from what the page
already computes (the peak's and the markers' anatomies, the reserve
section's rows, the OOM rows), so it says nothing the page does not.
"""
from __future__ import annotations

import html
from typing import Any, Sequence

from ..analysis import Analysis, Anatomy
from ..units import fmt_bytes, fmt_time

__all__ = ["summary_html", "phase_at"]

# The reserve split's parts: (ReserveMoment field, its name on the page, its CSS class). The last two (free
# granules of expandable segments, free bytes in segments from before the log) are named only when not zero.
SPLIT = (("allocated", "allocated", "split-allocated"), ("fragmented", "fragmentation", "split-fragmentation"),
         ("cached", "cache", "split-cache"), ("mapped_free", "mapped free (expandable)", "split-mapped"),
         ("before_log", "before the log", "split-before"))
ALWAYS = 3  # the first three parts are named even when zero
TOP_GROUPS = 3  # the peak's largest groups of live blocks the summary names


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def phase_at(spans: Sequence[tuple[str, float, float]], t: float) -> str | None:
    """The innermost phase running at t: of the occurrences that contain it, the one that began last (as the
    page's tooltip says it)."""
    inside = [s for s in spans if s[1] <= t <= s[2]]
    return max(inside, key=lambda s: s[1])[0] if inside else None


def _peak_line(a: Analysis) -> str:
    tl = a.timeline
    phase = phase_at(tl.phase_spans, tl.peak_t)
    line = (f"<b>{_e(fmt_bytes(tl.peak_allocated))}</b> allocated, "
            f"{_e(fmt_bytes(a.reserved_at(tl.peak_index)))} reserved at {_e(fmt_time(tl.peak_t))}"
            + (f", in {_e(phase)}" if phase else ""))
    if tl.peak_reserved_t != tl.peak_t:
        line += (f"; reserved peaks at <b>{_e(fmt_bytes(tl.peak_reserved))}</b> at "
                 f"{_e(fmt_time(tl.peak_reserved_t))}")
    return line + '. <a href="#peak-anatomy">Peak anatomy</a>'


def _split_bars(a: Analysis) -> str:
    """One bar per moment of the reserve section: allocated, fragmentation and cache, widths to scale."""
    r = a.reserve()
    if not r.moments:
        return ""
    scale = max(m.reserved for m in r.moments) or 1
    rows = []
    for m in r.moments:
        parts = [(getattr(m, key), name, cls) for k, (key, name, cls) in enumerate(SPLIT)
                 if k < ALWAYS or getattr(m, key)]
        bar = "".join(f'<span class="{cls}" style="width:{100 * v / scale:.2f}%" title="{_e(name)} '
                      f'{_e(fmt_bytes(v))}"></span>' for v, name, cls in parts if v > 0)
        words = " + ".join(f'<span class="key {cls}"></span>{_e(fmt_bytes(v))} {_e(name)}' for v, name, cls in parts)
        rows.append(f'<div class="split" data-at="{_e(m.at)}"><span class="split-at">at {_e(m.at)} '
                    f'({_e(fmt_time(m.t_s))})</span><span class="bar">{bar}</span>'
                    f'<span class="split-words">{_e(fmt_bytes(m.reserved))} reserved = {words}</span></div>')
    return "".join(rows) + '<a href="#reserve">Reserved memory</a>'


def _groups_html(peak: Anatomy) -> str:
    items = [f"<li><b>{_e(fmt_bytes(r.bytes))}</b> in {r.count} block{'s' if r.count != 1 else ''}: "
             f"{_e(r.category)}, {_e(r.reason)}, allocated at <code>{_e(r.site)}</code> ({_e(r.phase)})</li>"
             for r in peak.rows[:TOP_GROUPS]]
    return f'<ol class="summary-groups">{"".join(items)}</ol>' if items else ""


def _markers_html(groups: Sequence[Sequence[tuple[str, Anatomy]]]) -> str:
    items = []
    for group in groups:
        names = ", ".join(f"<b>{_e(label)}</b> ({_e(fmt_time(an.t_s))})" for label, an in group)
        an = group[0][1]
        items.append(f'<li data-markers="{len(group)}">{names}: {_e(fmt_bytes(an.allocated))} allocated, '
                     f"{_e(fmt_bytes(an.reserved))} reserved</li>")
    return f'<ul class="summary-markers">{"".join(items)}</ul><a href="#markers">At each marker</a>' if items else ""


def _change_html(a: Analysis) -> str:
    """The replays' sentence on the one change that would have saved the most (or that none would have)."""
    said = [s for s in a.reserve().sentences if s.startswith(("The one change", "No other policy"))]
    return f'{_e(said[0])} <a href="#reserve_replays">Every policy</a>' if said else ""


def _oom_html(a: Analysis) -> str:
    ooms = a.ooms()
    if not ooms:
        return ""
    o = ooms[0]
    more = f" ({len(ooms)} in all; the first)" if len(ooms) > 1 else ""
    advice = f"<br>First advice: {_e(o.advice[0].text)}" if o.advice else ""
    return (f"{_e(fmt_bytes(o.requested))} asked at {_e(fmt_time(o.t_s))}{_e(more)}: verdict "
            f'<b class="verdict">{_e(o.verdict)}</b>.{advice} <a href="#ooms">Out of memory</a>')


def summary_html(a: Analysis, peak: Anatomy, markers: Sequence[Sequence[tuple[str, Anatomy]]]) -> str:
    """The summary section: `peak` is the peak's anatomy, `markers` the markers' (label, anatomy) pairs as html.py
    groups them (markers with the same table in one group)."""
    if not len(a.table):
        return ""
    facts = [("peak", "Peak", _peak_line(a)), ("reserved", "Reserved", _split_bars(a)),
             ("groups", "Live at the peak", _groups_html(peak)), ("markers", "Markers", _markers_html(markers)),
             ("change", "Would save the most", _change_html(a)), ("oom", "Out of memory", _oom_html(a))]
    rows = "".join(f'<dt>{_e(name)}</dt><dd class="summary-{key}">{value}</dd>' for key, name, value in facts if value)
    return f'<section id="summary" class="summary"><h2>Summary</h2><dl class="summary-facts">{rows}</dl></section>'
