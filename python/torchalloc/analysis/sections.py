"""The report's sections after the timeline and the anatomy, in order: the one place to add one.

Each `Section` has a key (its name in `--json`), a title, and `view(a, top)`:
what the section shows of an analysis as plain data -- its table (headers,
rows of strings, the sentence under each row), the sentences under the
table, and its JSON -- or None when there is nothing to show. The text
report (report/text.py), the HTML page (report/html.py) and the JSON
(`Analysis.to_dict`) loop over SECTIONS; none of them names a section.

A section whose rows need the second pass names its `part`
(stream_follow.Part, declared once in the section's module, as
stream_reserve.RESERVE and stream_modules.MODULES are): `analyze` makes
each part's follower and hands it to the pass (`pass_parts`), and its view
reads the rows with `a.section_rows(key)`. A new such section is that one
module (its follower, its rows), its sentences in wording.py, and an entry
here; the lifetimes, phases and estimate come from the pass' own sums.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

from ..units import fmt_bytes, fmt_seconds, fmt_time
from .estimate import Estimate
from .lifetimes import LifetimeRow
from .modules import Modules
from .ooms import OomRow
from .phase_summary import PhaseRow
from .reserve import Reserve
from .stream_follow import Part
from .stream_modules import MODULES
from .stream_reserve import RESERVE
from .wording import pinned_lines, replay_note, setting_of, what_words


class Analyzed(Protocol):
    """What a section reads of an analysis (result.Analysis answers it)."""

    def lifetimes(self, top: int | None = None) -> list[LifetimeRow]: ...
    def phases(self) -> list[PhaseRow]: ...
    def estimate(self) -> Estimate: ...
    def reserve(self) -> Reserve: ...
    def modules(self) -> tuple[Modules, list[str]]: ...
    def ooms(self) -> list[OomRow]: ...
    def section_rows(self, key: str) -> Any: ...  # the rows of a section's part of the pass (stream_follow.Part)


@dataclasses.dataclass
class Table:
    headers: Sequence[str]
    rows: list[Sequence[str]]  # cells as shown
    right: Sequence[int] = ()  # columns aligned right (numbers)
    css: str = ""  # the HTML table's class
    row_notes: list[list[str]] = dataclasses.field(default_factory=list)  # lines under each row (may be empty)
    more: str = ""  # what the rows leave out, when they were cut
    row_key: str = ""  # HTML: the first cell of row k gets the attribute row_key=k (the page's script uses it)
    row_titles: list[str] = dataclasses.field(default_factory=list)  # HTML: the first cell's hover text per row


@dataclasses.dataclass
class CheckedLine:
    """A numbered statement (a line of advice, say) and what checked it."""
    number: int
    text: str
    check: str
    status: str  # "confirmed", "refuted" or "unchecked"


@dataclasses.dataclass
class CheckedList:
    title: str
    lines: list[CheckedLine]
    css: str = ""  # the HTML list's class


@dataclasses.dataclass
class SectionView:
    table: Table | None
    sentences: list[str]
    json: Any
    lists: list[CheckedList] = dataclasses.field(default_factory=list)  # under the sentences


@dataclasses.dataclass(frozen=True)
class Section:
    key: str  # its name in the JSON
    title: str
    intro: str  # a line under the title in the HTML page ("" for none)
    view: Callable[[Analyzed, int], SectionView | None]  # (analysis, rows to show) -> what to show, or None
    part: Part | None = None  # its part of the second pass, when its rows need one (module docstring)


def _lifetimes(a: Analyzed, top: int) -> SectionView:
    rows = a.lifetimes()
    shown = rows[:top]
    cells = [(r.site, r.reason, r.category, str(r.count), fmt_bytes(r.bytes),
              fmt_seconds(r.typical_lifetime_s) if r.typical_lifetime_s >= 0 else "until the end", ", ".join(r.phases))
             for r in shown]
    more = (f"... {len(rows) - top} more (site, reason) groups, {fmt_bytes(sum(r.bytes for r in rows[top:]))}"
            if len(rows) > top else "")
    table = Table(["allocated at", "reason", "category", "blocks", "bytes", "typical lifetime", "phases"], cells,
                  right=(3, 4, 5), css="lifetimes", row_notes=[[r.explanation] for r in shown], more=more,
                  row_key="data-lifetime", row_titles=[r.location for r in shown])
    return SectionView(table, [], [r.to_dict() for r in a.lifetimes(top=top)])


def _phases(a: Analyzed, top: int) -> SectionView | None:
    phases = a.phases()
    if not phases:
        return None
    table = Table(["phase", "occurrences", "allocated", "freed", "peak", "reserved growth", "persistent", "handed on",
                   "transient"], [tuple(str(c) for c in p.cells()) for p in phases], right=range(1, 9), css="phases")
    return SectionView(table, [p.sentence for p in phases], [p.to_dict() for p in phases])


def _estimate(a: Analyzed, top: int) -> SectionView:
    est = a.estimate()
    table = Table(["term (peak live bytes)", "bytes"], [(term, fmt_bytes(n)) for term, n in est.rows()], right=(1,),
                  css="estimate")
    return SectionView(table, [est.sentence], est.to_dict())


def _ooms(a: Analyzed, top: int) -> SectionView | None:
    ooms = a.ooms()
    if not ooms:
        return None
    cells, notes = [], []
    for o in ooms:
        cells.append((fmt_time(o.t_s), o.phase, o.site, fmt_bytes(o.requested), fmt_bytes(o.allocated),
                      fmt_bytes(o.reserved), fmt_bytes(o.largest_free_range), o.verdict))
        device = (f"device {fmt_bytes(o.device_total)}, {fmt_bytes(o.device_free)} free; "
                  if o.device_total is not None else "")
        lines = [f"{device}verdict from {o.verdict_from}: {o.explanation}"]
        for blocker in o.blockers:
            age = fmt_seconds(blocker.age_s) if blocker.age_s >= 0 else "before the log"
            lines.append(f"  {fmt_bytes(blocker.size):>10}  {blocker.site}  phase {blocker.phase}, age {age}")
        notes.append(lines)
    table = Table(["time", "phase", "at", "asked", "allocated", "reserved", "largest free range", "verdict"], cells,
                  right=(3, 4, 5, 6), css="ooms", row_notes=notes)
    lists = [CheckedList(f"Advice for OOM {k + 1}, each line checked by replaying the run up to it",
                         [CheckedLine(int(line.number), line.text, line.check,
                                      "unchecked" if line.confirmed is None else "confirmed" if line.confirmed
                                      else "refuted") for line in o.advice], css="advice")
             for k, o in enumerate(ooms) if o.advice]
    return SectionView(table, [], [o.to_dict() for o in ooms], lists)


def _reserve(a: Analyzed, top: int) -> SectionView | None:
    r = a.reserve()
    if not r.moments:
        return None
    optional = [(key, head) for key, head in (("mapped_free", "mapped free (expandable)"),
                                              ("before_log", "before the log"))
                if any(getattr(m, key) for m in r.moments)]
    headers = ["at", "reserved", "allocated", "fragmentation (free in segments with live blocks)",
               "cache (wholly free segments)", *[head for _, head in optional]]
    cells = [(m.at, fmt_bytes(m.reserved), fmt_bytes(m.allocated), fmt_bytes(m.fragmented), fmt_bytes(m.cached),
              *[fmt_bytes(getattr(m, key)) for key, _ in optional]) for m in r.moments]
    notes = [[line for p in m.pinned for line in pinned_lines(p)] for m in r.moments]
    table = Table(headers, cells, right=range(1, len(headers)), css="reserve", row_notes=notes)
    moments = [s for s in r.sentences if s.startswith("At the ")]
    return SectionView(table, moments, {"moments": [m.to_dict() for m in r.moments], "unknown": list(r.unknown)})


def _reserve_replays(a: Analyzed, top: int) -> SectionView | None:
    r = a.reserve()
    if not r.replays:
        return None
    base = r.replays[0]
    cells = [(x.policy, setting_of(x.policy), fmt_bytes(x.peak_reserved), fmt_bytes(x.peak_allocated),
              replay_note(x, base)) for x in r.replays]
    table = Table(["policy", "TORCHALLOC_CONF", "peak reserved", "peak allocated", ""], cells, right=(2, 3),
                  css="reserve-replays")
    best = r.best
    return SectionView(table, [s for s in r.sentences if not s.startswith("At the ")],
                       {"recording_policy": r.recording_policy, "replays": [x.to_dict() for x in r.replays],
                        "best": best.policy if best else None})


def _modules(a: Analyzed, top: int) -> SectionView | None:
    m, sentences = a.modules()
    if not m.rows:
        return None
    phases = list(m.phase_peaks)
    shown = m.rows[:top]
    cells = [(r.module, fmt_bytes(r.at_peak), str(r.blocks_at_peak),
              *[fmt_bytes(r.by_phase.get(p, 0)) for p in phases]) for r in shown]
    more = (f"... {len(m.rows) - top} more modules, {fmt_bytes(sum(r.at_peak for r in m.rows[top:]))} at the peak"
            if len(m.rows) > top else "")
    table = Table(["module", "at the peak", "blocks", *[f"at {p}'s peak" for p in phases]], cells,
                  right=range(1, 3 + len(phases)), css="modules", row_notes=[[what_words(r.what_at_peak)] for r in shown],
                  more=more, row_key="data-module")
    return SectionView(table, sentences, {"phase_peaks": m.phase_peaks, "tags_unmatched": m.tags_unmatched,
                                          "modules": [r.to_dict() for r in m.rows]})


SECTIONS: list[Section] = [
    Section("lifetimes", "Lifetimes: per allocation site, why its blocks were freed when they were",
            "With JavaScript, click a site for the stacks of the block its sentence speaks for.", _lifetimes),
    Section("phases", "Phases", "", _phases),
    Section("estimate", "The usual estimate, measured", "", _estimate),
    Section("reserve", "Reserved memory: allocated, fragmentation and cache",
            "Reserved = allocated + free bytes in segments that hold live blocks + segments with no live block; "
            "under each moment, the segments with the most free bytes that live blocks pin.", _reserve, RESERVE),
    Section("reserve_replays", "What each policy would have reserved on the same events",
            "The whole run replayed on the simulated device with no memory limit.", _reserve_replays, RESERVE),
    Section("modules", "Memory by module",
            "The bytes each nn.Module's blocks hold (torchalloc.track): what was allocated inside its forward or "
            "backward, and its parameters, their gradients and optimizer state. With JavaScript, click a module "
            "for its blocks at the peak.", _modules, MODULES),
    Section("ooms", "Out of memory", "", _ooms),
]


def pass_parts() -> list[Part]:
    """The sections' parts of the second pass, each once, in SECTIONS' order (the order the pass feeds them)."""
    return list({id(s.part): s.part for s in SECTIONS if s.part is not None}.values())


def sections_json(a: Analyzed, top: int) -> dict[str, Any]:
    """Every section's JSON under its key (an empty list for a section with nothing to show)."""
    out: dict[str, Any] = {}
    for section in SECTIONS:
        view = section.view(a, top)
        out[section.key] = view.json if view is not None else []
    return out


def report_dict(a: Any, top: int, markers: Sequence[str], labels: int) -> dict[str, Any]:
    """The report as plain data (what `torchalloc report --json` prints): the headline, the timeline, the
    anatomy at the peak and at each marker in `markers` (the first of the log's `labels` marker labels), then
    every section's JSON."""
    t = a.table
    notes = list(a.notes)
    if labels > len(markers):  # said, as the notes say what else the report lists in part (stream_notes.py)
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
        "timeline": a.timeline.to_dict(),
        "peak_anatomy": a.anatomy("peak", top=top).to_dict() if len(t) else None,
        "markers": [a.anatomy(label, top=top).to_dict() for label in markers],
        **sections_json(a, top),
    }
