"""The analysis of a log: two passes over it in pieces, and `Analysis`, the front every report asks.

    from torchalloc.analysis import analyze
    a = analyze("run.talog", at=["step 100"], page=True)   # moments the report will show, named in advance
    a.anatomy("peak"); a.lifetimes(); a.phases(); a.estimate(); a.reserve(); a.modules(); a.ooms(); a.to_dict()

Every log, of any size, is read the same way: in pieces (log/chunks.py; a
small log is one piece), twice -- a first pass for the facts the second
needs (passes/first.py), a second that classifies each block as it ends
and keeps the blocks live at the moments the report shows
(passes/second.py), feeding every registered section's follower as it
goes (sections/: what each adds up -- the lifetime rows, the phase sums,
the estimate's terms, the segments and terms of reserved with every
policy's replay fed the events on a thread of its own, each block's
module, the stretches between markers, the leaks, the segments at each
OOM). `Analysis` answers what a report asks: the moments and their
anatomies (anatomy.py), the timeline (timeline.py), the notes (notes.py),
each section's rows by its key (`section_rows`, with a method per section
for callers), the summary (summary.py) and the JSON (`to_dict`).

Memory follows what the report shows, not the log's length: about 2
minutes and under 1 GB for 10^8 records on a 2-core machine
(bench/bench_scale.py). What that costs in exactness, and only for long
logs:

- the typical lifetime of a row of more than 65536 blocks (and of the
  largest rows once 4M lifetimes are kept in all) is the median of a
  histogram with bins 0.1 % wide (exact below);
- the timeline lists the first 10000 markers and OOMs, the first 100000
  phase occurrences (the notes say when more were left out);
- the JSON carries the anatomies of the first 1000 marker labels
  (passes/moments.py's MARKER_ANATOMIES);
- a moment not named in advance (`at`, `page`) costs one more pass.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..log.chunks import DEFAULT_CHUNK_RECORDS, ChunkedLog
from ..log.reader import RECORD_DTYPE
from ..printable import printable
from .anatomy import Anatomy, anatomy_of, some_labels
from .notes import backward_from, derive_notes, table_notes
from .passes.first import Scan, scan
from .passes.follow import Follower
from .passes.moments import MARKER_ANATOMIES, anatomy_moments, is_time, page_moments
from .passes.pieces import report_start_ns
from .passes.second import Passed, Wanted, run_pass
from .rules.categorize import CATEGORIES
from .rules.frames import Frame
from .rules.sites import BEFORE_LOG, Site
from .sections import pass_parts, sections_json
from .sections.estimate import Estimate
from .sections.lifetimes import LifetimeRow
from .sections.modules import Modules
from .sections.ooms.diagnosis import OomRow
from .sections.phases import PhaseRow
from .sections.reserve.rows import Reserve
from .summary import Summary, summary
from .timeline import timeline_of


class _Printable(Mapping[int, str]):
    """A log's strings, each escaped as every report shows it (torchalloc.printable) when looked up: a copy of
    them all would cost what the log's string table costs again, for strings the report never prints."""

    def __init__(self, strings: Mapping[int, str]) -> None:
        self._strings = strings

    def __getitem__(self, sid: int) -> str:
        return printable(self._strings[sid])

    def __iter__(self) -> Iterator[int]:
        return iter(self._strings)

    def __len__(self) -> int:
        return len(self._strings)


@dataclasses.dataclass
class EventTable:
    """What the report reads of the event table: its path, its length, the writer; no per-event arrays."""

    path: str
    n: int
    pid: int
    rank: int
    world_size: int
    phase_names: dict[int, str]
    strings: Mapping[int, str]
    stacks: dict[int, tuple[Frame, ...]]
    wall_offset_ns: int  # add to a time_ns for Unix time

    def __len__(self) -> int:
        return self.n

    def stack_of(self, stack_id: int) -> tuple[Frame, ...]:
        return self.stacks.get(int(stack_id), ())


@dataclasses.dataclass
class _Count:
    """How many blocks the log has, and how many of them were allocated before it began."""

    n: int
    before_log: int

    def __len__(self) -> int:
        return self.n


class Analysis:
    """One device's events explained (module docstring): the moments, the timeline and the anatomies, and each
    section's rows by its key. Build with `analyze`."""

    def __init__(self, log: ChunkedLog, scan_: Scan, passed: Passed, wanted: Wanted, notes: list[str],
                 backward_from: str, max_points: int, page: bool, followers: dict[str, Follower | None]) -> None:
        self.log, self.scan, self.passed, self.wanted = log, scan_, passed, wanted
        self.followers = followers  # part key -> what the pass gathered for its sections (None: nothing to follow)
        self._section_rows: dict[str, Any] = {}  # part key -> its rows, built once
        self.max_points, self.page_wanted = max_points, page
        header = log.header
        # Text from the log, escaped as every report shows it (torchalloc.printable).
        stacks = {int(k): tuple(Frame(printable(str(f[0])), int(f[1]), printable(str(f[2]))) for f in v)
                  for k, v in log.stacks.items()}
        self.table = EventTable(log.path, scan_.n, int(header.pid), int(header.rank),
                                 int(getattr(header, "world_size", 0)),
                                 {k: printable(v) for k, v in log.phase_names.items()},
                                 _Printable(log.strings), stacks,
                                 int(header.created_realtime_ns - header.created_monotonic_ns))
        self.device = scan_.device
        self.notes = notes
        self.has_stacks = scan_.has_stacks
        self.backward_from = backward_from
        self.blocks = _Count(len(scan_.orphans["addr"]) + scan_.blocks, len(scan_.orphans["addr"]))
        self.base_ns = report_start_ns(header.created_monotonic_ns if scan_.n else None, scan_.first_ns)
        self.sites, self.site_map, self.fn_map = passed.rules.canonical(passed.alloc_stacks, passed.rest_pairs)
        self.timeline = timeline_of(scan_, passed, self.base_ns, self.phase_name, self.table.strings,
                                    self.table.phase_names)
        self._marker_first: dict[str, int] | None = None  # marker text -> its first index (marker_index)
        self._summary: Summary | None = None

    # -- small things ------------------------------------------------------------------------
    def phase_name(self, p: int) -> str:
        if p < 0:
            return BEFORE_LOG.label
        return self.table.phase_names.get(int(p), f"phase {p}")

    def seconds(self, time_ns: int) -> float:
        """A time of the log in seconds since the report's time zero."""
        return (int(time_ns) - self.base_ns) / 1e9

    def time_s(self, i: int) -> float:
        if not self.scan.n:
            return 0.0
        return self.seconds(self._levels(i)[2])

    def allocated_at(self, i: int) -> int:
        return self._levels(i)[0] + self.scan.initial

    def reserved_at(self, i: int) -> int:
        return self._levels(i)[1] + self.scan.offset

    def _levels(self, i: int) -> tuple[int, int, int]:
        got = self.passed.levels_at.get(int(i))
        if got is None:
            self._more([int(i)])
            got = self.passed.levels_at[int(i)]
        return got

    def before_log_site(self) -> int:
        """The second pass' site id of the blocks allocated before the log (details carry the pass' ids)."""
        return self.passed.rules.sites.id(BEFORE_LOG)

    def site(self, my_id: int) -> Site:
        return self.sites[int(self.site_map[my_id])]

    # -- moments -----------------------------------------------------------------------------
    def marker_first(self) -> dict[str, int]:
        """Each marker text -> the index of its first marker (every label of the log, not only those listed)."""
        if self._marker_first is None:  # once: a scan of every label per lookup made the report labels squared
            first: dict[str, int] = {}
            for lid, i in self.scan.marker_first.items():
                text = self.table.strings.get(lid, "")
                first[text] = min(i, first.get(text, i))
            self._marker_first = first
        return self._marker_first

    def marker_index(self, label: str) -> int | None:
        """The first marker whose text is `label`."""
        return self.marker_first().get(label)

    def index_at(self, at: str | float | int | None = None) -> tuple[int, str]:
        """The event index of a moment, and its label: "peak", "peak_reserved", "end", "oom" (the first OOM), a
        marker label (its first marker), or a time in seconds since the log was opened (the last event by then)."""
        s = self.scan
        if s.n == 0:
            return 0, "empty log"
        if at is None or at == "peak":
            return s.peak_i, "peak"
        if at == "peak_reserved":
            return s.rpeak_i, "peak reserved"
        if at == "end":
            return s.n - 1, "end"
        if at == "oom":
            if not s.ooms:
                raise ValueError("the log has no OOM record")
            return int(s.ooms[0]["index"]), "OOM"
        if isinstance(at, str):
            i = self.marker_index(at)
            if i is not None:
                return i, f"marker '{at}'"
            try:
                at = float(at.rstrip("s"))
            except ValueError:
                named = some_labels(self.table.strings.get(lid, "") for lid in s.marker_first)
                raise ValueError(f"no marker {at!r}; markers: {named}; or give a time in seconds") from None
        target = float(at)
        end = max((s.last_ns - self.base_ns) / 1e9, 0.0)
        if not math.isfinite(target) or not 0.0 <= target <= end:  # outside the log: an error, not its nearest end
            raise ValueError(f"t={target:g} s is not in this log: it covers t=0 s to t={end:.9g} s (seconds since "
                             "it was opened); give a time in that range, or a marker")
        if target not in s.at_time:
            s.at_time.update(scan(self.log, s.device, max_points=self.max_points, last_ns=s.last_ns,
                                  at_times=[target]).at_time)
        return s.at_time[target], f"t={target:g}s"

    def _more(self, moments: Sequence[int]) -> None:
        """A pass for moments not named in advance."""
        extra = Wanted(anatomy=list(moments), page=np.zeros(0, dtype=np.int64), priority=set(),
                       samples=np.zeros(0, dtype=np.int64))
        more = run_pass(self.log, self.scan, extra, rules=self.passed.rules)
        self.passed.snapshots.update(more.snapshots)
        self.passed.levels_at.update(more.levels_at)
        for k, r in more.reasons.items():
            self.passed.reasons[k] = r

    def ensure_page(self) -> None:
        """The blocks the HTML page can list, when the analysis was built without page=True: one more pass."""
        if self.page_wanted or not self.scan.n:
            self.page_wanted = True
            return
        moments, priority = page_moments(self.scan)
        extra = Wanted(anatomy=[], page=moments, priority=priority, samples=self.scan.samples)
        # the columns blocks' details show too (their modules: the page lists each module's blocks), from followers
        # of this pass's own
        shown = [p.follow(self.log, self.scan) for p in pass_parts() if p.in_details]
        more = run_pass(self.log, self.scan, extra, rules=self.passed.rules, followers=[f for f in shown if f])
        for name in ("page", "details", "live_at", "levels_at", "reasons"):
            getattr(self.passed, name).update(getattr(more, name))
        self.page_wanted = True

    def snapshot(self, i: int) -> dict[str, np.ndarray]:
        """The blocks live just after event i, as the second pass kept them (one more pass for a moment no pass
        kept)."""
        if int(i) not in self.passed.snapshots:
            self._more([int(i)])
        return self.passed.snapshots[int(i)]

    def anatomy(self, at: str | float | int | None = None, top: int | None = None) -> Anatomy:
        i, label = self.index_at(at)
        if self.scan.n and i not in self.passed.snapshots:
            self._more([i])
        return self._anatomy(i, label, top)

    def _anatomy(self, i: int, label: str, top: int | None) -> Anatomy:
        """The anatomy at moment i, from the blocks the second pass kept live then."""
        if not self.scan.n:
            return Anatomy(label, i, 0.0, 0, 0, [], {}, {})
        snap = self.passed.snapshots[i]
        return anatomy_of(label, i, self.time_s(i), self.allocated_at(i), self.reserved_at(i), snap,
                          self._reasons(snap), self.site, self.phase_name, top)

    def _reasons(self, snap: dict[str, np.ndarray]) -> np.ndarray:
        reason = snap["reason"].copy()
        for j in np.flatnonzero(reason < 0).tolist():
            reason[j] = self.passed.reasons[int(snap["k"][j])]
        return reason

    def live_at_peak(self) -> list[tuple[str, int, str]]:
        """The blocks live at the peak of allocated: (allocation site, block size, category) each."""
        if not self.scan.n:
            return []
        snap = self.passed.snapshots[self.scan.peak_i]  # the peak is an anatomy moment of every pass
        return [(self.site(s).label, int(z), str(CATEGORIES[c])) for s, z, c in
                zip(snap["site"].tolist(), snap["block_size"].tolist(), snap["category"].tolist())]

    # -- the sections (sections.SECTIONS) ----------------------------------------------------------
    def section_rows(self, key: str) -> Any:
        """The rows of the section's part `key` (sections/section.py's Part), built once from its follower."""
        if key not in self._section_rows:
            part = next(p for p in pass_parts() if p.key == key)
            self._section_rows[key] = part.rows(self, self.followers.get(key))
        return self._section_rows[key]

    # Each section's rows by name, for callers of the API (sections/: each module says what its rows are).
    def lifetime_rows(self) -> list[tuple[LifetimeRow, dict[str, Any]]]:
        """The lifetime rows, largest first, each with the details of the block that speaks for it."""
        return list(self.section_rows("lifetimes").rows)

    def lifetimes(self, top: int | None = None) -> list[LifetimeRow]:
        rows = [r for r, _ in self.section_rows("lifetimes").rows]
        return rows[:top] if top else rows

    def explain(self, d: dict[str, Any], phases: list[str] | None = None) -> str:
        """Why the block of details `d` was freed when it was, in words (sections/lifetimes.py's Explain)."""
        return self.section_rows("lifetimes").explain(d, phases)  # type: ignore[no-any-return]

    def phases(self) -> list[PhaseRow]:
        return list(self.section_rows("phases"))

    def estimate(self) -> Estimate:
        return self.section_rows("estimate")  # type: ignore[no-any-return]

    def reserve(self) -> Reserve:
        """Reserved memory split at the peaks, and the replays (run beside the pass)."""
        return self.section_rows("reserve")  # type: ignore[no-any-return]

    def fragmented_samples(self) -> np.ndarray:
        """At the timeline's samples, the free bytes in segments holding live blocks (the page's band)."""
        return self.followers["reserve"].fragmented  # type: ignore[union-attr]

    def modules(self) -> tuple[Modules, list[str]]:
        """Memory by module, and its sentences."""
        return self.section_rows("modules")  # type: ignore[no-any-return]

    def ooms(self, check_alternatives: bool = True) -> list[OomRow]:
        """Each OOM record diagnosed; the last one also replayed under every policy (unless not
        `check_alternatives`: a job's summary names the verdicts only). Computed once."""
        return self.section_rows("ooms").rows(check_alternatives)  # type: ignore[no-any-return]

    # -- all of it -----------------------------------------------------------------------------
    def summary(self) -> Summary:
        """What the report says first (summary.py), computed once for the text, the JSON and the page."""
        if self._summary is None:
            self._summary = summary(self)
        return self._summary

    def marker_labels(self) -> list[str]:
        return list(dict.fromkeys(m[1] for m in self.timeline.markers))[:MARKER_ANATOMIES]

    def to_dict(self, top: int = 50) -> dict[str, Any]:
        return report_dict(self, top, self.marker_labels(), len(self.marker_first()))


def report_dict(a: Any, top: int, markers: Sequence[str], labels: int) -> dict[str, Any]:
    """The report as plain data (what `torchalloc report --json` prints): the headline, the timeline, the
    anatomy at the peak and at each marker in `markers` (the first of the log's `labels` marker labels), then
    every section's JSON."""
    t = a.table
    notes = list(a.notes)
    if labels > len(markers):  # said, as the notes say what else the report lists in part (notes.py)
        notes.append(f"the anatomies at markers are those of the first {len(markers)} of {labels} marker labels "
                     "(--at LABEL gives any other)")
    return {
        "log": t.path,
        "device": a.device,
        "events": len(t),
        "blocks": len(a.blocks),
        "has_stacks": a.has_stacks,
        "backward_detected_from": a.backward_from,
        "notes": notes,
        "peak_allocated": a.timeline.peak_allocated,
        "peak_reserved": a.timeline.peak_reserved,
        "summary": a.summary().to_dict(),
        "timeline": a.timeline.to_dict(),
        "peak_anatomy": a.anatomy("peak", top=top).to_dict() if len(t) else None,
        "markers": [a.anatomy(label, top=top).to_dict() for label in markers],
        **sections_json(a, top),
    }


# ---------------------------------------------------------------------------
# Building it
# ---------------------------------------------------------------------------


def analyze(
    source: str | os.PathLike[str] | bytes,
    *,
    device: int | None = None,
    max_points: int = 1500,
    progress: bool = False,
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
    at: Sequence[str | float] = (),
    page: bool = False,
    followers: Sequence[Follower] = (),
) -> Analysis:
    """The analysis of a log (its path, or its bytes) for one device (default: the one with the most
    allocations), read in pieces of `chunk_records` records. `at`: the moments whose anatomy will be asked for
    besides the peak and the markers; `page`: the HTML page will be drawn. Naming them lets the one second pass
    gather them; a later question about another moment costs one more pass. `followers`: a tool's own followers
    of the second pass (passes/follow.py's hooks; torchalloc.plan's gathers each block's category), fed after
    the sections' in the same pass."""
    log = ChunkedLog(source, chunk_records, check="drop")
    bar = _progress_bar(progress, log)
    times = [float(x.rstrip("s")) if isinstance(x, str) else float(x) for x in at if is_time(x)]
    last = log.last_event_time(device)
    s = scan(log, device, max_points=max_points, last_ns=last, at_times=times, progress=bar)
    if device is None and s.devices and s.device != s.devices[0]:
        s = scan(log, s.devices[0], max_points=max_points, last_ns=last, at_times=times, progress=bar)
    elif device is not None and s.devices and device not in s.devices:
        raise ValueError(f"no events for device {device}; the log has devices {s.devices}")
    if s.samples is None:  # the span of the timeline was not known in advance: a second first pass
        s = scan(log, s.device, max_points=max_points, last_ns=s.last_ns, at_times=times, progress=bar)
    if len(s.orphans["addr"]):  # opened mid-run: a 'log opened' row first (_opening_row), and the first pass again
        log.opening = _opening_row(log, s)
        s = scan(log, s.device, max_points=max_points, last_ns=s.last_ns, at_times=times, progress=bar)
    notes = derive_notes(log, table_notes(log), s)
    backward_from_ = backward_from(log.phase_names, s)
    parts = pass_parts()
    # the moments the report shows, and those the sections' followers need
    a_moments = sorted(set(anatomy_moments(log, s, at)).union(*(p.moments(s) for p in parts)))
    wanted = Wanted(anatomy=a_moments, page=np.zeros(0, dtype=np.int64), priority=set(), samples=s.samples)
    if page and s.n:
        wanted.page, wanted.priority = page_moments(s)
    followers_of = {p.key: p.follow(log, s) for p in parts}  # every section's part of the pass
    passed = run_pass(log, s, wanted, progress=bar,
                      followers=[*(f for f in followers_of.values() if f is not None), *followers])
    if bar is not None:
        bar.close()
    return Analysis(log, s, passed, wanted, notes, backward_from_, max_points, page, followers_of)


# The kind of the row put first in a log opened mid-run (no record has kind 0): the log's opening, the one moment
# every block allocated before the log is live.
LOG_OPENED = 0


def _opening_row(log: ChunkedLog, s: Scan) -> np.ndarray:
    """A row first in a log opened mid-run, as a log record: kind LOG_OPENED, about no device, at time zero of the
    report, so the level before the first record (every block from before the log live) has an index."""
    row = np.zeros(1, dtype=RECORD_DTYPE)
    row["time_ns"] = report_start_ns(log.header.created_monotonic_ns, s.first_ns)
    row["device"] = -1
    row["kind"] = LOG_OPENED
    return row


def _progress_bar(enabled: bool, log: ChunkedLog) -> Any:
    """A callable taking the events read so far, with close(); None when not asked for or without tqdm."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = tqdm(desc="reading the log", unit=" events", leave=False)

    class _Bar:
        def __call__(self, n: int) -> None:
            bar.update(max(0, n - bar.n))

        def close(self) -> None:
            bar.close()

    return _Bar()
