"""What `torchalloc report` shows of a plan: one line of its summary, and on its page a plot of the predicted peaks
against the batch, per policy, with the capacity and the recorded run.

    follower = BlockKinds()
    a = analyze(path, followers=[follower])
    b = brief_of(path, a, follower, points=True)     # b.line, b.to_dict(); b.points for the plot

The report predicts at 2x the recorded batch under the default, and
searches the largest multiple that fits the recording GPU's memory when
the log says it (an out-of-memory record), else replay's default capacity,
said as assumed. The plot adds every policy at a few multiples. A log the
plan cannot predict from gets a line that says why; a log too long for
the report to replay again and again (REPORT_EVENTS events) gets a line
pointing to `torchalloc plan`.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from .. import _lib
from ..analysis import Analysis
from ..replay.engine import DEFAULT_CAPACITY, DEFAULT_POLICIES, INSTALL_DEFAULT
from .follow import BlockKinds
from .model import PlanError, one_run, run_of
from .predict import curve
from .result import Plan, curve_points, fmt_multiple, make_plan, recording_capacity
from .text import summary_line

MULTIPLE = 2.0  # what the report predicts
REPORT_EVENTS = 2_000_000  # past this many events the report leaves the plan to `torchalloc plan`


@dataclasses.dataclass
class Brief:
    """The report's part of a plan (module docstring)."""

    line: str  # the summary's line
    plan: Plan | None  # None: not predicted (`line` says why)
    assumed: bool  # the capacity is replay's default, not the log's
    points: dict[str, list[tuple[float, int, int] | None]] | None = None  # policy -> (x, allocated, reserved)

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        d = p.default if p is not None else None
        return {
            "line": self.line,
            "multiple": MULTIPLE,
            "predicted": p is not None,
            "capacity": p.capacity if p is not None else None,
            "capacity_assumed": self.assumed,
            "default": None if d is None else {"policy": d.policy, "peak_allocated": d.peak_allocated,
                                               "peak_reserved": d.peak_reserved, "fits": d.fits,
                                               "largest_multiple": d.largest, "at_least": d.at_least},
            "recorded": None if p is None else {"peak_allocated": p.recorded_allocated,
                                                "peak_reserved": p.recorded_reserved},
            "points": None if self.points is None else {
                k: [None if x is None else {"multiple": x[0], "peak_allocated": x[1], "peak_reserved": x[2]}
                    for x in v] for k, v in self.points.items()},
        }


def brief_of(source: str | os.PathLike[str] | bytes, a: Analysis, follower: BlockKinds, *,
             points: bool = False) -> Brief:
    """The report's plan of the log `source` (its path or its bytes), analysed as `a` with `follower` (module
    docstring); `points`: every policy's peaks at a few multiples too, for the page's plot."""
    x = fmt_multiple(MULTIPLE)
    if len(a.table) > REPORT_EVENTS:
        return Brief(f"Batch {x}: not predicted in the report of a log of {len(a.table):,} events (torchalloc "
                     "plan LOG predicts it)", None, False)
    try:
        model = one_run(run_of(source, a, follower))
        capacity, _ = recording_capacity(model)
        assumed = capacity is None
        plan = make_plan(model, MULTIPLE, capacity or DEFAULT_CAPACITY, policies=[INSTALL_DEFAULT])
        shown = None
        if points:
            d = plan.default
            shown = curve(model, curve_points(d.largest if d is not None else None), DEFAULT_POLICIES)
    except PlanError as e:
        return Brief(f"Batch {x}: not predicted ({str(e).removeprefix(f'{a.table.path}: ')})", None, False)
    except _lib.LibraryError as e:
        return Brief(f"Batch {x}: not predicted (the replay needs the library: {e})", None, False)
    return Brief(summary_line(plan, assumed), plan, assumed, shown)
