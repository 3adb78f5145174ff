"""Replays of the model's trace at a multiple of the batch, under every policy: the peaks, whether they fit a
capacity, and the largest multiple that does.

Every replay is replay.engine's `replay_once` (the library's policies on the simulated device, the GIL released,
so the policies run on threads side by side). A policy *fits* a capacity at multiple x when the trace at x runs
under it without running out of memory -- as `torchalloc replay` counts it: below its unconstrained peak a policy
may still fit by releasing its cache and retrying, as it does on a GPU. The largest multiple that fits is found by
bisection over a grid (1/B steps when the recorded batch B is known: whole batches; else 0.05x steps), after
doubling from 1x until a multiple does not fit (at most MAX_MULTIPLE); it assumes that a multiple that fits makes
every smaller one fit. The report's line searches down from the ceiling of live bytes instead (ceiling.py: nothing
fits above it; the default fits at or just below it): a replay or two, the bisection's answer where that assumption
holds.

A replay with no capacity is made once per model and multiple (Model.peaks): the report's plot and its line share
theirs, and one that peaked within a capacity says that the multiple fits without a replay under it.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..log.trace import Trace
from ..replay.engine import DEFAULT_POLICIES, INSTALL_DEFAULT, replay_once
from .ceiling import LiveBytes, bisect_between, largest_where
from .model import Model, TooLarge

MAX_MULTIPLE = 1024.0  # the search's ceiling: a multiple that fits beyond it is said as "at least"
DEFAULT_STEP = 0.05  # the search's grid without a recorded batch


@dataclasses.dataclass
class PolicyPlan:
    """One policy at the asked multiple, and the largest multiple it fits at."""

    policy: str
    peak_allocated: int
    peak_reserved: int
    fits: bool | None  # None: no capacity to fit
    largest: float | None  # the largest multiple of the grid that fits; None: not even the smallest step
    at_least: bool  # it fits at MAX_MULTIPLE: `largest` is a floor
    high_peak_allocated: int | None  # with the bytes not attributed grown with the batch (the upper bound;
    high_peak_reserved: int | None  # None: not replayed, as for the report's line)
    too_large: bool = False  # a size at the asked multiple is past any device
    searched: bool = True  # the largest multiple was searched for (not under --no-search, nor without a capacity)

    @property
    def is_default(self) -> bool:
        return self.policy == INSTALL_DEFAULT


class Progress:
    """A line on stderr (rewritten in place) saying what the plan is doing, when stderr is a terminal."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._lock = threading.Lock()
        self._what, self._done, self._total = "", 0, 0

    def stage(self, what: str, total: int = 0) -> None:
        with self._lock:
            self._what, self._done, self._total = what, 0, total
            self._show()

    def add(self, n: int) -> None:
        with self._lock:
            self._total += n
            self._show()

    def tick(self) -> None:
        with self._lock:
            self._done += 1
            self._show()

    def _show(self) -> None:
        if self.enabled:
            count = f" {self._done}/{self._total} replays" if self._total else ""
            sys.stderr.write(f"\r\033[Ktorchalloc plan: {self._what}{count}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def fits(model: Model, x: float, policy: str, capacity: int, high: bool = False) -> bool:
    """Whether the trace at multiple x runs under `capacity` with `policy`: without a replay when one with no
    capacity peaked within it (the capacity never reached, the replay is the same)."""
    known = None if high else model.peaks.get(_key(policy, x))
    if known is not None and known["peak_reserved"] <= capacity:
        return True
    try:
        events = model.events_at(x, high)
    except TooLarge:
        return False
    result, _ = replay_once(events, policy, capacity)
    return not result["oom"]


def unconstrained(model: Model, x: float, policy: str, events: np.ndarray | Trace | None = None) -> dict[str, Any]:
    """The replay of the trace at multiple x under `policy` with no capacity (`events`: that trace, when made
    already), made once per model (Model.peaks); TooLarge past what replay takes."""
    key = _key(policy, x)
    got = model.peaks.get(key)
    if got is None:
        got, _ = replay_once(model.events_at(x) if events is None else events, policy, 0)
        model.peaks[key] = got
    return got


def _key(policy: str, x: float) -> tuple[str, float]:
    return policy, round(x, 9)  # n * step and the multiple asked name the same point


def largest_multiple(model: Model, policy: str, capacity: int, step: float, *, high: bool = False,
                     on_probe: Callable[[], None] | None = None, ceiling: int | None = None
                     ) -> tuple[float | None, bool]:
    """(the largest multiple of `step` that fits, whether it fits even at MAX_MULTIPLE) -- module docstring.
    `ceiling`: no multiple above ceiling * step fits (ceiling.LiveBytes): search down from it instead
    (ceiling.largest_where: the same answer, in a replay or two when the policy fits at or near it)."""
    def ok(n: int) -> bool:
        if on_probe is not None:
            on_probe()
        return fits(model, n * step, policy, capacity, high)

    top = int(MAX_MULTIPLE / step)
    if ceiling is not None:
        n = largest_where(ok, ceiling, min(ceiling, top)) if ceiling > 0 else 0
        return (n * step if n else None), n == top
    one = max(1, round(1 / step))
    if ok(one):
        lo, hi = one, 2 * one
        while hi <= top and ok(hi):
            lo, hi = hi, 2 * hi
        if hi > top:
            if ok(top):
                return top * step, True
            hi = top
    else:
        lo, hi = 0, one
    lo = bisect_between(ok, lo, hi)
    return (lo * step if lo else None), False


def search_probes(step: float) -> int:
    """About how many replays one policy's search takes (for the progress line; the search corrects it): doubling
    up to 8x, then bisecting a stretch of 4x."""
    return 4 + math.ceil(math.log2(max(2.0, 4 / step)))


def plan_policy(model: Model, x: float, policy: str, capacity: int | None, step: float, search: bool,
                progress: Progress | None = None, *, upper: bool = True, ceiling: int | None = None) -> PolicyPlan:
    """One policy: its peaks at x (and, with `upper`, with what is not attributed grown), whether x fits, the
    largest that does (searched down from `ceiling` when given: largest_multiple)."""
    def tick() -> None:
        if progress is not None:
            progress.tick()

    point: dict[str, Any] | None = None
    upper_point: dict[str, Any] | None = None
    try:
        point = unconstrained(model, x, policy)
        tick()
        upper_point = point if upper else None
        if upper and model.unattributed.any():
            upper_point, _ = replay_once(model.events_at(x, high=True), policy, 0)
            tick()
    except TooLarge:  # x itself is past any device; a smaller multiple may still fit: the search says which
        point = upper_point = None
    fit: bool | None = None
    largest: float | None = None
    at_least = False
    if capacity:
        fit = point is not None and (point["peak_reserved"] <= capacity or fits(model, x, policy, capacity))
        if search:
            probes = [0]

            def probe() -> None:
                probes[0] += 1
                tick()

            largest, at_least = largest_multiple(model, policy, capacity, step, on_probe=probe, ceiling=ceiling)
            if progress is not None:
                progress.add(probes[0] - search_probes(step))  # what the estimate missed
    if point is None:
        return PolicyPlan(policy, 0, 0, fit, largest, at_least, 0, 0, too_large=True,
                          searched=bool(capacity and search))
    return PolicyPlan(policy, point["peak_allocated"], point["peak_reserved"], fit, largest, at_least,
                      None if upper_point is None else upper_point["peak_allocated"],
                      None if upper_point is None else upper_point["peak_reserved"],
                      searched=bool(capacity and search))


def plan_policies(model: Model, x: float, capacity: int | None, *, policies: Sequence[str] = DEFAULT_POLICIES,
                  step: float = DEFAULT_STEP, search: bool = True, progress: Progress | None = None,
                  threads: int | None = None, brief: bool = False, ceiling: int | None = None) -> list[PolicyPlan]:
    """Every policy's PolicyPlan, the policies on threads side by side. `brief` (the report's line): no upper
    bound replayed, and each search goes down from the ceiling of live bytes (ceiling.py; `ceiling`: counted
    already)."""
    if not (brief and capacity and search):
        ceiling = None
    elif ceiling is None:
        ceiling = LiveBytes(model).ceiling(capacity, step, int(MAX_MULTIPLE / step))
    if progress is not None:
        per = 1 + int(not brief and model.unattributed.any()) + (search_probes(step) if capacity and search else 0)
        said = f"{len(policies)} policies" if len(policies) != 1 else "1 policy"
        progress.stage(f"replaying {x:g}x under {said}", per * len(policies))
    workers = threads or min(len(policies), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(plan_policy, model, x, p, capacity, step, search, progress, upper=not brief,
                               ceiling=ceiling) for p in policies]
        return [f.result() for f in futures]


def curve(model: Model, xs: Sequence[float], policies: Sequence[str], threads: int | None = None,
          progress: Progress | None = None) -> dict[str, list[tuple[float, int, int] | None]]:
    """Each policy's (x, peak allocated, peak reserved) at each multiple of `xs` (None where a size is past any
    device): the report's plot. Each multiple's trace is made once, for every policy."""
    jobs = [(p, x) for x in xs for p in policies]
    if progress is not None:
        progress.stage("drawing the peaks against the batch", len(jobs))
    traces: dict[float, np.ndarray | Trace | None] = {}
    for x in xs:
        if all(_key(p, x) in model.peaks for p in policies):
            traces[x] = model.trace  # not replayed again: any trace stands for it
            continue
        try:
            traces[x] = model.events_at(x)
        except TooLarge:
            traces[x] = None

    def one(job: tuple[str, float]) -> tuple[float, int, int] | None:
        policy, x = job
        events = traces[x]
        if events is None:
            return None
        result = unconstrained(model, x, policy, events)
        if progress is not None:
            progress.tick()
        return (x, int(result["peak_allocated"]), int(result["peak_reserved"]))

    workers = threads or min(len(jobs), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        points = list(pool.map(one, jobs))
    out: dict[str, list[Any]] = {p: [] for p in policies}
    for (p, _), point in zip(jobs, points):
        out[p].append(point)
    return out


def best(plans: Sequence[PolicyPlan], cached: bool = False) -> PolicyPlan | None:
    """The policy that fits the largest multiple; ties go to the default, then to a policy that keeps a cache
    (exact asks the device for every request), then to the one reserving least at the asked multiple. `cached`:
    among the policies that keep a cache only."""
    fitting = [p for p in plans if p.largest is not None and not (cached and p.policy.startswith("exact"))]
    if not fitting:
        return None
    return max(fitting, key=lambda p: (p.at_least, p.largest, p.is_default, not p.policy.startswith("exact"),
                                       -p.peak_reserved))
