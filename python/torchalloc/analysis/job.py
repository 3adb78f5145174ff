"""Several logs of one job (one per rank) analysed together: peaks side by side, who peaked and why, what ranks share.

    from torchalloc.analysis.job import analyze_job
    job = analyze_job(["run.0.talog", "run.1.talog"])   # each log analysed alone, then compared
    job.ranks; job.highest; job.shared; job.differ; job.to_dict()

Each log is one process (`log:run.%r.talog` under torchrun gives one per
rank) and gets the single-log analysis (`torchalloc.analysis`) in full on its
busiest device. Then, at each rank's own peak of allocated bytes:

- the ranks side by side: peak allocated and reserved, when, in which
  phase, the sites that hold most of it;
- which rank peaked highest, and why: the phase it was in, its largest
  sites, and the sites where it held more than the lowest rank;
- what every rank shares: groups of live blocks with the same allocation
  site and block size, as many in every rank (DDP's parameters, gradients
  and optimizer state; FSDP's equal shards);
- where they differ: the groups whose count differs between ranks, or that
  some ranks lack (uneven shards, rank-0-only work, uneven batches);
- which ranks ran out of memory, when, asking for what, and the verdict
  (the failure's numbers as the single-log report reads them; the replay
  of alternatives is left to that rank's own report).

A rank is the writer's $RANK from the log's header; logs without one (no
launcher) are numbered by their place on the command line, with a note.

Each log is read, analysed and summed up in turn, and its analysis dropped
before the next is read: what the job keeps of a rank is its row, the
groups at its peak and a RankDetail (notes, a sampled timeline, peak
anatomy, phases, and its own report as a dict when asked), so memory
follows the largest single log, not the number of ranks
(bench/bench_ranks.py measures it).
"""
from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from ..log.ranks import assign_ranks
from ..log.reader import read_header
from ..units import fmt_bytes, fmt_time
from .anatomy import Anatomy
from .front import Analysis, analyze
from .sections.ooms.diagnosis import oom_explanation
from .sections.phases import PhaseRow

__all__ = ["RankRow", "RankDetail", "GroupRow", "Job", "analyze_job"]

Key = tuple[str, int]  # (allocation site, block size): "the same tensor" across ranks


@dataclasses.dataclass
class RankOom:
    """One out-of-memory failure of a rank, as its log tells it."""

    t_s: float
    requested: int
    phase: str
    site: str
    verdict: str
    why: str  # the verdict in words, with its numbers


@dataclasses.dataclass
class RankRow:
    """One rank's log, summed up at its peak."""

    rank: int
    path: str
    pid: int
    device: int
    events: int
    peak_allocated: int
    peak_t_s: float
    peak_reserved: int
    peak_reserved_t_s: float
    phase_at_peak: str  # the phase running when allocated peaked
    top_sites: list[tuple[str, int]]  # (site, bytes live at the peak), largest first
    by_category: dict[str, int]  # bytes live at the peak
    ooms: list[RankOom] = dataclasses.field(default_factory=list)  # its out-of-memory failures, in order

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["top_sites"] = [{"site": s, "bytes": n} for s, n in self.top_sites]
        return d


@dataclasses.dataclass
class RankDetail:
    """What the job's text, page and JSON show of one rank beyond its row, kept once its analysis is gone."""

    notes: list[str]
    wall_start_ns: int  # the rank's time zero on the wall clock: its logs are aligned by it
    t_s: np.ndarray  # the sampled timeline (at most max_points): seconds, allocated and reserved bytes
    allocated: np.ndarray
    reserved: np.ndarray
    anatomy: Anatomy | None  # at its peak; None without events
    phases: list[PhaseRow]
    report: dict[str, Any] | None  # its own single-log report, all of it (Analysis.to_dict), when asked for


@dataclasses.dataclass
class GroupRow:
    """Blocks of one (site, block size) live at each rank's peak."""

    site: str
    block_size: int
    category: str
    counts: list[int]  # per rank, in Job.ranks' order

    @property
    def bytes(self) -> list[int]:
        return [c * self.block_size for c in self.counts]

    def to_dict(self) -> dict[str, Any]:
        return {"site": self.site, "block_size": self.block_size, "category": self.category,
                "counts": list(self.counts), "bytes": self.bytes}


@dataclasses.dataclass
class Job:
    ranks: list[RankRow]
    details: list[RankDetail]  # in the order of `ranks`
    shared: list[GroupRow]  # as many blocks in every rank, largest first
    differ: list[GroupRow]  # counts differ between ranks, largest spread first
    highest: int  # index into ranks of the rank whose allocated peaked highest
    notes: list[str]
    world_size: int  # from the headers; 0 when none says

    def oom_sentence(self) -> str:
        """Which ranks ran out of memory, the first failure of each: when, asking for what, why."""
        failed = [r for r in self.ranks if r.ooms]
        if not failed:
            return "No rank ran out of memory."
        parts = []
        for r in failed:
            o = r.ooms[0]
            more = f" ({len(r.ooms)} failures; the first)" if len(r.ooms) > 1 else ""
            parts.append(f"rank {r.rank} ran out of memory{more} at {fmt_time(o.t_s)} asking for "
                         f"{fmt_bytes(o.requested)} in phase {o.phase} at {o.site}: {o.why}")
        if len(failed) < len(self.ranks):
            ok = [str(r.rank) for r in self.ranks if not r.ooms]
            parts.append(f"rank{'s' if len(ok) > 1 else ''} {', '.join(ok)} did not.")
        return " ".join(parts)

    @property
    def shared_bytes(self) -> int:
        """Bytes per rank in the groups every rank shares."""
        return sum(g.bytes[0] for g in self.shared)

    def why_highest(self) -> str:
        """The sentence: which rank peaked highest, when, in which phase, held by what, above the lowest by what."""
        hi = self.ranks[self.highest]
        sites = ", ".join(f"{s} {fmt_bytes(n)}" for s, n in hi.top_sites[:3]) or "no allocation site recorded"
        text = (f"rank {hi.rank} peaked highest: {fmt_bytes(hi.peak_allocated)} allocated at {fmt_time(hi.peak_t_s)} in "
                f"phase {hi.phase_at_peak}; most of it: {sites}.")
        if len(self.ranks) < 2:
            return text
        lo_i = min(range(len(self.ranks)), key=lambda k: (self.ranks[k].peak_allocated, k))
        lo = self.ranks[lo_i]
        gap = hi.peak_allocated - lo.peak_allocated
        if gap <= 0:
            return text + f" Every rank peaked at the same {fmt_bytes(hi.peak_allocated)}."
        # Per site, all block sizes together: an uneven shard is one site whose blocks differ in size.
        by_site: dict[str, int] = defaultdict(int)
        category: dict[str, str] = {}
        for g in self.differ:
            by_site[g.site] += g.bytes[self.highest] - g.bytes[lo_i]
            category.setdefault(g.site, g.category)
        more = sorted(((d, s) for s, d in by_site.items() if d > 0), key=lambda x: (-x[0], x[1]))[:3]
        where = "; ".join(f"{s} +{fmt_bytes(d)} ({category[s]})" for d, s in more)
        text += f" That is {fmt_bytes(gap)} ({gap / max(lo.peak_allocated, 1):.0%}) above rank {lo.rank}, the lowest"
        return text + (f"; it held more at {where}." if where else " (the same blocks, live at different moments).")

    def to_dict(self, top: int = 50) -> dict[str, Any]:
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "world_size": self.world_size,
            "highest": self.ranks[self.highest].rank,
            "why_highest": self.why_highest(),
            "ooms": self.oom_sentence(),
            "shared_bytes_per_rank": self.shared_bytes,
            "shared": [g.to_dict() for g in self.shared[:top]],
            "differ": [g.to_dict() for g in self.differ[:top]],
            "notes": list(self.notes),
            "reports": [d.report for d in self.details if d.report is not None],
        }


def _rank_row(rank: int, a: Analysis, an: Anatomy, top_sites: int) -> RankRow:
    """`an`: the rank's anatomy at its peak."""
    t, tl = a.table, a.timeline
    sites: dict[str, int] = defaultdict(int)
    for row in an.rows:
        sites[row.site] += row.bytes
    phase = a.phase_name(a.scan.peak_phase) if len(t) else "-"
    ranked = sorted(sites.items(), key=lambda kv: (-kv[1], kv[0]))[:top_sites]
    ooms = [RankOom(o.t_s, o.requested, o.phase, o.site, o.verdict, oom_explanation(o))
            for o in a.ooms(check_alternatives=False)]
    return RankRow(rank, t.path, t.pid, a.device, len(t), tl.peak_allocated, tl.peak_t, tl.peak_reserved,
                   tl.peak_reserved_t, phase, ranked, dict(an.by_category), ooms)


def _groups_at_peak(a: Analysis) -> tuple[dict[Key, int], dict[Key, str]]:
    """Live blocks at the peak counted by (site, block size), and each group's category."""
    counts: dict[Key, int] = defaultdict(int)
    category: dict[Key, str] = {}
    for site, size, what in a.live_at_peak():
        key = (site, size)
        counts[key] += 1
        category.setdefault(key, what)
    return counts, category


def _detail(a: Analysis, an: Anatomy, report_top: int | None) -> RankDetail:
    t, tl = a.table, a.timeline
    return RankDetail(list(a.notes), a.base_ns + t.wall_offset_ns if len(t) else 0, tl.t_s.copy(),
                      tl.allocated.copy(), tl.reserved.copy(), an if len(t) else None, a.phases(),
                      a.to_dict(top=report_top) if report_top is not None else None)


def _compare(per_rank: Sequence[tuple[dict[Key, int], dict[Key, str]]]) -> tuple[list[GroupRow], list[GroupRow]]:
    keys = sorted({k for counts, _ in per_rank for k in counts})
    shared, differ = [], []
    for key in keys:
        counts = [c.get(key, 0) for c, _ in per_rank]
        category = next(cat[key] for c, cat in per_rank if key in cat)
        row = GroupRow(key[0], key[1], category, counts)
        (shared if len(set(counts)) == 1 else differ).append(row)
    shared.sort(key=lambda g: (-g.bytes[0], g.site))
    differ.sort(key=lambda g: (-(max(g.bytes) - min(g.bytes)), g.site, g.block_size))
    return shared, differ


def analyze_job(
    logs: Sequence[str | os.PathLike[str]],
    *,
    device: int | None = None,
    max_points: int = 1500,
    top_sites: int = 5,
    reports: int | None = None,
) -> Job:
    """Analyse each log (one per rank, one at a time), then compare them at their peaks. `device` applies to
    every log (default: each log's busiest device, which under torchrun is the rank's own GPU). `reports`:
    keep each rank's own report as a dict with this many rows per section (for --json); None: not kept."""
    if not logs:
        raise ValueError("no logs given")
    headers = [read_header(p) for p in logs]
    ranks, notes = assign_ranks([h.rank for h in headers])
    rows, details, groups = [], [], []
    for k in sorted(range(len(logs)), key=lambda k: ranks[k]):
        a = analyze(logs[k], device=device, max_points=max_points)
        at_peak = a.anatomy("peak")  # the row and the detail both show it
        rows.append(_rank_row(ranks[k], a, at_peak, top_sites))
        groups.append(_groups_at_peak(a))
        details.append(_detail(a, at_peak, reports))
        del a  # before the next log is read: one analysis in memory at a time
    sizes = {h.world_size for h in headers if h.world_size > 0}
    if len(sizes) > 1:
        notes.append(f"the logs disagree on the world size ({sorted(sizes)}): are they from one job?")
    world = max(sizes) if sizes else 0
    if world and len(logs) < world:
        notes.append(f"{len(logs)} of the job's {world} ranks' logs given: the others are left out")
    shared, differ = _compare(groups)
    highest = max(range(len(rows)), key=lambda k: (rows[k].peak_allocated, -k))
    return Job(rows, details, shared, differ, highest, notes, world)
