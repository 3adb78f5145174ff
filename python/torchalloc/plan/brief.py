"""What `torchalloc report` shows of a plan: one line of its summary, and on its page a plot of the predicted peaks
against the batch, per policy, with the capacity and the recorded run.

    follower = report_follower()
    a = analyze(path, followers=[follower])
    b = brief_of(path, a, follower, points=True)     # b.line, b.to_dict(); b.points for the plot

The report predicts at 2x the recorded batch under the default, and
searches the largest multiple that fits the recording GPU's memory when
the log says it (its device record, or an out-of-memory record), else replay's default capacity,
said as assumed. It costs the report little: the trace is gathered in the
analysis' own pass (report_follower: the log is read once), the line
replays the default at 2x and searches from the ceiling of live bytes
(ceiling.py: a replay or two), and the plot replays every policy at
PLOT_POINTS multiples up to a quarter past the largest that fits, its
points at 1x being the reserve section's replays of the run (the page's
table of policies) and the default's at 2x the line's. A log the plan
cannot predict from gets a line that says why; a log too long for the
report to replay again and again (REPORT_EVENTS events) gets a line
pointing to `torchalloc plan`, which searches every policy in full.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from .. import _lib
from ..analysis import Analysis
from ..replay.engine import DEFAULT_CAPACITY, DEFAULT_POLICIES, INSTALL_DEFAULT
from .follow import BlockKinds
from .ceiling import LiveBytes
from .model import Model, PlanError, one_run, run_of
from .predict import DEFAULT_STEP, MAX_MULTIPLE, curve
from .result import Plan, fmt_multiple, make_plan, recording_capacity
from .text import summary_line

MULTIPLE = 2.0  # what the report predicts
REPORT_EVENTS = 2_000_000  # past this many events the report leaves the plan to `torchalloc plan`
PLOT_FROM = 4.0  # the plot reaches at least this multiple
PLOT_TO = 160.0  # and at most this one


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


def report_follower() -> BlockKinds:
    """The follower the report hands its analysis: plan's, gathering the trace of a log up to REPORT_EVENTS."""
    return BlockKinds(events=REPORT_EVENTS)


def brief_of(source: str | os.PathLike[str] | bytes, a: Analysis, follower: BlockKinds, *,
             points: bool = False) -> Brief:
    """The report's plan of the log `source` (its path or its bytes), analysed as `a` with `follower` (module
    docstring; a follower that gathered no trace reads `source` again); `points`: every policy's peaks at a few
    multiples too, for the page's plot."""
    x = fmt_multiple(MULTIPLE)
    if len(a.table) > REPORT_EVENTS:
        return Brief(f"Batch {x}: not predicted in the report of a log of {len(a.table):,} events (torchalloc "
                     "plan LOG predicts it)", None, False)
    try:
        model = one_run(run_of(source, a, follower))
        capacity, _ = recording_capacity(model)
        assumed = capacity is None
        capacity = capacity or DEFAULT_CAPACITY
        step = DEFAULT_STEP
        ceiling = LiveBytes(model).ceiling(capacity, step, int(MAX_MULTIPLE / step))
        far = max(PLOT_FROM, min(PLOT_TO, ceiling * step))
        drawn = curve(model, [far], DEFAULT_POLICIES) if points else None  # before the line: its search reuses them
        plan = make_plan(model, MULTIPLE, capacity, policies=[INSTALL_DEFAULT], brief=True, ceiling=ceiling)
        shown = _plot(a, model, plan, far, drawn) if drawn is not None else None
    except PlanError as e:
        return Brief(f"Batch {x}: not predicted ({str(e).removeprefix(f'{a.table.path}: ')})", None, False)
    except _lib.LibraryError as e:
        return Brief(f"Batch {x}: not predicted (the replay needs the library: {e})", None, False)
    return Brief(summary_line(plan, assumed), plan, assumed, shown)


def _plot(a: Analysis, model: Model, plan: Plan, far: float, drawn: dict[str, list[tuple[float, int, int] | None]]
          ) -> dict[str, list[tuple[float, int, int] | None]]:
    """Every policy's peaks at 1x (the reserve section's replays, else replayed) and at `far` (`drawn`), and the
    default's at 2x (the line's), in the order of the multiples."""
    known: dict[str, dict[float, tuple[float, int, int] | None]] = {p: {} for p in DEFAULT_POLICIES}
    for row in a.reserve().replays:
        if row.policy in known and not row.oom:
            known[row.policy][1.0] = (1.0, row.peak_allocated, row.peak_reserved)
    not_at_1 = [p for p, got in known.items() if 1.0 not in got]
    if not_at_1:
        for p, line in curve(model, [1.0], not_at_1).items():
            known[p][1.0] = line[0]
    d = plan.default
    if d is not None:
        known.setdefault(d.policy, {})[MULTIPLE] = (None if d.too_large else
                                                    (MULTIPLE, d.peak_allocated, d.peak_reserved))
    for p, line in drawn.items():
        known[p][far] = line[0]
    return {p: [got[x] for x in sorted(got)] for p, got in known.items()}
