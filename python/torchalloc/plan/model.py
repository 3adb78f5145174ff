"""The model `torchalloc plan` predicts with: one logged run's trace, each allocation's law, and the trace at any
multiple of the batch.

    run = read_run("run.talog")                  # the analysis (with each block's category) and the trace
    model = one_run(run)                         # or fit_pair(run, read_run("run_2x.talog"))
    events = model.events_at(2.0)                # the same events in the same order, sizes at 2x the batch

A `Run` is a log read twice: by the analysis, whose second pass gives
every block its category and site (follow.BlockKinds), and as the trace
`torchalloc replay` replays (log.trace; the report's is gathered in the
analysis' pass instead, gather.py), whose allocations are the
analysis' blocks in the same order (checked: the same count and sizes);
blocks allocated before the log began lead the trace. The model gives each
allocation of the trace one ratio (laws.py): from its category for one run,
measured against the matching allocation of a second run for two. The
trace at knob x keeps every event, its order, its stream and its phase,
and every lifetime: only the sizes change, each by its law.

Two runs are matched allocation by allocation when both allocated the same
sites (and phases) in the same order -- a program run at another batch
size usually does -- else site by site: the j-th allocation of a site and
phase in one run with the j-th in the other when both made as many, else
the site's mean size in one over that in the other for all of them.
Allocations of a site the second run never made are not attributed: they
follow their category's law, and the upper bound scales them.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator

import numpy as np

from ..analysis import Analysis, Category, analyze
from ..log.trace import ALLOC, MAX_REQUEST, Trace, TraceError, load_trace
from ..log.trace_stream import load_log
from .follow import BlockKinds, Kinds
from .steps import Steps, steps_of
from .laws import BEFORE_LOG_CODE, NOMINAL_RATIO, SCALING_CODES, UNATTRIBUTED_CODES, growth, off_law, one_run_ratios


class PlanError(ValueError):
    """What plan cannot predict from: one line, said as it is (the command exits 2)."""


class TooLarge(PlanError):
    """A size at this multiple is past what any device can be asked for."""


@dataclasses.dataclass
class Run:
    """One logged run (module docstring)."""

    path: str
    analysis: Analysis
    kinds: Kinds
    trace: Trace
    category: np.ndarray  # int8 per allocation of the trace (those from before the log first)
    size: np.ndarray  # int64 per allocation of the trace: the bytes requested
    steps: Steps

    @property
    def before_log(self) -> int:
        return self.trace.prelude

    def keys(self) -> tuple[np.ndarray, list[str]]:
        """Each block of the log's (not those from before it) site and phase as one key id, and the keys' texts
        ("train.py:42 main @ forward")."""
        a, k = self.analysis, self.kinds
        texts: dict[str, int] = {}
        site_text = {int(s): a.site(int(s)).label for s in np.unique(k.site).tolist()}
        phase_text = {int(p): a.phase_name(int(p)) for p in np.unique(k.phase).tolist()}
        pair, inverse = np.unique(np.stack((k.site.astype(np.int64), k.phase.astype(np.int64)), axis=1), axis=0,
                                  return_inverse=True)
        ids = np.array([texts.setdefault(f"{site_text[int(s)]} @ {phase_text[int(p)]}", len(texts)) for s, p in pair],
                       dtype=np.int64)
        return ids[np.asarray(inverse).reshape(-1)], list(texts)


def read_run(source: str | os.PathLike[str] | bytes, *, device: int | None = None, progress: bool = False) -> Run:
    """A log (its path, or its bytes) analysed with plan's follower, and its trace (module docstring)."""
    follower = BlockKinds()
    try:
        a = analyze(source, device=device, progress=progress, followers=[follower])
    except TraceError as e:
        raise PlanError(str(e)) from None
    return run_of(source, a, follower)


def run_of(source: str | os.PathLike[str] | bytes, a: Analysis, follower: BlockKinds) -> Run:
    """The Run of an analysis of `source` made with `follower` among its followers (as `torchalloc report` makes
    it); the trace is the one the follower gathered when it did (gather.py), else `source` read again."""
    kinds = follower.kinds
    path = a.table.path
    if kinds is None:
        raise PlanError(f"{path}: the analysis ran without plan's follower")
    gather = follower.gather
    try:
        if gather is not None and not gather.over:  # gathered in the analysis' pass: no second reading
            trace = gather.trace(path, a.device, a.log.dropped, a.blocks.before_log)
        elif isinstance(source, (bytes, bytearray, memoryview)):
            trace = load_log(bytes(source), device=a.device, what=path)
        else:
            trace = load_trace(source, device=a.device)
    except TraceError as e:
        raise PlanError(str(e)) from None
    sizes = _alloc_sizes(trace)
    body = sizes[trace.prelude:]
    if len(body) != len(kinds.size) or not np.array_equal(body, kinds.size):
        raise PlanError(f"{path}: the trace's allocations are not the analysis' blocks ({len(body)} against "
                        f"{len(kinds.size)}): a damaged log, whose dropped records the trace refuses")
    category = np.concatenate((np.full(trace.prelude, BEFORE_LOG_CODE, dtype=np.int8), kinds.category))
    return Run(path, a, kinds, trace, category, sizes, steps_of(a, kinds))


def _alloc_sizes(trace: Trace) -> np.ndarray:
    """The requested bytes of each allocation of the trace, in order."""
    parts = [p["size"][p["kind"] == ALLOC].astype(np.int64) for p in _pieces(trace)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _pieces(trace: Trace) -> Iterator[np.ndarray]:
    if trace.chunks is not None:
        yield from trace.chunks.pieces()
    else:
        yield trace.events


@dataclasses.dataclass
class Model:
    """Each allocation's law over one run's trace (module docstring)."""

    run: Run
    rho: np.ndarray  # float64 per allocation: its size at knob r over its size at 1 (laws.py)
    unattributed: np.ndarray  # bool per allocation: its law is a guess (the upper bound scales it)
    r: float  # the knob's ratio the ratios are measured at (one run: laws.NOMINAL_RATIO)
    runs: int  # 1 or 2
    other: Run | None = None  # the second run
    matched: str = ""  # two runs: "in order", "by site" (how allocations were paired)
    by_site_mean: int = 0  # two runs: allocations whose site made a different count in the other run (mean ratio)
    off_law: int = 0  # two runs: allocations whose pair shrank or grew faster than quadratic (laws.off_law)
    # the replays with no capacity made of the trace so far, by (policy, multiple): predict.py asks before it replays
    peaks: dict[tuple[str, float], dict[str, Any]] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def trace(self) -> Trace:
        return self.run.trace

    def ratios(self, high: bool = False) -> np.ndarray:
        """The ratios; `high`: those not attributed made linear (the upper bound)."""
        return np.where(self.unattributed, self.r, self.rho) if high else self.rho

    def sizes_at(self, x: float, high: bool = False) -> np.ndarray:
        """Each allocation's requested bytes at knob x (x = 1: as recorded); TooLarge past what replay takes."""
        size = self.run.size
        new = np.rint(size * growth(self.ratios(high), self.r, x))
        new = np.where(size > 0, np.maximum(new, 1), 0)
        if new.size and new.max() > MAX_REQUEST:
            raise TooLarge(f"at {x:g}x an allocation would ask {int(new.max())} bytes, past any device")
        return new.astype(np.uint64)

    def events_at(self, x: float, high: bool = False) -> np.ndarray | Trace:
        """The trace at knob x: events as recorded, sizes by their laws (an array; a Trace in pieces for a trace
        kept in pieces)."""
        sizes = self.sizes_at(x, high)
        trace = self.trace
        if trace.chunks is None:
            events = trace.events.copy()
            events["size"][events["kind"] == ALLOC] = sizes
            return events
        return Trace(events=trace.events[:0], source="synthetic", path=trace.path,
                     chunks=_ScaledPieces(trace.chunks, sizes))


class _ScaledPieces:
    """A trace's pieces with new allocation sizes, for replay_once (engine: `pieces()` and a length)."""

    def __init__(self, chunks: Any, sizes: np.ndarray) -> None:
        self.chunks, self.sizes = chunks, sizes

    def __len__(self) -> int:
        return len(self.chunks)

    def pieces(self) -> Iterator[np.ndarray]:
        at = 0
        for piece in self.chunks.pieces():
            piece = piece.copy()
            alloc = piece["kind"] == ALLOC
            n = int(alloc.sum())
            piece["size"][alloc] = self.sizes[at:at + n]
            at += n
            yield piece


def usable(run: Run) -> None:
    """PlanError unless the run has allocations and, when it marks its steps, completes one."""
    if not len(run.size):
        raise PlanError(f"{run.path}: no allocation on device {run.analysis.device}: nothing to predict from")
    s = run.steps
    if s.marked and not s.complete:
        raise PlanError(f"{run.path}: no complete step: the log marks its steps ({s.by}) but ends before the first "
                        "one completes; log at least one whole step")


def one_run(run: Run) -> Model:
    """One run's model: each allocation's law from its category (laws.py)."""
    usable(run)
    if not np.isin(run.category, SCALING_CODES).any():
        raise PlanError(f"{run.path}: no block whose size scales with the batch (no activation, temporary or "
                        "backward temporary): nothing to predict from")
    return Model(run, one_run_ratios(run.category), np.isin(run.category, UNATTRIBUTED_CODES), NOMINAL_RATIO, 1)


def fit_pair(a: Run, b: Run, r: float | None = None) -> Model:
    """Two runs' model: each allocation of `a`'s law measured against its match in `b` (module docstring). `r`:
    the knob's ratio b / a (None: the ratio most allocations that changed share)."""
    usable(a)
    usable(b)
    keys_a, texts_a = a.keys()
    keys_b, texts_b = b.keys()
    common = {t: k for k, t in enumerate(texts_a)}
    remap = np.array([common.get(t, -1 - k) for k, t in enumerate(texts_b)], dtype=np.int64)
    keys_b = remap[keys_b] if len(keys_b) else keys_b
    size_a, size_b = a.kinds.size, b.kinds.size
    n = len(size_a)
    partner = np.full(n, -1, dtype=np.int64)  # each block of a: its match in b (-1: none)
    group_rho = np.full(n, np.nan)  # blocks matched by their site's mean size
    if n == len(size_b) and np.array_equal(keys_a, keys_b):
        partner = np.arange(n)
        matched = "in order"
    else:
        matched = "by site"
        partner, group_rho = _match_by_site(keys_a, keys_b, size_a, size_b)
    rho_body = np.full(n, np.nan)
    paired = partner >= 0
    sa = size_a[paired].astype(np.float64)
    sb = size_b[partner[paired]].astype(np.float64)
    rho_body[paired] = np.where((sa > 0) & (sb > 0), sb / np.maximum(sa, 1), 1.0)
    by_mean = ~np.isnan(group_rho)
    rho_body[by_mean] = group_rho[by_mean]
    if r is None:
        r = _common_ratio(rho_body[paired | by_mean])
    if r is None or r == 1.0:
        raise PlanError(f"{a.path}, {b.path}: no block whose size changes between the two logs (recorded at the "
                        "same batch and sequence length?): no law to measure")
    off = off_law(rho_body, r)
    rho_body[off] = np.nan  # no law of the knob: their category's, as an allocation that found no match
    unknown = np.isnan(rho_body)
    rho = np.concatenate((np.ones(a.before_log), rho_body))
    guess = one_run_ratios(a.category, r)
    unattributed = np.concatenate((np.ones(a.before_log, dtype=bool), unknown))
    rho[unattributed] = guess[unattributed]
    return Model(a, rho, unattributed, float(r), 2, other=b, matched=matched, by_site_mean=int(by_mean.sum()),
                 off_law=int(off.sum()))


def _match_by_site(keys_a: np.ndarray, keys_b: np.ndarray, size_a: np.ndarray, size_b: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per key (site and phase): the j-th block of a with the j-th of b when both have as many; else every block
    of a gets the ratio of the key's mean sizes (module docstring). Returns (partner in b or -1, mean ratio or
    nan)."""
    n = len(keys_a)
    partner = np.full(n, -1, dtype=np.int64)
    group_rho = np.full(n, np.nan)
    ua, inv_a, count_a = np.unique(keys_a, return_inverse=True, return_counts=True)
    ub, inv_b, count_b = np.unique(keys_b, return_inverse=True, return_counts=True)
    inv_a, inv_b = inv_a.reshape(-1), inv_b.reshape(-1)
    in_b = np.searchsorted(ub, ua)  # each key of a: its place among b's keys
    present = in_b < len(ub)
    present[present] = ub[in_b[present]] == ua[present]
    count_in_b = np.zeros(len(ua), dtype=np.int64)
    count_in_b[present] = count_b[in_b[present]]
    same = present & (count_a == count_in_b)
    rank_a = _rank_within(inv_a, len(ua))
    rank_b = _rank_within(inv_b, len(ub))
    # blocks of b by (key, rank): their index
    order_b = np.lexsort((rank_b, keys_b))
    code_b = keys_b[order_b] * (n + len(keys_b) + 1) + rank_b[order_b]
    code_a = keys_a * (n + len(keys_b) + 1) + rank_a
    elementwise = same[inv_a]
    pos = np.searchsorted(code_b, code_a[elementwise])
    partner[elementwise] = order_b[pos]
    mean_key = present & ~same
    if mean_key.any():
        mean_a = np.bincount(inv_a, weights=size_a, minlength=len(ua)) / count_a
        sums_b = np.bincount(inv_b, weights=size_b, minlength=len(ub))
        mean_b = np.zeros(len(ua))
        mean_b[present] = sums_b[in_b[present]] / count_b[in_b[present]]
        ratio = np.where((mean_a > 0) & (mean_b > 0), mean_b / np.maximum(mean_a, 1e-300), 1.0)
        take = mean_key[inv_a]
        group_rho[take] = ratio[inv_a[take]]
    return partner, group_rho


def _rank_within(group: np.ndarray, groups: int) -> np.ndarray:
    """Each element's rank among the elements of its group, in order (0, 1, ...)."""
    order = np.argsort(group, kind="stable")
    counts = np.bincount(group, minlength=groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.empty(len(group), dtype=np.int64)
    rank[order] = np.arange(len(group)) - starts[group[order]]
    return rank


def _common_ratio(rho: np.ndarray) -> float | None:
    """The ratio most allocations that changed share (ties: the one nearest 1, a linear law's before a quadratic's);
    None when none changed."""
    changed = rho[(rho != 1.0) & np.isfinite(rho)]
    if not changed.size:
        return None
    values, counts = np.unique(np.round(changed, 6), return_counts=True)
    best = max(range(len(values)), key=lambda k: (counts[k], -abs(np.log(values[k]))))
    return float(values[best])


def knob_fact(model: Model) -> str:
    """What the model knows of the knob, in words: 'one run: activations and temporaries linear in the batch' or
    'two runs, 2x apart: laws measured allocation by allocation'."""
    if model.runs == 1:
        return "one run: activations and temporaries linear in the batch, the rest kept"
    how = "allocation by allocation" if model.matched == "in order" else "site by site"
    return f"two runs, the second {model.r:g}x the first: each allocation's law measured {how}"


UNATTRIBUTED_WORDS = ", ".join(str(c) for c in (Category.OTHER_PERSISTENT, Category.BEFORE_LOG))
