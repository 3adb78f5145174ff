"""The report's sections after the timeline and the anatomy, in order: the one place to add one.

Each section is one module here (or a small package: reserve/, ooms/)
holding its follower of the second pass, its rows, their words and its
view, and declaring its `Part` and its `Section` entry (section.py). Each
entry has a key (its name in `--json`), a title, and `view(a, top)`: what
the section shows of an analysis as plain data (views.py) -- its table
(headers, rows of strings, the sentence under each row), the sentences
under the table, and its JSON -- or None when there is nothing to show.

SECTIONS lists the entries in the report's order. `analyze` (front.py)
makes the follower of each Part (`pass_parts`) and hands them to the
second pass; `Analysis.section_rows(key)` builds a Part's rows once. The
text report (report/text.py), the HTML page (report/html.py) and the
JSON (`Analysis.to_dict`) loop over SECTIONS; none of them, nor the pass,
nor `Analysis`, names a section. A new section is its module and one line
here.
"""
from __future__ import annotations

from typing import Any

from . import estimate, leaks, lifetimes, markers, modules, ooms, phases, reserve
from .section import Part, Section
from .views import Analyzed

SECTIONS: list[Section] = [
    markers.SECTION,  # what each stretch from a marker to the next allocated, freed and kept
    leaks.SECTION,  # sites whose live bytes at the step markers gain a low point never given back
    lifetimes.SECTION,  # per allocation site and reason: how many blocks, how many bytes, how long they lived
    phases.SECTION,  # per phase: allocated, freed, and what stayed, was handed on or was transient
    estimate.SECTION,  # the usual estimate's terms, measured
    *reserve.SECTIONS,  # reserved memory at the peaks; what each policy would have reserved
    modules.SECTION,  # memory by module
    ooms.SECTION,  # each OOM: the verdict, the blocks to blame, the advice checked by replay
]


def pass_parts() -> list[Part]:
    """The sections' parts of the second pass, each once, in SECTIONS' order (the order the pass feeds them)."""
    return list({id(s.part): s.part for s in SECTIONS}.values())


def sections_json(a: Analyzed, top: int) -> dict[str, Any]:
    """Every section's JSON under its key (an empty list for a section with nothing to show)."""
    out: dict[str, Any] = {}
    for section in SECTIONS:
        view = section.view(a, top)
        out[section.key] = view.json if view is not None else []
    return out
