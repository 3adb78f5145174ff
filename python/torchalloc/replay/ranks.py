"""`torchalloc replay LOG LOG ...`: a job's traces (one per rank) through each policy, the ranks side by side.

    torchalloc replay run.0.talog run.1.talog [--policies ...] [--capacity 80GiB] [--json]
    torchalloc replay 'run.*.talog'

Each rank's trace is replayed as `torchalloc replay TRACE` replays one
(replay.run: the library's own policies on a simulated device), one rank
at a time, keeping only what the tables print of it (Trace.summary), so
memory follows the largest trace, not the number of ranks; then per
policy the ranks' peak reserved bytes side by side, and the largest: every
GPU of the job must hold its rank's peak, so the job needs the largest.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Sequence

from ..log.ranks import assign_ranks
from .engine import Report, format_table, report_json, run
from ..log.trace import load_trace
from .. import text_fit
from ..units import fmt_bytes

__all__ = ["RankReplay", "run_ranks", "format_ranks", "ranks_json"]


@dataclasses.dataclass
class RankReplay:
    rank: int
    report: Report


def run_ranks(
    paths: Sequence[str],
    policies: Sequence[str],
    capacity: int,
    *,
    search: bool = True,
    device: int | None = None,
    prelude: bool = True,
    progress: bool | None = None,
) -> tuple[list[RankReplay], list[str]]:
    """Each trace replayed through every policy, ordered by rank; and notes on how ranks were assigned."""
    reports: list[Report] = []
    for path in paths:  # one trace in memory at a time
        trace = load_trace(path, device=device, prelude=prelude)
        report = run(trace, policies, capacity, search=search, progress=progress)
        report.trace = trace.summary()
        reports.append(report)
        del trace
    ranks, notes = assign_ranks([r.trace.rank for r in reports])
    out = [RankReplay(rank, report) for rank, report in zip(ranks, reports)]
    return sorted(out, key=lambda r: r.rank), notes


def _largest(values: Sequence[int | None]) -> int | None:
    """The largest, or None when a rank has none (a capacity the search did not find, a snapshot's reserved)."""
    known = [v for v in values if v is not None]
    return max(known) if known and len(known) == len(values) else None


def _cell(n: int | None) -> str:
    return fmt_bytes(n, 2) if n is not None else "-"


def format_ranks(ranks: Sequence[RankReplay], notes: Sequence[str], width: int | None = None) -> str:
    """Every rank's own table, then per policy the ranks' peak reserved and the job's worst; within `width` when
    given (text_fit)."""
    room = sys.maxsize if width is None else width
    lines: list[str] = []
    for r in ranks:
        lines.append(f"== rank {r.rank}")
        lines.append(format_table(r.report, width))
        lines.append("")
    lines += text_fit.paragraph("== The job: peak reserved per rank (each replayed alone), and the largest, which "
                                "every GPU must hold", room)
    lines += [line for n in notes for line in text_fit.paragraph(f"  note: {n}", room, more="    ")]
    header = ["policy"] + [f"rank {r.rank}" for r in ranks] + ["largest", "min capacity (largest)"]
    rows: list[list[str]] = []
    first = ranks[0].report
    recorded = [r.report.trace.native_peak_reserved for r in ranks]
    if _largest(recorded) is not None:
        rows.append([first.trace.native_label] + [_cell(v) for v in recorded] + [_cell(_largest(recorded)), "-"])
    for k, p in enumerate(first.policies):
        peaks = [r.report.policies[k].peak_reserved for r in ranks]
        caps = [r.report.policies[k].min_capacity for r in ranks]
        need = _largest(caps)
        worst = max(range(len(ranks)), key=lambda i: (peaks[i], -i))
        rows.append([p.policy] + [_cell(v) for v in peaks] + [f"{_cell(peaks[worst])} (rank {ranks[worst].rank})",
                                                                _cell(need)])
    lines += text_fit.table(header, rows, room)
    return "\n".join(lines)


def ranks_json(ranks: Sequence[RankReplay], notes: Sequence[str]) -> dict[str, Any]:
    """{"ranks": [{"rank": R, ...replay's JSON...}], "job": {policy: {"peak_reserved": [per rank], ...}}, "notes"}."""
    job: dict[str, Any] = {}
    for k, p in enumerate(ranks[0].report.policies):
        peaks = [r.report.policies[k].peak_reserved for r in ranks]
        caps = [r.report.policies[k].min_capacity for r in ranks]
        job[p.policy] = {"peak_reserved": peaks, "largest_peak_reserved": max(peaks),
                         "min_capacity": caps,
                         "largest_min_capacity": _largest(caps)}
    return {"ranks": [{"rank": r.rank, **report_json(r.report)} for r in ranks], "job": job, "notes": list(notes)}
