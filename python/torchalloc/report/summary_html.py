"""The answer, at the top of the HTML page: the report's summary (analysis/summary.py, the one the text and
JSON reports print first), as a few lines that link to the sections with the rest.

- the peak: allocated and reserved at their peaks, when, the phase running
  then ("at least" when the log began mid-run);
- reserved memory at the peak allocated split into allocated, fragmentation
  (free bytes in segments that hold live blocks) and cache (wholly free
  segments), and the rarer terms when there are any, as a bar;
- the largest groups of blocks live at the peak (those with a source line
  first), with their reason and the line that allocated them;
- the sites whose live bytes at the step markers gained a low point never
  given back (a leak), or that the step markers were too few for the rule,
  the largest growth per step first;
- one line per kind of marker ("step 1" ... "step 6" are one kind): what was
  live at it, what the run freed and kept from it to the next marker;
- the one change that would have reserved the most less;
- the last OOM's verdict and its first line of advice;
- what fits at twice the batch (plan/brief.py), linking to its plot.
"""
from __future__ import annotations

import html
from typing import Any

from ..analysis import Analysis
from ..analysis.summary import Change, MarkerLine, OomLine, Peak, ReserveSplit, Summary
from ..units import fmt_bytes, fmt_time, fmt_times

__all__ = ["summary_html"]

# The reserve split's parts: (ReserveSplit field, its name on the page, its CSS class). The last two (free
# granules of expandable segments, free bytes in segments from before the log) are named only when not zero.
SPLIT = (("allocated", "allocated", "split-allocated"), ("fragmentation", "fragmentation", "split-fragmentation"),
         ("cache", "cache", "split-cache"), ("mapped_free", "mapped free (expandable)", "split-mapped"),
         ("before_log", "before the log", "split-before"))
ALWAYS = 3  # the first three parts are named even when zero


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _link(anchor: str, text: str) -> str:
    return f' <a href="#{anchor}">{_e(text)}</a>'


def _in(phase: str) -> str:
    return f" in {_e(phase)}" if phase else ""


def _peak_html(p: Peak) -> str:
    when, r_when = fmt_times([p.allocated_t_s, p.reserved_t_s])
    at_least = " (at least: the log began mid-run)" if p.at_least else ""
    return (f"<b>{_e(fmt_bytes(p.allocated))}</b> allocated{at_least} at {_e(when)}{_in(p.allocated_phase)}; "
            f"<b>{_e(fmt_bytes(p.reserved))}</b> reserved at {_e(r_when)}{_in(p.reserved_phase)}."
            + _link("peak-anatomy", "Peak anatomy"))


def _split_html(r: ReserveSplit) -> str:
    """The split as a bar, widths to scale, and in words."""
    parts = [(getattr(r, key), name, cls) for k, (key, name, cls) in enumerate(SPLIT) if k < ALWAYS or getattr(r, key)]
    scale = r.reserved or 1
    bar = "".join(f'<span class="{cls}" style="width:{100 * v / scale:.2f}%" title="{_e(name)} {_e(fmt_bytes(v))}">'
                  "</span>" for v, name, cls in parts if v > 0)
    words = " + ".join(f'<span class="key {cls}"></span>{_e(fmt_bytes(v))} {_e(name)}' for v, name, cls in parts)
    return (f'<div class="split" data-at="peak allocated"><span class="split-at">at the peak allocated</span>'
            f'<span class="bar">{bar}</span><span class="split-words">{_e(fmt_bytes(r.reserved))} reserved = '
            f"{words}</span></div>" + _link("reserve", "Reserved memory"))


def _live_html(s: Summary) -> str:
    items = [f"<li><b>{_e(fmt_bytes(x.bytes))}</b> in {x.count} block{'s' if x.count != 1 else ''}: "
             f"{_e(x.category)}, {_e(x.reason)}, allocated at <code>{_e(x.site)}</code> ({_e(x.phase)})</li>"
             for x in s.live]
    return f'<ol class="summary-groups">{"".join(items)}</ol>' if items else ""


def _leaks_html(s: Summary) -> str:
    short = s.leak_check.too_few()
    if short is not None:
        return _e(short) + _link("leaks", "Leaks")
    if not s.leaks:
        return ""
    items = "".join(f"<li>{_e(x.words())}</li>" for x in s.leaks)
    left = s.leak_count - len(s.leaks)
    more = f'<li class="more">{left} more growing site{"s" if left != 1 else ""}</li>' if left else ""
    return f'<ul class="summary-leaks">{items}{more}</ul>' + _link("leaks", "Leaks")


def _marker_html(m: MarkerLine, peak: int) -> str:
    kind = f" (1st of {m.kind_count} like it)" if m.kind_count > 1 else ""
    text = (f"<b>{_e(m.label)}</b>{_e(kind)} {_e(fmt_time(m.t_s))}: {_e(fmt_bytes(m.live))} live; "
            f"freed {_e(fmt_bytes(m.freed))}")
    if m.freed_top is not None:
        text += f", most {_e(m.freed_top.short())}"
    if m.kept_top is not None and m.kept_top.bytes * 100 >= peak:  # 1% of the peak: worth a word
        text += f"; kept {_e(fmt_bytes(m.kept))}, most {_e(m.kept_top.short())}"
    return f"<li>{text}</li>"


def _markers_html(s: Summary) -> str:
    if not s.markers:
        return ""
    left = s.marker_kinds - len(s.markers)
    more = f'<li class="more">{left} more kind{"s" if left != 1 else ""} of markers</li>' if left else ""
    return ('Live at each; what the run freed and kept from it to the next marker:<ul class="summary-markers">'
            + "".join(_marker_html(m, s.peak.allocated) for m in s.markers) + more + "</ul>"
            + _link("markers", "At each marker") + _link("stretches", "Between markers"))


def _change_html(c: Change) -> str:
    return c.words(lambda t: f"<code>{_e(t)}</code>", lambda t: f"<b>{_e(t)}</b>") + _link("reserve_replays",
                                                                                          "Every policy")


def _oom_html(o: OomLine) -> str:
    which = f"the last of {o.count}, " if o.count > 1 else ""
    advice = f"<br>First advice: {_e(o.advice)} ({_e(o.advice_check)})" if o.advice else ""
    return (f"{_e(which)}at {_e(fmt_time(o.t_s))} asking {_e(fmt_bytes(o.requested))}: verdict "
            f'<b class="verdict">{_e(o.verdict)}</b>.{advice}' + _link("ooms", "Out of memory"))


def summary_html(a: Analysis, plan_line: str = "") -> str:
    """The summary section, from `a.summary()`, with `plan_line` (plan/brief.py: what fits at another batch size)
    last; nothing for a log without allocations."""
    if not len(a.table):
        return ""
    s = a.summary()
    facts = [("peak", "Peak", _peak_html(s.peak)),
             ("reserved", "Reserved", _split_html(s.reserve) if s.reserve is not None else ""),
             ("groups", "Live at the peak", _live_html(s)), ("leaks", "Leaks", _leaks_html(s)),
             ("markers", "Markers", _markers_html(s)),
             ("change", "Change to try first", _change_html(s.change) if s.change is not None else ""),
             ("oom", "Out of memory", _oom_html(s.oom) if s.oom is not None else ""),
             ("plan", "Batch", _e(plan_line) + _link("plan", "What fits") if plan_line else "")]
    rows = "".join(f'<dt>{_e(name)}</dt><dd class="summary-{key}">{value}</dd>' for key, name, value in facts if value)
    return f'<section id="summary" class="summary"><h2>Summary</h2><dl class="summary-facts">{rows}</dl></section>'
