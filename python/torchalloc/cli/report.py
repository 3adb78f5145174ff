"""`torchalloc report LOG...`: the command line of the report (report/)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from ..analysis import analyze
from ..log.reader import LogFormatError
from ..plan import brief_of, report_follower
from ..printable import printable
from ..report.text import render_text
from .args import at_value, expand_logs, fail, output_problem, snapshot_pointer, with_negative_values

# what `torchalloc report` with no log reports: a short training run recorded on a GPU with stacks and markers
DEMO_TRACE = Path(__file__).resolve().parents[1] / "data" / "demo_trace.talog.xz"



def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchalloc report",
        description="Explain a torchalloc log: timeline, what was live at the peak, why each block was freed "
        "when it was, per-phase accounting, and the usual memory estimate measured.",
    )
    parser.add_argument("log", nargs="*", help="a torchalloc event log (TORCHALLOC_CONF=log:PATH; default: the bundled "
                        "demo trace, torchalloc/data/demo_trace.talog.xz); several (one per "
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
    args = parser.parse_args(with_negative_values(sys.argv[1:] if argv is None else argv, ["--at"]))

    try:
        at = [at_value(x) for x in args.at]  # before the log is read: a big one takes minutes
    except ValueError as e:
        fail(parser.prog, str(e))
    if not args.log:  # as `replay` replays its bundled trace: the demo recorded on a GPU (data/demo_trace.md)
        if not DEMO_TRACE.is_file():
            fail(parser.prog, f"no log given, and this installation has no bundled demo trace ({DEMO_TRACE} is "
                 "missing): give a log (TORCHALLOC_CONF=log:PATH), or report the bundled phases trace: "
                 f"torchalloc report {DEMO_TRACE.parent / 'phases_trace.talog.xz'}")
        args.log = [str(DEMO_TRACE)]
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
    follower = report_follower()  # the trace for the plan gathered as the log is analysed
    try:
        a = analyze(logs[0], device=args.device, max_points=args.points, progress=args.progress, at=at,
                    page=bool(args.html), followers=[follower])
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
    plan = brief_of(logs[0], a, follower, points=bool(args.html)) if args.json or args.html or not args.png else None
    if args.html:
        from ..report.html import write_html

        write_html(a, args.html, at=at, plan=plan)
        print(printable(f"wrote {args.html}"), file=sys.stderr)
    if args.png:
        from ..report.png import write_png

        try:
            write_png(a, args.png)
        except ImportError as e:
            fail(parser.prog, str(e), 1)
        print(printable(f"wrote {args.png}"), file=sys.stderr)
    if args.json:
        data = a.to_dict(top=max(args.top, 50))
        data["at"] = [a.anatomy(x, top=max(args.top, 50)).to_dict() for x in at]
        data["plan"] = plan.to_dict() if plan is not None else None
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif not (args.html or args.png):
        sys.stdout.write(printable(render_text(a, top=args.top, at=at, plan=plan), newlines=True))
    return 0


def _job_main(prog: str, logs: list[str], args: argparse.Namespace) -> int:
    """Several logs: one report of the job (analysis/job.py, report/job_text.py)."""
    from ..analysis.job import analyze_job
    from ..report.job_text import write_job

    try:
        job = analyze_job(logs, device=args.device, max_points=args.points,
                          reports=max(args.top, 50) if args.json else None)
    except (LogFormatError, ValueError) as e:
        fail(prog, str(e))
    if args.json or args.html:
        for note in job.notes + [f"rank {r.rank}: {n}" for r, d in zip(job.ranks, job.details) for n in d.notes]:
            print(printable(f"torchalloc report: note: {note}"), file=sys.stderr)
    write_job(job, text=not args.html, json_out=args.json, html=args.html, top=args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
