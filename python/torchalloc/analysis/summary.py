"""The report's summary: what a reader needs first, computed once from the analysis, for every output.

`summary(a)` reads the sections' rows (the peak anatomy, the reserve split
and the replays, the marker stretches, the OOMs) and gives a `Summary`:

- `peak`: `Peak` -- allocated and reserved at their peaks, when (seconds
  since the log opened) and in which phase (the phase occurrence running
  then; "" outside every phase);
- `reserve`: `ReserveSplit` -- reserved at the peak allocated split into
  allocated, fragmentation (free bytes in segments holding live blocks),
  cache (wholly free segments) and the rarer terms; None without segment
  records;
- `live`: `LiveReason`s -- the top reasons memory was live at the peak: the
  peak anatomy's largest rows, those with a Python source line first (a row
  whose site is "(no Python stack)" says less), at most TOP_REASONS;
- `leaks`: `Leak`s (sections/leaks.py's rows) -- the sites whose live bytes
  at the step markers gained a low point never given back, the largest
  growth per step first, at most LEAKS_SHOWN; `leak_count`: how
  many in all; `leak_check`: `LeakCheck` -- the step markers the rule had
  (a run with fewer than it needs is said to be one) and the sites that
  grew, then stayed (not leaks);
- `markers`: `MarkerLine`s -- one per kind of marker (labels that differ
  only in their numbers, "step 1" ... "step 6", are one kind, shown by its
  first): what was live at it, what the stretch after it freed and kept
  (sections/markers.py's rows), at most MARKER_KINDS;
- `change`: `Change` -- the change proposed first (first_change): the
  replay that reserves the least of those that keep a cache and never
  synchronize, a costly one only when none of those saves memory (its cost
  said), and a costly one that saves more after it; None when none would;
- `oom`: `OomLine` -- the last OOM's verdict and its first line of advice;
  None without an OOM.

Figures are bytes and seconds; the text report (report/text.py) and the
page format them, `to_dict` is what `--json` prints under "summary".
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from ..units import fmt_bytes
from .rules.sites import BEFORE_LOG, NO_PYTHON, NO_STACKS
from .sections.leaks import LEAKS, Leak, Leaks, Settled, marker_kind, too_few
from .sections.markers import MARKERS, Stretches, StretchGroup
from .sections.reserve.rows import Reserve, ReplayRow, setting_of

TOP_REASONS = 3
LEAKS_SHOWN = 2
MARKER_KINDS = 8


@dataclasses.dataclass
class Peak:
    allocated: int
    allocated_t_s: float
    allocated_phase: str
    reserved: int
    reserved_t_s: float
    reserved_phase: str
    at_least: bool  # the log began mid-run: the blocks from before it may have been more


@dataclasses.dataclass
class ReserveSplit:
    reserved: int
    allocated: int
    fragmentation: int
    cache: int
    mapped_free: int  # free granules of expandable segments
    before_log: int  # free in segments made before the log began


@dataclasses.dataclass
class LiveReason:
    bytes: int
    count: int
    reason: str
    category: str
    phase: str  # the phase that allocated them
    site: str  # their allocation site ("modeling_llama.py:175 forward")
    has_line: bool  # the site is a Python source line


@dataclasses.dataclass
class MarkerLine:
    label: str  # the first marker of its kind
    kind_count: int  # markers of its kind ("step N": one per step)
    t_s: float
    live: int  # allocated at the marker
    freed: int  # by the stretch after it, up to the next marker
    kept: int  # allocated by that stretch and still live when it ended
    until: str | None  # the next marker's label; None: the end of the log
    freed_top: StretchGroup | None  # the largest group it freed (one with a Python source line first)
    kept_top: StretchGroup | None  # the largest group it kept


def cost_of(row: ReplayRow) -> str:
    """What a replayed policy costs besides memory ("" for none): exact keeps no cache, compact synchronizes."""
    if row.policy == "exact":
        return "no cache: every request asks the device"
    if row.synchronizes or row.policy.endswith("+compact"):  # compact synchronizes whenever it compacts
        n = row.synchronizes
        return (f"it synchronizes the device to compact, each time waiting for the GPU: {n} time{'s' if n != 1 else ''} "
                "in the replay")
    return ""


@dataclasses.dataclass
class Change:
    """The change the summary proposes first: the replay that reserves the least of those that keep a cache and
    never synchronize; a costly one (exact, +compact) only when nothing else saves memory, its cost said. When a
    costly one saves more, it is named after, with its cost (`least_*`)."""
    policy: str  # the replay policy ("caching+reclaim")
    setting: str  # its TORCHALLOC_CONF ("policy:caching,expandable:3")
    reserves: int  # its peak reserved on the same events
    saves: int  # less than the recording policy's replay
    cost: str  # "" when it keeps a cache and never synchronizes; else what it costs (cost_of)
    least_policy: str | None  # a costly replay that saves more, when there is one
    least_setting: str | None
    least_reserves: int | None
    least_saves: int | None
    least_cost: str | None

    def words(self, setting: Callable[[str], str] = lambda t: t, saved: Callable[[str], str] = lambda t: t) -> str:
        """'TORCHALLOC_CONF=policy:caching,expandable:3 reserves 1.2 GiB, 7.0 MiB less; saving more costs time:
        TORCHALLOC_CONF=policy:exact reserves ..., ... less (no cache: every request asks the device)'. `setting`
        and `saved` dress the TORCHALLOC_CONF=... and the '... less' parts (the page marks them up)."""
        text = f"{setting('TORCHALLOC_CONF=' + self.setting)} reserves {fmt_bytes(self.reserves)}, " \
               f"{saved(fmt_bytes(self.saves) + ' less')}"
        if self.cost:
            text += f" ({self.cost}; nothing that keeps a cache and never synchronizes saves memory here)"
        if self.least_setting is not None and self.least_reserves is not None and self.least_saves is not None:
            text += (f"; saving more costs time: {setting('TORCHALLOC_CONF=' + self.least_setting)} reserves "
                     f"{fmt_bytes(self.least_reserves)}, {fmt_bytes(self.least_saves)} less ({self.least_cost})")
        return text


def first_change(r: Reserve) -> Change | None:
    """The change the summary proposes (Change), from the replays of the reserve section; None when no replay
    reserves less than the recording policy's."""
    if not r.replays:
        return None
    base = r.replays[0]
    saving = [x for x in r.replays if not x.recording and not x.oom and x.peak_reserved < base.peak_reserved]
    if not saving:
        return None
    # Never synchronizes and keeps a cache, else keeps a cache (compact: synchronizes), else none (exact).
    free = [x for x in saving if not cost_of(x)]
    cached = [x for x in saving if x.policy != "exact"]
    chosen = min(free or cached or saving, key=ReplayRow.rank)
    least = min(saving, key=ReplayRow.rank)
    more = least if least.peak_reserved < chosen.peak_reserved else None
    return Change(chosen.policy, setting_of(chosen.policy), chosen.peak_reserved,
                  base.peak_reserved - chosen.peak_reserved, cost_of(chosen),
                  more.policy if more else None, setting_of(more.policy) if more else None,
                  more.peak_reserved if more else None, base.peak_reserved - more.peak_reserved if more else None,
                  cost_of(more) if more else None)


@dataclasses.dataclass
class OomLine:
    count: int  # OOMs in the log (the line is of the last one)
    t_s: float
    requested: int
    verdict: str
    explanation: str
    advice: str | None  # its first line of advice
    advice_check: str | None  # what checked it ("confirmed: ...")


@dataclasses.dataclass
class LeakCheck:
    step_markers: int  # the step markers followed (0: none, no leak looked for)
    kind: str  # their first label
    enough: bool  # as many as the rule needs (leaks.MIN_STEPS)
    settled: list[Settled]  # sites that grew, then stayed: no leaks

    def too_few(self) -> str | None:
        """What is said when the step markers were too few for the rule; None otherwise."""
        return too_few(self.step_markers, self.kind) if self.step_markers and not self.enough else None


@dataclasses.dataclass
class Summary:
    peak: Peak
    reserve: ReserveSplit | None
    live: list[LiveReason]
    leaks: list[Leak]
    leak_count: int  # sites flagged in all (leaks: the first LEAKS_SHOWN)
    leak_check: LeakCheck
    markers: list[MarkerLine]
    marker_kinds: int  # kinds of markers in the followed ones (markers: the first MARKER_KINDS)
    change: Change | None
    oom: OomLine | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _phase_at(a: Any, i: int) -> str:
    """The phase whose occurrence was running at event i (the innermost: the last begun); "" outside phases."""
    s = a.scan
    running = np.flatnonzero((s.occ_begin <= i) & (s.occ_end > i))
    return a.phase_name(int(s.occ_phase[running[-1]])) if running.size else ""


def _markers(stretches: Stretches) -> tuple[list[MarkerLine], int]:
    first: dict[str, MarkerLine] = {}
    for r in stretches.rows:
        line = first.get(marker_kind(r.label))
        if line is not None:
            line.kind_count += 1
            continue
        first[marker_kind(r.label)] = MarkerLine(r.label, 1, r.t_s, r.live, r.freed, r.kept, r.until,
                                                 r.freed_groups[0] if r.freed_groups else None,
                                                 r.kept_groups[0] if r.kept_groups else None)
    lines = list(first.values())
    return lines[:MARKER_KINDS], len(lines)


def summary(a: Any) -> Summary:
    """The summary of the analysis `a` (front.Analysis; module docstring)."""
    tl, s = a.timeline, a.scan
    n = bool(s.n)
    peak = Peak(tl.peak_allocated, tl.peak_t, _phase_at(a, s.peak_i) if n else "", tl.peak_reserved,
                tl.peak_reserved_t, _phase_at(a, s.rpeak_i) if n else "", bool(a.blocks.before_log))
    r = a.reserve()
    at_peak = next((m for m in r.moments if m.at == "peak allocated"), None)
    split = None if at_peak is None else ReserveSplit(at_peak.reserved, at_peak.allocated, at_peak.fragmented,
                                                      at_peak.cached, at_peak.mapped_free, at_peak.before_log)
    stand_ins = {x.label for x in (NO_PYTHON, BEFORE_LOG, NO_STACKS)}
    live = [LiveReason(x.bytes, x.count, x.reason, x.category, x.phase, x.site, x.site not in stand_ins)
            for x in (a.anatomy("peak").rows if n else [])]
    live.sort(key=lambda x: (not x.has_line, -x.bytes))  # stable: the anatomy's order among equals
    leaks: Leaks = a.section_rows(LEAKS.key)
    markers, kinds = _markers(a.section_rows(MARKERS.key))
    change = first_change(r)
    ooms = a.ooms()
    oom = None
    if ooms:
        o = ooms[-1]
        first = o.advice[0] if o.advice else None
        oom = OomLine(len(ooms), o.t_s, o.requested, o.verdict, o.explanation, first.text if first else None,
                      first.check if first else None)
    return Summary(peak, split, live[:TOP_REASONS], leaks.rows[:LEAKS_SHOWN], len(leaks.rows),
                   LeakCheck(leaks.step_markers, leaks.kind, leaks.enough(), leaks.settled), markers, kinds, change,
                   oom)
