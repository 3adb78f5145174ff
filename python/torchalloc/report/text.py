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

The analysis itself is the torchalloc.analysis package (its docstring lists
the stages; torchalloc.analysis.classify's gives the rules behind every
reason). The command line is cli/report.py.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from ..analysis import Analysis, Anatomy, analyze
from ..units import fmt_bytes, fmt_seconds, fmt_time
from .text_table import text_table

__all__ = ["report", "render_text"]


def report(
    log: str | os.PathLike[str] | Any,
    *,
    device: int | None = None,
    at: Sequence[str | float] = (),
    top: int = 50,
) -> dict[str, Any]:
    """The report as plain data (what `torchalloc report --json` prints), for a log path or a decoded log."""
    a = analyze(log, device=device)
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


def render_text(a: Analysis, *, top: int = 15, at: Sequence[str | float] = ()) -> str:
    """The human report."""
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
    out.append(f"peak allocated {fmt_bytes(tl.peak_allocated)} at {fmt_time(tl.peak_t)}; peak reserved "
               f"{fmt_bytes(tl.peak_reserved)} at {fmt_time(tl.peak_reserved_t)}; {fmt_seconds(tl.duration_s)} in all")
    if len(tl.allocated):
        out.append(f"allocated |{_sparkline(tl.allocated.tolist())}| {fmt_bytes(tl.peak_allocated)}")
        out.append(f"reserved  |{_sparkline(tl.reserved.tolist())}| {fmt_bytes(tl.peak_reserved)}")
    if tl.markers:
        out.append("markers: " + ", ".join(f"{label!r} at {fmt_time(ts)}" for ts, label, _ in tl.markers))
    out.append("")
    if len(t):
        out.append("== Peak anatomy: what was live at the peak, by allocation site and phase")
        out += _anatomy_text(a.anatomy("peak"), top)
        out.append("")
    for x in at:
        out += _anatomy_text(a.anatomy(x), top)
        out.append("")
    out.append("== Lifetimes: per allocation site, why its blocks were freed when they were")
    rows = a.lifetimes()
    for r in rows[:top]:
        life = fmt_seconds(r.typical_lifetime_s) if r.typical_lifetime_s >= 0 else "until the end"
        out.append(f"{r.site}: {r.count} blocks, {fmt_bytes(r.bytes)}, {r.reason}, typical lifetime {life} "
                   f"[{r.category}; {', '.join(r.phases)}]")
        out.append(f"    {r.explanation}")
    if len(rows) > top:
        out.append(f"... {len(rows) - top} more (site, reason) groups, {fmt_bytes(sum(r.bytes for r in rows[top:]))}")
    out.append("")
    phases = a.phases()
    if phases:
        out.append("== Phases")
        prow = [p.cells() for p in phases]
        out += text_table(["phase", "occurrences", "allocated", "freed", "peak", "reserved +", "persistent", "handed on",
                       "transient"], prow, right=range(1, 9))
        out += [f"  {p.sentence}" for p in phases]
        out.append("")
    est = a.estimate()
    out.append("== The estimate, measured")
    erow = [(term, fmt_bytes(n)) for term, n in est.rows()]
    out += ["  " + line for line in text_table(["term (peak live bytes)", "bytes"], erow, right=(1,))]
    out.append(f"  {est.sentence}")
    ooms = a.ooms()
    if ooms:
        out.append("")
        out.append("== Out of memory")
        for o in ooms:
            device = (f"; device {fmt_bytes(o.device_total)}, {fmt_bytes(o.device_free)} free"
                      if o.device_total is not None else "")
            out.append(f"{fmt_time(o.t_s)} in {o.phase}, at {o.site}: asked for {fmt_bytes(o.requested)}; "
                       f"{fmt_bytes(o.allocated)} allocated, {fmt_bytes(o.reserved)} reserved{device}. "
                       f"Verdict: {o.verdict} (from {o.verdict_from})")
            out.append(f"    {o.explanation}")
            for blocker in o.blockers:
                age = fmt_seconds(blocker.age_s) if blocker.age_s >= 0 else "before the log"
                out.append(f"      {fmt_bytes(blocker.size):>10}  {blocker.site}  phase {blocker.phase}, age {age}")
            if o.advice:
                out.append("    Advice, each line checked by replaying the run up to the failure:")
                for a in o.advice:
                    out.append(f"      {a.number}. {a.text}")
                    out.append(f"         -> {a.check}")
    return "\n".join(out) + "\n"
