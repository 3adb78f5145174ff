"""`torchalloc report LOG`: why memory stayed alive, in text, JSON, HTML or PNG.

    torchalloc report run.talog                  # text: timeline, peak anatomy, lifetimes, phases, estimate
    torchalloc report run.talog --json           # the same as one JSON object
    torchalloc report run.talog --html run.html  # self-contained page with the timeline drawn
    torchalloc report run.talog --png run.png    # the timeline as a picture (needs matplotlib)
    torchalloc report run.talog --at "after forward" --at 1.5
    torchalloc report run.0.talog run.1.talog    # a job: one log per rank, compared (report_job.py)
    torchalloc report 'run.*.talog' --html job.html

From Python the same data:

    from torchalloc.report import report
    data = report("run.talog")                   # dict, as --json prints it
    print(render_text(analyze("run.talog")))     # the text

The analysis itself is the torchalloc.analysis package (its docstring lists
the stages; torchalloc.analysis.classify's gives the rules behind every
reason).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from .analysis import Analysis, Anatomy, analyze
from .printable import printable
from .units import fmt_bytes, fmt_seconds, fmt_time

__all__ = ["report", "render_text", "main"]


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


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> list[str]:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells]


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
    out += ["  " + line for line in _table(["bytes", "blocks", "phase", "category", "reason", "allocated at"], rows, right=(0, 1))]
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
    at_least = " (at least: the log began mid-run)" if bool((a.blocks.alloc_i < 0).any()) else ""
    out.append(f"peak allocated {fmt_bytes(tl.peak_allocated)}{at_least} at {fmt_time(tl.peak_t)}; peak reserved "
               f"{fmt_bytes(tl.peak_reserved)} at {fmt_time(tl.peak_reserved_t)}; {fmt_seconds(tl.duration_s)} in all")
    if len(tl.allocated):
        out.append(f"allocated |{_sparkline(tl.allocated.tolist())}| {fmt_bytes(tl.peak_allocated)}")
        out.append(f"reserved  |{_sparkline(tl.reserved.tolist())}| {fmt_bytes(tl.peak_reserved)}")
    if tl.markers:
        out.append("markers: " + ", ".join(f"'{label}' at {fmt_time(ts)}" for ts, label, _ in tl.markers))
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
        out += _table(["phase", "occurrences", "allocated", "freed", "peak", "reserved +", "persistent", "handed on",
                       "transient"], prow, right=range(1, 9))
        out += [f"  {p.sentence}" for p in phases]
        out.append("")
    est = a.estimate()
    out.append("== The estimate, measured")
    erow = [(term, fmt_bytes(n)) for term, n in est.rows()]
    out += ["  " + line for line in _table(["term (peak live bytes)", "bytes"], erow, right=(1,))]
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
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchalloc report",
        description="Explain a torchalloc log: timeline, what was live at the peak, why each block was freed "
        "when it was, per-phase accounting, and the usual memory estimate measured.",
    )
    parser.add_argument("log", nargs="+", help="a torchalloc event log (TORCHALLOC_CONF=log:PATH); several (one per "
                        "rank, log:run.%%r.talog), or a quoted pattern such as 'run.*.talog', for one report of the "
                        "whole job")
    parser.add_argument("--device", type=int, default=None, help="device to report (default: the busiest)")
    parser.add_argument("--at", action="append", default=[], metavar="MARKER|SECONDS",
                        help="also show what was live at this marker or time (repeatable)")
    parser.add_argument("--top", type=int, default=15, help="rows per table in the text (default 15)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    parser.add_argument("--png", metavar="FILE", help="write the timeline as PNG (needs matplotlib)")
    parser.add_argument("--points", type=int, default=1500, help="timeline samples kept for drawing (default 1500)")
    parser.add_argument("--progress", action="store_true", help="show progress on big logs (tqdm)")
    from .log import LogFormatError
    from .tool_args import at_value, expand_logs, fail, output_problem, snapshot_pointer, with_negative_values

    args = parser.parse_args(with_negative_values(sys.argv[1:] if argv is None else argv, ["--at"]))

    try:
        at = [at_value(x) for x in args.at]  # before the log is read: a big one takes minutes
    except ValueError as e:
        fail(parser.prog, str(e))
    logs, problem = expand_logs(args.log)
    problem = problem or next(filter(None, (snapshot_pointer(p, "report") for p in logs)), None)
    for option, path in (("--html", args.html), ("--png", args.png)):
        bad_output = output_problem(path) if path is not None else None
        if bad_output and not problem:
            problem = f"{option} {bad_output}"
    if args.top < 1 or args.points < 2:
        problem = problem or ("--top must be at least 1" if args.top < 1 else "--points must be at least 2")
    if len(logs) > 1 and not problem:
        problem = ("--at, --png and --progress report one log; give one rank's log for them"
                   if args.at or args.png or args.progress else None)
    if problem:
        fail(parser.prog, problem)
    if len(logs) > 1:
        return _job_main(parser.prog, logs, args)
    try:
        a = analyze(logs[0], device=args.device, max_points=args.points, progress=args.progress)
    except (LogFormatError, ValueError) as e:
        fail(parser.prog, str(e))
    try:
        for x in at:
            a.index_at(x)
    except ValueError as e:
        fail(parser.prog, str(e))
    if args.json or args.html or args.png:
        # The text report shows its notes at the top; the other outputs carry
        # them too, but a damaged log must be said where the user looks.
        for note in a.notes:
            print(printable(f"torchalloc report: note: {note}"), file=sys.stderr)
    if args.html:
        from .report_html import write_html

        write_html(a, args.html, at=at)
        print(printable(f"wrote {args.html}"), file=sys.stderr)
    if args.png:
        from .report_png import write_png

        try:
            write_png(a, args.png)
        except ImportError as e:
            fail(parser.prog, str(e), 1)
        print(printable(f"wrote {args.png}"), file=sys.stderr)
    if args.json:
        data = a.to_dict(top=max(args.top, 50))
        data["at"] = [a.anatomy(x, top=max(args.top, 50)).to_dict() for x in at]
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif not (args.html or args.png):
        sys.stdout.write(printable(render_text(a, top=args.top, at=at), newlines=True))
    return 0


def _job_main(prog: str, logs: list[str], args: argparse.Namespace) -> int:
    """Several logs: one report of the job (torchalloc.job, report_job)."""
    from .job import analyze_job
    from .log import LogFormatError
    from .report_job import write_job
    from .tool_args import fail

    try:
        job = analyze_job(logs, device=args.device, max_points=args.points)
    except (LogFormatError, ValueError) as e:
        fail(prog, str(e))
    if args.json or args.html:
        for note in job.notes + [f"rank {r.rank}: {n}" for r, a in zip(job.ranks, job.analyses) for n in a.notes]:
            print(printable(f"torchalloc report: note: {note}"), file=sys.stderr)
    write_job(job, text=not args.html, json_out=args.json, html=args.html, top=args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
