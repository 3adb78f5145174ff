"""The analysis of a log: two passes over it in pieces, and one method per section of the report.

    from torchalloc.analysis import analyze
    a = analyze("run.talog", at=["step 100"], page=True)   # moments the report will show, named in advance
    a.anatomy("peak"); a.lifetimes(); a.phases(); a.estimate(); a.reserve(); a.modules(); a.ooms(); a.to_dict()

Every log, of any size, is read the same way: in pieces (log/chunks.py; a
small log is one piece), twice -- a first pass for the facts the second
needs (passes/first.py), a second that classifies each block as it ends and
keeps only sums, and the blocks live at the moments the report shows
(passes/second.py), feeding each section's part of it as it goes
(sections.pass_parts: the segments and the terms of reserved,
stream_reserve.py, every policy's replay fed the events as they are read
on a thread of its own; each block's module, stream_modules.py).
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
  (anatomy.MARKER_ANATOMIES);
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
from .anatomy import MARKER_ANATOMIES, Anatomy, AnatomyRow, bytes_by, dominant, some_labels
from .rules.categorize import CATEGORIES, CATEGORY_CODE, Category
from .rules.classify import REASONS
from .sections.estimate import Estimate
from .rules.frames import Frame
from .lifetimes import LifetimeRow
from .modules import Modules
from .sections.ooms.diagnosis import Blocker, OomRow, blockers_of, handle_for, oom_detail, oom_row, replay_last, segment_gaps
from .reserve import Reserve
from .sections import pass_parts, report_dict
from .sections.phases import PhaseRow
from .rules.roles import phase_role
from .rules.sites import BEFORE_LOG, Site
from .passes.follow import Follower
from .passes.second import Passed, Wanted, run_pass
from .passes.moments import anatomy_moments, is_time, page_moments
from .sections.ooms import trace_until
from .notes import SPANS_KEPT, backward_from, derive_notes, table_notes
from .passes.first import Scan, scan
from .passes.pieces import report_start_ns
from .summary import Summary, summary
from .timeline import Timeline
from .wording import estimate_sentence, oom_explanation, phase_sentence, reason_sentence



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
class StreamTable:
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
    """One device's events explained, a method per section of the report (module docstring). Build with
    `analyze`."""

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
        self.table = StreamTable(log.path, scan_.n, int(header.pid), int(header.rank),
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
        self.timeline = self._timeline()
        self._lifetimes: list[tuple[LifetimeRow, dict[str, Any]]] | None = None
        self._occ_first: dict[int, int] = {}
        self._occ_count: dict[int, int] = {}
        for row, p in enumerate(scan_.occ_phase.tolist()):
            self._occ_first.setdefault(p, row)
            self._occ_count[p] = self._occ_count.get(p, 0) + 1
        self._ooms: list[OomRow] | None = None
        self._ooms_replayed = False
        self._marker_first: dict[str, int] | None = None  # marker text -> its first index (marker_index)
        self._summary: Summary | None = None

    # -- small things ------------------------------------------------------------------------
    def phase_name(self, p: int) -> str:
        if p < 0:
            return BEFORE_LOG.label
        return self.table.phase_names.get(int(p), f"phase {p}")

    def _t(self, time_ns: int) -> float:
        return (int(time_ns) - self.base_ns) / 1e9

    def time_s(self, i: int) -> float:
        if not self.scan.n:
            return 0.0
        return self._t(self._levels(i)[2])

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

    # -- the timeline ----------------------------------------------------------------------------
    def _timeline(self) -> Timeline:
        s = self.scan
        if not s.n:
            z = np.zeros(0)
            return Timeline(z, z.astype(np.int64), z.astype(np.int64), z.astype(np.int64), {}, [], [], 0.0, 0, 0, 0.0,
                            0, [], 0.0)
        t_s = (s.sample_ns - self.base_ns) / 1e9
        by_phase: dict[str, np.ndarray] = {}
        for p in sorted(self.passed.alloc_phases):
            curve = self.passed.by_phase.get(p, np.zeros(len(s.samples), dtype=np.int64))
            name = self.phase_name(p)
            by_phase[name] = by_phase.get(name, 0) + curve
        if self.passed.before_log is not None:
            by_phase[BEFORE_LOG.label] = self.passed.before_log
        spans = [(self.phase_name(int(p)), self._t(b), self._t(e)) for p, b, e in
                 zip(s.occ_phase[:SPANS_KEPT].tolist(), s.occ_begin_ns[:SPANS_KEPT].tolist(),
                     s.occ_end_ns[:SPANS_KEPT].tolist())]
        strings = self.table.strings
        markers = [(self._t(ns), strings.get(label, ""), self.table.phase_names.get(phase, ""))
                   for _, label, phase, ns in s.markers]
        ooms = [(self._t(o["time_ns"]), o["size"]) for o in s.ooms]
        return Timeline(t_s=t_s, index=s.samples, allocated=s.sample_cum + s.initial, reserved=s.sample_raw + s.offset,
                        by_phase=by_phase, phase_spans=spans, markers=markers, peak_t=self._t(s.peak_ns),
                        peak_allocated=s.peak_cum + s.initial, peak_index=s.peak_i,
                        peak_reserved_t=self._t(s.rpeak_ns), peak_reserved=s.rpeak_raw + s.offset, ooms=ooms,
                        duration_s=self._t(s.last_ns))

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
        extra = Wanted(anatomy=list(moments), page=np.zeros(0, dtype=np.int64), priority=set(), ooms=[],
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
        extra = Wanted(anatomy=[], page=moments, priority=priority, ooms=[], samples=self.scan.samples)
        # the columns blocks' details show too (their modules: the page lists each module's blocks), from followers
        # of this pass's own
        shown = [p.follow(self.log, self.scan) for p in pass_parts() if p.in_details]
        more = run_pass(self.log, self.scan, extra, rules=self.passed.rules, followers=[f for f in shown if f])
        for name in ("page", "details", "live_at", "levels_at", "reasons"):
            getattr(self.passed, name).update(getattr(more, name))
        self.page_wanted = True

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
        reason = self._reasons(snap)
        # one row per (site, phase, reason, category)
        groups: dict[tuple[int, int, int, int], list[int]] = {}
        for j, key in enumerate(zip(snap["site"].tolist(), snap["phase"].tolist(), reason.tolist(),
                                    snap["category"].tolist())):
            groups.setdefault(key, []).append(j)
        rows = []
        for (s_, p, _r, _g), members in groups.items():
            m = np.array(members)
            size = snap["block_size"][m]
            cat = dominant(snap["category"][m], size, CATEGORIES)
            why = dominant(reason[m], size, REASONS)
            site = self.site(s_)
            rows.append(AnatomyRow(site.label, site.location, self.phase_name(p), str(cat), str(why), int(m.size),
                                   int(size.sum()), int(snap["size"][m].sum())))
        rows.sort(key=lambda r: (-r.bytes, r.site))
        by_cat = bytes_by(snap["category"], snap["block_size"], CATEGORIES)
        by_phase: dict[str, int] = {}
        for p, sz in zip(snap["phase"].tolist(), snap["block_size"].tolist()):
            name = self.phase_name(p)
            by_phase[name] = by_phase.get(name, 0) + sz
        return Anatomy(label, i, self.time_s(i), self.allocated_at(i), self.reserved_at(i), rows[:top] if top else rows,
                       by_cat, dict(sorted(by_phase.items(), key=lambda kv: -kv[1])))

    def _reasons(self, snap: dict[str, np.ndarray]) -> np.ndarray:
        reason = snap["reason"].copy()
        for j in np.flatnonzero(reason < 0).tolist():
            reason[j] = self.passed.reasons[int(snap["k"][j])]
        return reason

    # -- lifetimes ---------------------------------------------------------------------------
    def explain(self, d: dict[str, Any], phases: list[str] | None = None) -> str:
        """Why the block of details `d` was freed when it was (wording.reason_sentence, with its names); with
        `phases`, for a lifetime row: the phases its blocks were allocated in."""
        site = self.site(d["site"]).label
        free_site = self.site(d["free_site"]).label if d["free_site"] >= 0 else None
        fn = self.passed.rules.functions[d["returned"]] if d["returned"] >= 0 else None
        phase = self.phase_name(d["phase"])
        free_phase = self.phase_name(d["free_phase"]) if d["free_phase"] >= 0 else ""
        first, count = self._occ_first.get(d["phase"], -1), self._occ_count.get(d["phase"], 0)
        if count > 1 and d["occ"] == first:
            phase = f"the first occurrence of {phase}"
        text = reason_sentence(REASONS[d["reason"]], CATEGORIES[d["category"]], site, free_site, fn, phase, free_phase,
                               bool(d["rerun"]), self.has_stacks)
        if phases is None or len(phases) == 1:
            return text
        return text.replace(f"in {self.phase_name(d['phase'])}", f"in {', '.join(phases)}")

    def lifetime_rows(self) -> list[tuple[LifetimeRow, dict[str, Any]]]:
        """The lifetime rows (sections/lifetimes.py's, their sites in the report's order), largest first, each with
        the details of the block that speaks for it."""
        if self._lifetimes is None:
            canonical = []
            for key, g in self.passed.groups.items():
                site, reason, free_site, returned, rerun, cat = key
                ckey = (int(self.site_map[site]), reason, int(self.site_map[free_site]) if free_site >= 0 else -1,
                        int(self.fn_map[returned]) if returned >= 0 else -1, rerun, cat)
                canonical.append((ckey, key, g))
            canonical.sort(key=lambda x: x[0])
            rows = []
            for _, (site, reason, free_site, _ret, _rerun, cat), g in canonical:
                phases = sorted({self.phase_name(p) for p in g.phases})
                typical = -1.0 if g.persistent or g.negative else g.lives.median_s()
                s_ = self.site(site)
                rows.append((LifetimeRow(
                    site=s_.label, location=s_.location, reason=str(REASONS[reason]), category=str(CATEGORIES[cat]),
                    phases=phases, count=g.count, bytes=g.bytes, largest=g.largest, typical_lifetime_s=typical,
                    free_site=self.site(free_site).label if free_site >= 0 else None,
                    explanation=self.explain(g.rep, phases)), g.rep))
            rows.sort(key=lambda rr: (-rr[0].bytes, rr[0].site, rr[0].reason))
            self._lifetimes = rows
        return self._lifetimes

    def lifetimes(self, top: int | None = None) -> list[LifetimeRow]:
        rows = [r for r, _ in self.lifetime_rows()]
        return rows[:top] if top else rows

    # -- phases, the estimate ------------------------------------------------------------------
    def _parameters(self) -> int:
        """The parameters' bytes the phase sentences compare with: those live at the end, else their peak."""
        return int(self.passed.persistent_total[CATEGORY_CODE[Category.PARAMETERS]]) or self.passed.term_peak["parameters"]

    def phases(self) -> list[PhaseRow]:
        s, p_ = self.scan, self.passed
        ids = sorted(set(p_.alloc_phases) | set(s.occ_phase.tolist()) | set(s.segment_phases))
        occurrences = {p: int(c) for p, c in zip(*np.unique(s.occ_phase, return_counts=True))} if s.occ_phase.size else {}
        params = self._parameters()
        rows = []
        for p in ids:
            name = self.phase_name(p)
            allocated, count = p_.allocated.get(p, [0, 0])
            freed, freed_count = p_.freed.get(p, [0, 0])
            by_cat = p_.persistent_cat.get(p)
            cats = {}
            if by_cat is not None:
                cats = {str(CATEGORIES[k]): int(v) for k, v in enumerate(by_cat.tolist()) if v}
                cats = dict(sorted(cats.items(), key=lambda kv: -kv[1]))
            handed_to = p_.handed_to.get(p, {})
            handed = dict((k, v[0]) for k, v in sorted(handed_to.items(), key=lambda kv: (-kv[1][0], kv[1][1])))
            peak = s.phase_peak.get(p)
            row = PhaseRow(
                phase=name, role=phase_role(name), occurrences=occurrences.get(p, 0), allocated=allocated,
                allocated_count=count, freed=freed, freed_count=freed_count,
                peak=peak + s.initial if peak is not None else 0, peak_over_start=s.phase_rise.get(p, 0),
                reserved_growth=s.phase_growth.get(p, 0), persistent=p_.persistent.get(p, 0),
                handed_on=p_.handed.get(p, 0), transient=p_.transient.get(p, 0), persistent_by_category=cats,
                handed_on_to=handed, first_occurrence_persistent=p_.first_occ_persistent.get(p, 0), sentence="")
            row.sentence = phase_sentence(row, params)
            rows.append(row)
        return rows

    def estimate(self) -> Estimate:
        t = self.passed.term_peak
        P, G, O, I, A = (t["parameters"], t["gradients"], t["optimizer_state"], t["optimizer_intermediates"],
                         t["activations"])
        GI = t["gradients_plus_intermediates"]
        at_peak = self.anatomy("peak").by_category if self.scan.n else {}
        est = Estimate(P, G, O, I, A, GI, t["temporaries"], t["workspace"], t["other"], P + O + max(GI, A),
                       self.timeline.peak_allocated, at_peak, "")
        est.sentence = estimate_sentence(est)
        return est

    # -- OOMs ----------------------------------------------------------------------------------
    def ooms(self, check_alternatives: bool = True) -> list[OomRow]:
        """Each OOM record diagnosed; the last one also replayed under every policy (unless not
        `check_alternatives`: a job's summary names the verdicts only). Computed once."""
        if self._ooms is None:
            self._ooms = [self._oom(o) for o in self.scan.ooms]
            for row in self._ooms:
                row.explanation = oom_explanation(row)
        if check_alternatives and self._ooms and not self._ooms_replayed:
            last = self._ooms[-1]
            replay_last(last, lambda: trace_until(self.log, self.scan, self.table.path, last.index))
            last.explanation = oom_explanation(last)
            self._ooms_replayed = True
        return self._ooms

    def live_at_peak(self) -> list[tuple[str, int, str]]:
        """The blocks live at the peak of allocated: (allocation site, block size, category) each."""
        if not self.scan.n:
            return []
        snap = self.passed.snapshots[self.scan.peak_i]  # the peak is an anatomy moment of every pass
        return [(self.site(s).label, int(z), str(CATEGORIES[c])) for s, z, c in
                zip(snap["site"].tolist(), snap["block_size"].tolist(), snap["category"].tolist())]

    def _oom(self, o: dict[str, Any]) -> OomRow:
        i = int(o["index"])
        if i not in self.passed.snapshots:
            self._more([i])
        snap = self.passed.snapshots[i]
        segs = self.passed.segments.get(i, {})
        largest, nseg, by_segment = segment_gaps(segs, np.arange(len(snap["k"])), snap["addr"], snap["block_size"])
        reserved = o["block_size"] or self.reserved_at(i)
        dev = o["device"]
        facts = None if dev is None else (dev["addr"], dev["size"], dev["stream"], dev["flags"])
        now = o["time_ns"]

        def blocker(j: int) -> Blocker:
            site = self.site(int(snap["site"][j]))
            age = (now - int(snap["alloc_t"][j])) / 1e9 if snap["phase"][j] >= 0 else -1.0
            return Blocker(int(snap["addr"][j]), int(snap["block_size"][j]), site.label, site.location,
                           self.phase_name(int(snap["phase"][j])), age)

        order = np.argsort(snap["k"], kind="stable")  # the snapshot is in blocks order already

        def pick(fragmentation: bool) -> list[Blocker]:
            return blockers_of(order.tolist(), by_segment if fragmentation else None,
                               lambda j: (-int(snap["block_size"][j]), int(snap["addr"][j])), blocker)

        policy, expandable = o["policy"], o["expandable"]

        def detail() -> dict[str, object]:
            return oom_detail(segs, snap["addr"], snap["block_size"], snap["phase"], o["phase"], policy, expandable,
                              handle_for(o["size"], dev["handle"] if dev is not None else 0))

        return oom_row(self._t(now), i, o["size"], o["stream"], self.phase_name(o["phase"]),
                       self.table.stack_of(o["stack"]), reserved, self.allocated_at(i), largest, nseg, o["addr"], facts,
                       self.has_stacks, pick, policy, expandable, detail, self.table.phase_names)

    # -- the sections fed by the pass (sections.pass_parts) ---------------------------------------
    def section_rows(self, key: str) -> Any:
        """The rows of the part `key` of the pass (follow.Part), built once from its follower."""
        if key not in self._section_rows:
            part = next(p for p in pass_parts() if p.key == key)
            self._section_rows[key] = part.rows(self, self.followers.get(key))
        return self._section_rows[key]

    def reserve(self) -> Reserve:
        """Reserved memory split at the peaks, and the replays (run beside the pass; stream_reserve.py)."""
        return self.section_rows("reserve")  # type: ignore[no-any-return]

    def modules(self) -> tuple[Modules, list[str]]:
        """Memory by module, and its sentences (stream_modules.py)."""
        return self.section_rows("modules")  # type: ignore[no-any-return]

    def fragmented_samples(self) -> np.ndarray:
        """At the timeline's samples, the free bytes in segments holding live blocks (the page's band)."""
        return self.followers["reserve"].fragmented  # type: ignore[union-attr]

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
) -> Analysis:
    """The analysis of a log (its path, or its bytes) for one device (default: the one with the most
    allocations), read in pieces of `chunk_records` records. `at`: the moments whose anatomy will be asked for
    besides the peak and the markers; `page`: the HTML page will be drawn. Naming them lets the one second pass
    gather them; a later question about another moment costs one more pass."""
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
    a_moments = anatomy_moments(log, s, at)
    wanted = Wanted(anatomy=a_moments, page=np.zeros(0, dtype=np.int64), priority=set(),
                    ooms=[int(o["index"]) for o in s.ooms], samples=s.samples)
    if page and s.n:
        wanted.page, wanted.priority = page_moments(s)
    followers = {p.key: p.follow(log, s) for p in pass_parts()}  # every section's part of the pass
    passed = run_pass(log, s, wanted, progress=bar, followers=[f for f in followers.values() if f is not None])
    if bar is not None:
        bar.close()
    return Analysis(log, s, passed, wanted, notes, backward_from_, max_points, page, followers)


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
