"""`torchalloc plan LOG [LOG2]`: what fits at another batch size, predicted from a run already logged (plan/)."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Sequence

from .. import _lib
from .._lib import ReplayError
from ..log.reader import LogFormatError
from ..printable import printable
from ..replay.engine import DEFAULT_POLICIES
from ..text_fit import terminal_width
from ..units import parse_bytes
from .args import bundled_demo, expand_logs, fail, snapshot_pointer, with_negative_values

PROG = "torchalloc plan"
_MULTIPLE = re.compile(r"\s*(.+?)\s*x\s*", re.IGNORECASE)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Predict, from a run already logged, the peak allocated and reserved at another batch size "
        "under every policy (PyTorch's allocator among them), whether it fits a GPU, and the largest batch that "
        "does. Activations and temporaries grow with the batch; parameters, gradients and optimizer state do not. "
        "Two logs at two batch sizes (or sequence lengths) measure each allocation's law instead.")
    ap.add_argument("log", nargs="*", help="a torchalloc log (TORCHALLOC_CONF=log:PATH); two logs of the same "
                    "program at two batch sizes or sequence lengths to measure how each allocation grows (the "
                    "prediction is built on the first); default: the bundled demo trace")
    ap.add_argument("--batch", default="2x", metavar="2x|N",
                    help="the batch to predict: a multiple of the recorded one (2x, 3.5x), or a batch size with "
                    "--recorded (default: %(default)s)")
    ap.add_argument("--recorded", metavar="B[,B2]", help="the batch size (or sequence length) the log was recorded "
                    "at; with two logs, both (32,64); the largest batch that fits is then searched batch by batch")
    ap.add_argument("--capacity", metavar="SIZE", help="the GPU's memory, e.g. 80GiB (default: the recording GPU's, "
                    "which the log says; older logs only in an out-of-memory record)")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated (default: every policy)")
    ap.add_argument("--device", type=int, default=None, help="the device of the log to plan for (default: the busiest)")
    ap.add_argument("--no-search", action="store_true", help="skip the search for the largest batch that fits")
    ap.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    return ap


def number(text: str, what: str) -> float:
    """A positive finite number, or fail saying what was given."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        fail(PROG, f"{what} {text!r}: not a positive number (write --batch 2x for twice the recorded batch, or "
                   "--batch 96 --recorded 32)")
    return value


def multiple_of(batch: str, recorded: float | None) -> tuple[float, float | None]:
    """(the multiple of the recorded batch, the recorded batch when known) from --batch and --recorded."""
    m = _MULTIPLE.fullmatch(batch)
    if m:
        return number(m.group(1), "--batch"), recorded
    value = number(batch, "--batch")
    if recorded is None:
        fail(PROG, f"--batch {batch}: a batch size needs the one the log was recorded at (--recorded 32), or write "
                   f"a multiple ({batch}x)")
    return value / recorded, recorded


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(with_negative_values(sys.argv[1:] if argv is None else argv,
                                                         ["--batch", "--recorded", "--capacity"]))
    paths = args.log or bundled_demo(PROG)
    paths, problem = expand_logs(paths)
    problem = problem or next(filter(None, (snapshot_pointer(p, "plan") for p in paths)), None)
    if problem:
        fail(PROG, problem)
    if len(paths) > 2:
        fail(PROG, f"{len(paths)} logs: give one, or two of the same program at two batch sizes")
    recorded = [number(x, "--recorded") for x in args.recorded.split(",")] if args.recorded else []
    if len(recorded) > len(paths) or (len(paths) == 2 and len(recorded) == 1):
        fail(PROG, f"--recorded {args.recorded}: give one batch size per log ({len(paths)})")
    multiple, base = multiple_of(args.batch, recorded[0] if recorded else None)
    capacity = None
    if args.capacity is not None:
        try:
            capacity = parse_bytes(args.capacity)
        except ValueError as e:
            fail(PROG, f"--capacity: {e}")
        if capacity <= 0:
            fail(PROG, f"--capacity {args.capacity}: give the GPU's memory, more than 0")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        fail(PROG, "--policies is empty")

    from ..plan import PlanError, Progress, fit_pair, make_plan, one_run, read_run, recording_capacity, render, to_dict

    progress = Progress()
    try:
        progress.stage("reading " + os.path.basename(paths[0]))
        first = read_run(paths[0], device=args.device, progress=progress.enabled)
        if len(paths) == 2:
            progress.stage("reading " + os.path.basename(paths[1]))
            second = read_run(paths[1], device=args.device, progress=progress.enabled)
            model = fit_pair(first, second, recorded[1] / recorded[0] if len(recorded) == 2 else None)
        else:
            model = one_run(first)
        capacity_from = "--capacity"
        if capacity is None:
            capacity, capacity_from = recording_capacity(model)
            if capacity is None:
                progress.close()
                fail(PROG, f"{paths[0]} does not say how much memory its GPU had (logs older than format "
                           "version 3 say it only in an out-of-memory record): give the capacity to plan for, e.g. "
                           "--capacity 80GiB")
        plan = make_plan(model, multiple, capacity, capacity_from=capacity_from, recorded=base, policies=policies,
                         search=not args.no_search, progress=progress)
    except (PlanError, LogFormatError, ReplayError, _lib.LibraryError) as e:
        progress.close()
        fail(PROG, str(e))
    except ValueError as e:  # the analysis' refusals (no such device)
        progress.close()
        fail(PROG, str(e))
    progress.close()
    if args.json:
        print(json.dumps(to_dict(plan), indent=1))
    else:
        sys.stdout.write(printable(render(plan, terminal_width()), newlines=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
