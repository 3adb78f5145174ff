"""The report's sections after the timeline and the anatomy, in order: the one place to add one.

Each `Section` (passes/follow.py) has a key (its name in `--json`), a
title, and `view(a, top)`: what the section shows of an analysis as plain
data (views.py) -- its table (headers, rows of strings, the sentence under
each row), the sentences under the table, and its JSON -- or None when
there is nothing to show. The text report (report/text.py), the HTML page
(report/html.py) and the JSON (`Analysis.to_dict`) loop over SECTIONS;
none of them names a section.

A section whose rows need the second pass is one module holding its
follower of the pass, its `Part` (passes/follow.py), its rows and its
view, and declaring its entries (stream_reserve.SECTIONS,
stream_modules.SECTION): `analyze` makes each part's follower and hands it
to the pass (`pass_parts`). A new one is that module, its sentences in
wording.py, and one line here. The lifetimes, phases, estimate and OOMs,
answered from the pass' own sums and moments by Analysis, have their views
below.
"""
from __future__ import annotations

from typing import Any, Sequence

from ...units import fmt_bytes, fmt_seconds, fmt_time
from ..passes.follow import Part, Section
from ..stream_leaks import SECTION as LEAKS_SECTION
from ..stream_markers import SECTION as MARKERS_SECTION
from ..stream_modules import SECTION as MODULES_SECTION
from ..stream_reserve import SECTIONS as RESERVE_SECTIONS
from ..views import Analyzed, CheckedLine, CheckedList, SectionView, Table


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


SECTIONS: list[Section] = [
    MARKERS_SECTION,  # what each stretch from a marker to the next allocated, freed and kept
    LEAKS_SECTION,  # sites whose live bytes at the step markers gain a low point never given back
    Section("lifetimes", "Lifetimes: per allocation site, why its blocks were freed when they were",
            "With JavaScript, click a site for the stacks of the block its sentence speaks for.", _lifetimes),
    Section("phases", "Phases", "", _phases),
    Section("estimate", "The usual estimate, measured", "", _estimate),
    *RESERVE_SECTIONS,  # reserved memory at the peaks; what each policy would have reserved
    MODULES_SECTION,
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
