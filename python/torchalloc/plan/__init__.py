"""What fits: the peak allocated and reserved at another batch size, predicted from a run already logged.

    from torchalloc.plan import read_run, one_run, make_plan, render
    model = one_run(read_run("run.talog"))            # or fit_pair(read_run(a), read_run(b)): two batch sizes
    plan = make_plan(model, 2.0, capacity=80 << 30)   # every policy at 2x: peaks, fits, the largest that fits
    print(render(plan, 100))

The package, in the order the data flows:

- follow.py: `BlockKinds`, a follower of the analysis' second pass that
  keeps each block's category, site and phase, and where the markers and
  phases are; gather.py: the run's trace gathered in the same pass (the
  report's, which reads the log once);
- laws.py: how a size follows the batch -- which categories grow with it,
  and the law through two measured sizes (constant, affine, linear,
  linear + quadratic, quadratic, a power);
- steps.py: where the run's steps are, and how alike their peaks were;
- model.py: a `Run` (the analysis and the trace of one log, the same
  allocations in the same order), the `Model` (one ratio per allocation,
  from its category or measured against a second run), and the trace at
  any multiple of the batch: every event in order, every lifetime kept,
  only the sizes changed;
- ceiling.py: the bytes live at any multiple, counted without a replay,
  and the largest multiple where they fit a capacity: no policy fits above;
- predict.py: that trace replayed under every policy (replay.engine), on
  threads: the peaks, whether they fit a capacity, the largest multiple
  that fits (bisection; for the report's line, down from the ceiling);
- result.py: a `Plan`, its limits in words and its JSON; text.py: the
  table `torchalloc plan` prints and the line `torchalloc report` adds to
  its summary; brief.py: what the report shows of a plan (that line, and
  the page's plot of the peaks against the batch).

It reads the analysis, the log's trace and the replay through their public
names; the command line is cli/plan.py.
"""
from __future__ import annotations

from .brief import Brief, brief_of, report_follower
from .follow import BlockKinds, Kinds
from .model import Model, PlanError, Run, fit_pair, one_run, read_run, run_of
from .predict import PolicyPlan, Progress, curve
from .result import Limit, Plan, make_plan, recording_capacity, to_dict
from .text import fmt_capacity, render, summary_line

__all__ = ["Brief", "brief_of", "report_follower", "BlockKinds", "Kinds", "Model", "PlanError", "Run", "fit_pair", "one_run", "read_run", "run_of",
           "PolicyPlan", "Progress", "curve", "Limit", "Plan", "make_plan", "recording_capacity", "to_dict",
           "fmt_capacity", "render", "summary_line"]
