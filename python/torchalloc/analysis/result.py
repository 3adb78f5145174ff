"""The analysis as one object: `analyze` runs the stages, `Analysis` answers with rows and words.

Takes a log (a path, a decoded `torchalloc.log.Log`, or an `EventTable`);
gives an `Analysis`: the derived data of derived.py, and one method per
section of the report -- anatomy, lifetimes, phases, estimate, reserve, modules, ooms, and
to_dict for all of them (the sections after the anatomy through
sections.py's list) -- each a row stage followed by the wording stage.
Nothing is computed here that a stage could compute.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

from ..log.chunks import DEFAULT_CHUNK_RECORDS, is_large_log

from .anatomy import Anatomy, anatomy, index_at, marker_first, marker_labels
from .categorize import Category
from .derived import Derived, derive
from .estimate import Estimate, category_total, estimate
from .events import EventTable, load, table_from_log
from .lifetimes import LifetimeRow, lifetime_rows
from .modules import Modules, modules as module_rows
from .ooms import OomRow, oom_rows
from .phase_summary import PhaseRow, phase_rows
from .reserve import Reserve, reserve as reserve_rows, series as reserve_series
from .sections import report_dict
from .streamed import StreamedAnalysis, analyze_streamed
from .wording import (estimate_sentence, explain_block, explain_group, module_sentences, oom_explanation,
                      phase_sentence, reserve_sentences)


@dataclasses.dataclass
class Analysis(Derived):
    """Everything derived from one device's events, and the report's sections. Build with `analyze`."""

    @classmethod
    def of(cls, derived: Derived) -> "Analysis":
        return cls(**{field.name: getattr(derived, field.name) for field in dataclasses.fields(derived)})

    def explanation(self, b: int) -> str:
        """Why block b was freed when it was, in words."""
        return explain_block(self, b)

    def index_at(self, at: str | float | int | None = None) -> tuple[int, str]:
        """The event index for "peak" (default), "peak_reserved", "end", "oom", a marker label, or a time in seconds."""
        return index_at(self, at)

    def anatomy(self, at: str | float | int | None = None, top: int | None = None) -> Anatomy:
        return anatomy(self, at, top)

    def lifetimes(self, top: int | None = None) -> list[LifetimeRow]:
        """Per allocation site and reason: count, bytes, typical lifetime, and why it was freed then."""
        return lifetime_rows(self, functools.partial(explain_group, self), top)

    def phases(self) -> list[PhaseRow]:
        """Per phase: allocated, freed, peak, reserved growth, persistent/handed on/transient, a sentence."""
        rows = phase_rows(self)
        params = category_total(self, Category.PARAMETERS)
        for row in rows:
            row.sentence = phase_sentence(row, params)
        return rows

    def estimate(self) -> Estimate:
        est = estimate(self)
        est.sentence = estimate_sentence(est)
        return est

    def reserve(self) -> Reserve:
        """Reserved memory split into allocated, fragmentation, cache (and what the log cannot see) at the peaks,
        the segments live blocks pin, and the run replayed under every policy. Computed once (the replays)."""
        cached = self.__dict__.get("_reserve")
        if cached is None:
            cached = reserve_rows(self)
            cached.sentences = reserve_sentences(cached, self.timeline.peak_reserved)
            self.__dict__["_reserve"] = cached
        return cached

    def modules(self) -> tuple[Modules, list[str]]:
        """Memory by nn.Module (torchalloc.track's module records): per module path, the bytes held at the peak and
        at each phase's peak, and what they are; and the sentences. Computed once."""
        cached = self.__dict__.get("_modules")
        if cached is None:
            peak = self.index_at("peak")[0] if len(self.table) else 0
            m = module_rows(self, peak)
            cached = (m, module_sentences(m, int(self.allocated[peak]) if len(self.table) else 0))
            self.__dict__["_modules"] = cached
        return cached

    def fragmented_samples(self) -> Any:
        """At the timeline's samples, the free bytes in segments that hold live blocks (the page's band)."""
        cached = self.__dict__.get("_fragmented")
        if cached is None:
            cached = reserve_series(self).fragmented[self.timeline.index] if len(self.table) else self.timeline.index
            self.__dict__["_fragmented"] = cached
        return cached

    def ooms(self) -> list[OomRow]:
        """Each OOM record diagnosed: verdict, blocks to blame, and (the last) replayed under every policy.
        Computed once: the replays take a moment."""
        cached = self.__dict__.get("_ooms")
        if cached is None:
            cached = oom_rows(self)
            for row in cached:
                row.explanation = oom_explanation(row)
            self.__dict__["_ooms"] = cached
        return cached

    def to_dict(self, top: int = 50) -> dict[str, Any]:
        """The report as plain data (what `torchalloc report --json` prints): the anatomy at each of the first
        MARKER_ANATOMIES marker labels, as a log read in pieces gives."""
        return report_dict(self, top, marker_labels(self), len(marker_first(self)))


def analyze(
    source: EventTable | Any | str | os.PathLike[str],
    *,
    device: int | None = None,
    max_points: int = 1500,
    progress: bool = False,
    chunk_records: int | None = None,
    at: Sequence[str | float] = (),
    page: bool = False,
) -> Analysis | StreamedAnalysis:
    """Analyze a log (a path, a decoded `torchalloc.log.Log`, or an EventTable) for one device
    (default: the one with the most allocations).

    A log file too large to hold decoded (log/chunks.py, is_large_log), or any log file when `chunk_records` is given,
    is read in pieces of that many records (streamed.py): the same sections from a `StreamedAnalysis`. `at` (the
    moments whose anatomy will be asked for) and `page` (the HTML page will be drawn) let it gather them in its
    one pass; without them a later question about another moment costs one more pass."""
    if isinstance(source, (str, os.PathLike)) and (chunk_records is not None or is_large_log(source)):
        return analyze_streamed(source, device=device, max_points=max_points, progress=progress, at=at, page=page,
                                chunk_records=chunk_records or DEFAULT_CHUNK_RECORDS)
    if isinstance(source, (str, os.PathLike)):
        table = load(source)
    elif isinstance(source, EventTable):
        table = source
    else:
        table = table_from_log(source)
    return Analysis.of(derive(table, device=device, max_points=max_points, progress=progress))
