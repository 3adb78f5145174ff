"""`torchalloc replay`: how each policy would have served a recorded trace.

    torchalloc replay [TRACE] [--policies caching,exact,phase_arena] [--capacity 80GiB] [--json] [--png FILE]

TRACE is a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) or a
torchalloc log; without one, the trace bundled with the package (recorded
from a real training run, see torchalloc/data/default_trace.md) is used.
Every policy runs the very C code that serves the GPU, on a simulated device
(allocator/runtime/replay.c): no GPU needed. The command line is
cli/replay.py.

Policies are named as the library's policies, for ordinary segments
(PyTorch's, byte for byte), or with +expandable, +compact or +reclaim for
the expandable modes (TORCHALLOC_CONF expandable:on, compact, reclaim).
`install()` with no arguments picks caching+reclaim where the driver has
virtual memory management: that row is marked (JSON: "default": true).
The simulated device trails the trace by 1000 events, so the reclaim mode
meets memory the device may still be using, as it would on a GPU.

Per policy: peak allocated and reserved, their ratio, fragmentation at the
peak of reserved ((free inside reserved - largest free block) / free inside
reserved), device allocations (or, expandable, runs of granules mapped) and
frees (runs unmapped), handles moved to a new address (reclaim), device
synchronizes, whether the trace runs out of
memory at --capacity (and at which event), and the smallest capacity at
which the whole trace runs. That last one is a bisection over capacities
(2 MiB steps between the trace's live peak and the policy's unconstrained
peak reserved): below the unconstrained peak a policy may still succeed by
releasing its cache and retrying, as it does on a GPU. Success is not
strictly monotone in the capacity, so the figure is what bisection finds.

When a policy's unconstrained run reserves more than --capacity, its peak
columns are those of the run under the capacity (with the cache released
and retried, or up to its OOM), and the unconstrained peak is printed below
the table (JSON: "capped", "unlimited_peak_reserved"). --capacity 0 means
unlimited: every run is the unconstrained one.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import _lib, text_fit
from .._records import POLICY_NAMES
from ..log.trace import EVENT_DTYPE, Trace, TraceError
from ..units import GiB, fmt_bytes, parse_bytes

# What install() picks with no arguments (where the driver has virtual memory): the registry's default policy
# (id 0) in the reclaim mode, TORCHALLOC_CONF's default.
INSTALL_DEFAULT = f"{POLICY_NAMES[0]}+reclaim"
# every policy the library has, in its registry's order (ordinary segments), then those that can grow
# expandable segments with them (expandable:on), compact them (compact) and reclaim without synchronizing
# (reclaim, the default)
DEFAULT_POLICIES = (*POLICY_NAMES.values(), "caching+expandable", "phase_arena+expandable", "caching+compact",
                    "phase_arena+compact", INSTALL_DEFAULT, "phase_arena+reclaim")
DEFAULT_CAPACITY_TEXT = "80GiB"  # --capacity's default, in its syntax: an 80 GB GPU
DEFAULT_CAPACITY = parse_bytes(DEFAULT_CAPACITY_TEXT)
SEARCH_GRANULARITY = 2 << 20
DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DEFAULT_TRACE = DATA_DIR / "default_trace.pickle.xz"
PROGRESS_MIN_EVENTS = 1_000_000  # show a progress bar from this many events (on a terminal)
PLOT_POINTS = 2000


def setting_of(policy: str) -> str:
    """The TORCHALLOC_CONF entries that make a replay policy: "caching+compact" -> "policy:caching,expandable:2"."""
    name, _, variant = policy.partition("+")
    extra = {"expandable": ",expandable:1", "compact": ",expandable:2", "reclaim": ",expandable:3"}.get(variant, "")
    return f"policy:{name}{extra}"


def _events_of(trace: Trace | np.ndarray) -> np.ndarray:
    events = trace.events if isinstance(trace, Trace) else trace
    if events.dtype != EVENT_DTYPE:
        raise TypeError(f"events must have dtype EVENT_DTYPE, not {events.dtype}")
    return np.ascontiguousarray(events)


def replay_once(
    trace: Trace | np.ndarray, policy: str, capacity: int = 0, series_len: int = 0
) -> tuple[dict[str, Any], np.ndarray | None]:
    """One C replay: the torchalloc_replay_result as a dict, and the reserved series if asked for.

    capacity 0: unlimited. The GIL is released for the whole replay, so
    replays on several threads run in parallel.
    """
    series = np.empty(series_len, dtype=np.int64) if series_len > 0 else None
    if isinstance(trace, Trace) and trace.chunks is not None:
        return _replay_pieces(trace, policy, capacity, series), series
    events = _events_of(trace)
    result = _lib.replay(
        events.ctypes.data if len(events) else None,
        len(events),
        policy,
        capacity,
        series.ctypes.data if series is not None else None,
        len(series) if series is not None else 0,
    )
    return result, series


def _replay_pieces(trace: Trace, policy: str, capacity: int, series: np.ndarray | None) -> dict[str, Any]:
    """One C replay of a trace that comes in pieces (trace_stream.py), fed piece by piece."""
    run_ = _lib.ReplayRun(policy, capacity, len(trace), series.ctypes.data if series is not None else None,
                          len(series) if series is not None else 0)
    try:
        for piece in trace.chunks.pieces():
            events = _events_of(piece)
            if run_.feed(events.ctypes.data if len(events) else None, len(events)):
                break  # an OOM ended it
    except BaseException:
        run_.close()
        raise
    return run_.end()


def _grid(lo: int, hi: int, granularity: int) -> tuple[int, int]:
    """Candidate indices k_lo..k_hi; capacity(k) = min(k * granularity, hi), capacity(k_hi) = hi."""
    k_hi = -(-hi // granularity)
    k_lo = min(max(1, -(-lo // granularity)), k_hi)
    return k_lo, k_hi


def search_steps(lo: int, hi: int, granularity: int = SEARCH_GRANULARITY) -> int:
    k_lo, k_hi = _grid(lo, hi, granularity)
    return math.ceil(math.log2(k_hi - k_lo + 1)) if k_hi > k_lo else 0


def min_capacity(
    trace: Trace | np.ndarray,
    policy: str,
    lo: int,
    hi: int,
    granularity: int = SEARCH_GRANULARITY,
    on_step: Callable[[], None] | None = None,
) -> int:
    """Smallest capacity on the grid {multiples of granularity below hi} + {hi} that runs the whole trace.

    `hi` must run (the policy's unconstrained peak reserved does, by
    construction); `lo` is a lower bound (the trace's live peak). Bisection:
    assumes that a capacity that runs makes every larger one run.
    """
    if hi <= 0:
        return 0
    k_lo, k_hi = _grid(lo, hi, granularity)
    while k_lo < k_hi:
        k = (k_lo + k_hi) // 2
        result, _ = replay_once(trace, policy, min(k * granularity, hi))
        if on_step:
            on_step()
        if result["oom"]:
            k_lo = k + 1
        else:
            k_hi = k
    return min(k_hi * granularity, hi)


@dataclasses.dataclass
class PolicyReport:
    policy: str
    peak_allocated: int
    peak_requested: int
    peak_reserved: int
    peak_reserved_event: int
    fragmentation_at_peak: float
    free_at_peak: int
    largest_free_at_peak: int
    device_allocs: int
    device_frees: int
    synchronizes: int
    handles_moved: int
    unknown_frees: int
    oom_at_capacity: bool
    oom_event: int | None
    min_capacity: int | None
    seconds: float  # the unconstrained replay
    unlimited_peak_reserved: int  # without a capacity; min_capacity's search runs up to it
    capped: bool  # the columns above come from the run under the capacity (it peaked past it unconstrained)
    series: np.ndarray | None = None

    @property
    def ratio(self) -> float:
        return self.peak_reserved / self.peak_allocated if self.peak_allocated else 0.0

    @property
    def is_default(self) -> bool:
        """The variant torchalloc.install() picks with no arguments."""
        return self.policy == INSTALL_DEFAULT


@dataclasses.dataclass
class Report:
    trace: Trace
    capacity: int
    policies: list[PolicyReport]
    native_series: np.ndarray | None = None
    threads: int = 1


class _Progress:
    """A tqdm bar over replays when the trace is long and stderr a terminal; silent otherwise."""

    def __init__(self, enabled: bool, desc: str) -> None:
        self._bar: Any = None
        self._lock = threading.Lock()
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=0, desc=desc, unit="replay", file=sys.stderr, leave=False)

    def add(self, n: int) -> None:
        """Grow (or, n < 0, shrink) the total."""
        if self._bar is not None and n:
            with self._lock:
                self._bar.total += n
                self._bar.refresh()

    def step(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _run_policy(
    trace: Trace, policy: str, capacity: int, search: bool, series_len: int, granularity: int, progress: _Progress
) -> PolicyReport:
    t0 = time.perf_counter()
    free_run, series = replay_once(trace, policy, 0, series_len)
    seconds = time.perf_counter() - t0
    progress.step()
    shown = free_run
    if capacity and free_run["peak_reserved"] > capacity:
        # Under the capacity the run differs (the policy releases its cache and retries, or stops at an OOM):
        # the columns must describe that run, not the unconstrained one.
        progress.add(1)
        shown, series = replay_once(trace, policy, capacity, series_len)
        progress.step()
    found: int | None = None
    if search:
        lo = trace.peak_rounded
        hi = free_run["peak_reserved"]
        estimate = search_steps(lo, hi, granularity)
        progress.add(estimate)
        probes = [0]

        def step() -> None:
            probes[0] += 1
            progress.step()

        found = min_capacity(trace, policy, lo, hi, granularity, step)
        progress.add(probes[0] - estimate)  # bisection may need one probe fewer than estimated
    return PolicyReport(
        policy=policy,
        peak_allocated=shown["peak_allocated"],
        peak_requested=shown["peak_requested"],
        peak_reserved=shown["peak_reserved"],
        peak_reserved_event=shown["peak_reserved_event"],
        fragmentation_at_peak=shown["fragmentation_at_peak"],
        free_at_peak=shown["free_at_peak"],
        largest_free_at_peak=shown["largest_free_at_peak"],
        device_allocs=shown["device_allocs"],
        device_frees=shown["device_frees"],
        synchronizes=shown["synchronizes"],
        handles_moved=shown["handles_moved"],
        unknown_frees=shown["unknown_frees"],
        oom_at_capacity=bool(shown["oom"]),
        oom_event=shown["oom_event"] if shown["oom"] else None,
        min_capacity=found,
        seconds=seconds,
        unlimited_peak_reserved=free_run["peak_reserved"],
        capped=shown is not free_run,
        series=series,
    )


def run(
    trace: Trace,
    policies: Sequence[str] = DEFAULT_POLICIES,
    capacity: int = DEFAULT_CAPACITY,
    *,
    search: bool = True,
    series_len: int = 0,
    granularity: int = SEARCH_GRANULARITY,
    progress: bool | None = None,
    threads: int | None = None,
) -> Report:
    """Replay `trace` through every policy (in parallel threads) and gather the report."""
    if not policies:
        raise ValueError("no policies to replay")
    if progress is None:
        progress = len(trace) >= PROGRESS_MIN_EVENTS and sys.stderr.isatty()
    bar = _Progress(progress, "replay")
    bar.add(len(policies))
    workers = threads or min(len(policies), os.cpu_count() or 1)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(_run_policy, trace, p, capacity, search, series_len, granularity, bar) for p in policies
            ]
            reports = [f.result() for f in futures]
    finally:
        bar.close()
    native = trace.native_reserved_series(series_len) if series_len else None
    return Report(trace=trace, capacity=capacity, policies=reports, native_series=native, threads=workers)


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def report_json(report: Report) -> dict[str, Any]:
    """The --json document. Bytes are integers; fragmentation a float in [0, 1]."""
    t = report.trace
    known = None if t.native_peak_reserved is None else int(t.native_peak_reserved)
    native = known if t.source == "pytorch-snapshot" else None
    recorded = known if t.source == "torchalloc-log" else None
    policies: dict[str, Any] = {}
    for p in report.policies:
        policies[p.policy] = {
            "peak_allocated": int(p.peak_allocated),
            "peak_reserved": int(p.peak_reserved),
            "fragmentation_at_peak": float(p.fragmentation_at_peak),
            "device_allocs": int(p.device_allocs),
            "min_capacity": None if p.min_capacity is None else int(p.min_capacity),
            "oom_at_capacity": bool(p.oom_at_capacity),
            "default": p.is_default,  # what install() picks with no arguments
            "synchronizes": int(p.synchronizes),  # device synchronizes the policy made
            # Beyond the documented keys:
            "reserved_over_allocated": round(p.ratio, 6),
            "device_frees": int(p.device_frees),
            "handles_moved": int(p.handles_moved),  # reclaim: handles mapped at a new address
            "oom_event": p.oom_event,
            "peak_reserved_event": int(p.peak_reserved_event),
            # The peaks above are of the run under the capacity (up to its OOM, if any) when `capped`;
            # this is the unconstrained run's, which exceeded the capacity.
            "capped": p.capped,
            "unlimited_peak_reserved": int(p.unlimited_peak_reserved),
        }
    return {
        "trace": {
            "events": len(t),
            "peak_allocated": int(t.peak_requested),
            # What PyTorch's own allocator reserved (a snapshot with segment information); null otherwise.
            "native_peak_reserved": native,
            # Beyond the documented keys:
            "recorded_peak_reserved": recorded,  # a torchalloc log: what its recording policy reserved
            "capacity": int(report.capacity),
            "unknown_frees": int(t.unknown_frees),
            "prelude_allocations": int(t.prelude),
            "notes": list(t.notes),
        },
        "policies": policies,
    }


def format_table(report: Report, width: int | None = None) -> str:
    """The replay's table and what its columns mean; with `width`, fitted to it (text_fit: headers on several
    lines, then the columns in several tables, each led by the policy; the sentences wrapped)."""
    t = report.trace
    cap = fmt_bytes(report.capacity, 2) if report.capacity else "unlimited"
    header = ["policy", "peak alloc", "peak reserved", "reserved/alloc", "frag@peak", "dev allocs/maps",
              "dev frees/unmaps", "moves", "syncs", f"OOM @ {cap}", "min capacity"]
    rows: list[list[str]] = []
    if t.native_peak_reserved is not None:
        ratio = t.native_peak_reserved / t.peak_requested if t.peak_requested else 0.0
        rows.append([t.native_label, fmt_bytes(t.peak_requested, 2) + " req.", fmt_bytes(t.native_peak_reserved, 2),
                     f"{ratio:.3f}", "-", "-", "-", "-", "-", "yes" if t.native_ooms else "-", "-"])
    for p in report.policies:
        oom = f"at event {p.oom_event}" if p.oom_at_capacity else ("no (cache released)" if p.capped else "no")
        rows.append([p.policy + (" *" if p.is_default else ""), fmt_bytes(p.peak_allocated, 2),
                     fmt_bytes(p.peak_reserved, 2), f"{p.ratio:.3f}", f"{p.fragmentation_at_peak:.3f}",
                     str(p.device_allocs), str(p.device_frees), str(p.handles_moved), str(p.synchronizes), oom,
                     fmt_bytes(p.min_capacity, 2)])
    where = t.path or t.source
    # The events replayed are the allocations, frees and phase changes; `torchalloc report` counts every record of
    # a log (segments, markers, modules too), so its count is larger: said here, where the two would be compared.
    counted = "" if t.source == "pytorch-snapshot" else "; a report counts the log's other records too"
    above = [f"trace: {where} ({t.source}: {len(t):,} allocations, frees and phase changes replayed{counted}; "
             f"peak requested {fmt_bytes(t.peak_requested, 2)})"]
    above += [f"  note: {note}" for note in t.notes]
    below = []  # what the columns mean, a sentence a line
    speeds = [f"{p.policy} {len(t) / p.seconds / 1e6:.1f} M" for p in report.policies if p.seconds > 0]
    if speeds and len(t) >= 100_000:  # too short a trace to time
        below.append(f"replay speed (events/s, {report.threads} policies at a time): " + ", ".join(speeds))
    capped = [p for p in report.policies if p.capped]
    if capped:
        below.append(
            f"under {cap}: " + "; ".join(
                f"{p.policy} peaked at {fmt_bytes(p.unlimited_peak_reserved, 2)} reserved without a limit, "
                + (f"so the row is its run up to the OOM at event {p.oom_event}" if p.oom_at_capacity
                   else "so the row is its run with the cache released and retried at the limit")
                for p in capped
            )
        )
    if t.native_peak_reserved is not None:
        below.append(
            f"{t.native_label}: what the allocator that recorded the trace reserved in the run (its segments), "
            "beside the peak of the bytes requested (req.: the trace does not say how that allocator rounded them); "
            "the rows below it are replays")
    if any(p.is_default for p in report.policies):
        below.append(f"* {INSTALL_DEFAULT}: what torchalloc.install() picks with no arguments (where the driver has "
                     "virtual memory management; ordinary segments, the policy's name alone, elsewhere)")
    below.append(
        "peak alloc: block bytes (requests rounded as the policy rounds them); frag@peak: (free inside reserved - "
        "largest free block) / free inside reserved, when reserved peaked; dev allocs/maps, frees/unmaps: device "
        "allocations and frees, or for +expandable/+compact/+reclaim runs of granules mapped and unmapped; moves: "
        "physical handles mapped at a new address (+reclaim moves free memory where it is asked for); syncs: "
        "device synchronizes (the simulated device trails the trace by 1000 events); min capacity: smallest device "
        f"size (in {fmt_bytes(SEARCH_GRANULARITY, 2)} steps) that runs the whole trace"
    )
    if width is None:
        return "\n".join([*above, "", *text_fit.table(header, rows, sys.maxsize), "", *below])
    fitted = [line for text in above for line in text_fit.paragraph(text, width, more="    ")]
    fitted += ["", *text_fit.table(header, rows, width), ""]
    fitted += [line for text in below for line in text_fit.paragraph(text, width)]
    return "\n".join(fitted)


def plot_png(report: Report, path: str | os.PathLike[str]) -> None:
    """Reserved bytes over the trace, one line per policy (and PyTorch's own, when known)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(report.trace)
    fig, ax = plt.subplots(figsize=(10, 5), dpi=120)
    for p in report.policies:
        if p.series is None:
            continue
        x = np.linspace(0, n, len(p.series), endpoint=False)
        y = np.where(p.series >= 0, p.series, np.nan) / GiB
        ax.plot(x, y, label=p.policy, linewidth=1.2)
    if report.native_series is not None:
        x = np.linspace(0, n, len(report.native_series), endpoint=False)
        ax.plot(x, report.native_series / GiB, label=report.trace.native_label, linewidth=1.2, linestyle="--",
                color="black")
    ax.set_xlabel("event")
    ax.set_ylabel("reserved (GiB)")
    ax.set_title(f"reserved memory over {Path(report.trace.path).name or report.trace.source}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path))
    plt.close(fig)


def default_trace_path() -> Path:
    if not DEFAULT_TRACE.is_file():
        raise TraceError(
            f"no TRACE given, and the bundled default trace is missing ({DEFAULT_TRACE}). It is recorded on a GPU "
            "by examples/record_trace.py; meanwhile give a trace: torchalloc replay SNAPSHOT.pickle, where "
            "SNAPSHOT.pickle comes from torch.cuda.memory._record_memory_history() + _dump_snapshot(), "
            "or a torchalloc log"
        )
    return DEFAULT_TRACE
