"""`torchalloc replay [TRACE...]`: the command line of the replay (replay/)."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import Sequence

from .. import _lib
from .._lib import ReplayError
from ..log.trace import TraceError, load_trace
from ..replay.engine import (
    DEFAULT_CAPACITY_TEXT,
    DEFAULT_POLICIES,
    PLOT_POINTS,
    default_trace_path,
    format_table,
    plot_png,
    report_json,
    run,
)
from ..printable import printable
from ..text_fit import terminal_width
from ..units import fmt_bytes, parse_bytes
from .args import expand_logs, fail, output_problem, with_negative_values


def check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail("torchalloc replay", "--png needs matplotlib, which is not installed (pip install matplotlib); "
             "run without --png for the table", 1)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="torchalloc replay",
        description="Replay an allocation trace through torchalloc's policies on a simulated device (no GPU needed).",
    )
    ap.add_argument("trace", nargs="*", help="PyTorch memory snapshot (.pickle[.gz|.xz]) or torchalloc log; "
                    "several (one per rank) or a quoted pattern such as 'run.*.talog' for a job's ranks side by side; "
                    "default: the trace bundled with torchalloc")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated (default: %(default)s)")
    ap.add_argument("--capacity", default=DEFAULT_CAPACITY_TEXT, help="simulated device size, e.g. 40GiB, or 1.01x: "
                    "that many times the trace's peak allocated (its requests rounded to 512 B); 0 means "
                    "unlimited: no policy runs out of memory, and the smallest capacity that runs the trace is still "
                    "searched for (default: %(default)s)")
    ap.add_argument("--handle", metavar="SIZES", help="comma-separated handle sizes, such as 4MiB,8MiB,16MiB: each "
                    "policy with expandable segments (+expandable, +compact, +reclaim) is replayed once per size, "
                    "as TORCHALLOC_CONF's handle key sets it (a row POLICY,handle:SIZE)")
    ap.add_argument("--run", metavar="SIZES", help="comma-separated run sizes, such as 0,64MiB: each policy with "
                    "expandable segments is replayed once per size, as TORCHALLOC_CONF's run key sets it (warm-up "
                    "growth in handles of that size; a row POLICY,run:SIZE)")
    ap.add_argument("--roundup-power2-divisions", metavar="VALUE",
                    help="round requests as PyTorch's roundup_power2_divisions:VALUE does (4, or a list such as "
                    "[256:1,512:2,>:8]), as the traced program's settings had it: each policy is named POLICY@VALUE")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--png", metavar="FILE", help="plot reserved memory over the trace per policy (needs matplotlib)")
    ap.add_argument("--device", type=int, help="which device's trace in a multi-GPU snapshot (default: the busiest)")
    ap.add_argument("--no-search", action="store_true", help="skip the smallest-capacity search")
    ap.add_argument("--no-prelude", action="store_true",
                    help="do not reconstruct allocations made before a snapshot's history began")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar (default: on a terminal for traces of 1M+ events)")
    return ap


def with_sizes(prog: str, policies: list[str], key: str, sizes_text: str) -> list[str]:
    """Each policy with expandable segments once per size of `key` ("caching+reclaim,handle:4MiB", which the library
    reads as TORCHALLOC_CONF's syntax after the comma); the others as they are."""
    sizes = [size.strip() for size in sizes_text.split(",") if size.strip()]
    if not sizes:
        fail(prog, f"--{key} is empty: give sizes such as " + ("4MiB,8MiB,16MiB" if key == "handle" else "0,64MiB"))
    if not any("+" in p.split(",")[0] for p in policies):
        fail(prog, f"--{key} sizes the handles of expandable segments: give a policy with +expandable, +compact or "
                   "+reclaim (--policies caching+reclaim)")
    out: list[str] = []
    for policy in policies:
        out += [f"{policy},{key}:{size}" for size in sizes] if "+" in policy.split(",")[0] else [policy]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(with_negative_values(sys.argv[1:] if argv is None else argv, ["--capacity"]))
    prog = "torchalloc replay"
    if args.capacity.strip().startswith("-"):
        fail(prog, f"--capacity {args.capacity}: a device size cannot be negative (0 means unlimited)")
    relative = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*x\s*", args.capacity, re.IGNORECASE)
    if relative and float(relative.group(1)) < 1:
        fail(prog, f"--capacity {args.capacity.strip()}: under 1x the trace's peak allocated nothing fits")
    try:
        capacity = 0 if relative else parse_bytes(args.capacity)
    except ValueError as e:
        fail(prog, f"--capacity: {e}, or a multiple of the trace's peak allocated such as 1.01x; 0 means unlimited")
    decimal = re.fullmatch(r"\s*[\d.]+\s*([kmgt]b)\s*", args.capacity, re.IGNORECASE)
    if decimal:  # as TORCHALLOC_CONF reads it, but 40GB meant as 40GiB is 7% short: said, not guessed
        binary = decimal.group(1)[0].upper() + "iB"
        print(printable(f"{prog}: note: --capacity {args.capacity.strip()} is decimal: {capacity:,} bytes "
                        f"({fmt_bytes(capacity, 2)}); write {args.capacity.strip()[:-2].strip()}{binary} for "
                        f"{parse_bytes(args.capacity.strip()[:-2] + binary):,}"), file=sys.stderr)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        fail(prog, "--policies is empty")
    if args.roundup_power2_divisions is not None:
        policies = [f"{p}@{args.roundup_power2_divisions.strip()}" for p in policies]
    if args.handle is not None:
        policies = with_sizes(prog, policies, "handle", args.handle)
    if args.run is not None:
        policies = with_sizes(prog, policies, "run", args.run)
    if os.environ.get("TORCHALLOC_CONF", "").strip() and not args.json:
        print(printable(f"{prog}: note: TORCHALLOC_CONF is not read here: each policy runs on a simulated device of "
                        "its own; --handle replays other handle sizes"), file=sys.stderr)
    if len(args.trace) > 1 or (args.trace and any(c in args.trace[0] for c in "*?[")):
        paths, problem = expand_logs(args.trace)
        if problem or (len(paths) > 1 and args.png):
            fail(prog, problem or "--png plots one trace; give one rank's")
        args.trace = paths
    if args.png:
        bad_output = output_problem(args.png)
        if bad_output:
            fail(prog, f"--png {bad_output}")
        check_matplotlib()
    if len(args.trace) > 1:
        if relative:
            fail(prog, f"--capacity {args.capacity.strip()}: a multiple of the peak is for one trace; give a size for "
                       "a job's ranks")
        return _ranks_main(prog, args.trace, policies, capacity, args)
    try:
        path = Path(args.trace[0]) if args.trace else default_trace_path()
        trace = load_trace(path, device=args.device, prelude=not args.no_prelude)
        if not args.json and not trace.has_allocs():  # (--json still gives its zeros)
            print(printable(f"{prog}: nothing to replay: {path} holds no allocation"), file=sys.stderr)
            return 0
        if relative:
            capacity = max(1, int(Fraction(relative.group(1)) * trace.peak_rounded))
            print(printable(f"{prog}: --capacity {args.capacity.strip()}: {fmt_bytes(capacity, 2)} ({capacity:,} bytes, "
                            f"{relative.group(1)} x the trace's peak allocated, {fmt_bytes(trace.peak_rounded, 2)})"),
                  file=sys.stderr)
        report = run(
            trace,
            policies,
            capacity,
            search=not args.no_search,
            series_len=min(PLOT_POINTS, max(len(trace), 1)) if args.png else 0,
            progress=args.progress,
        )
    except (TraceError, ReplayError, _lib.LibraryError) as e:
        fail(prog, str(e))
    if args.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        print(printable(format_table(report, terminal_width()), newlines=True))
    if args.png:
        plot_png(report, args.png)
        if not args.json:
            print(printable(f"plot: {args.png}"))
    return 0


def _ranks_main(prog: str, paths: list[str], policies: list[str], capacity: int, args: argparse.Namespace) -> int:
    """Several traces: a job's ranks (replay/ranks.py)."""
    from ..replay.ranks import format_ranks, ranks_json, run_ranks

    try:
        ranks, notes = run_ranks(paths, policies, capacity, search=not args.no_search, device=args.device,
                                 prelude=not args.no_prelude, progress=args.progress)
    except (TraceError, ReplayError, _lib.LibraryError) as e:
        fail(prog, str(e))
    print(json.dumps(ranks_json(ranks, notes), indent=2) if args.json
          else printable(format_ranks(ranks, notes, terminal_width()), newlines=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
