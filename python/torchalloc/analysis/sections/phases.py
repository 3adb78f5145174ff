"""Phase summary: per phase, what it allocated and freed, and what stayed, was handed on, or was transient.

Holds `PhaseRow`: one per phase that allocated a block, ran, or grew or
shrank the reserved memory: allocated / freed / peak / reserved growth,
and its blocks split into persistent (live at the end), handed on
(outlived the occurrence that made them) and transient (freed within it).
A phase that never began (the default phase, a log without phases) has no
occurrences: there, transient means freed while the same phase was
current. The first pass finds each phase's peak, rise and reserved growth
(passes/first.py), the second its sums (passes/second.py); Analysis.phases
(result.py) builds the rows, each sentence written by
wording.phase_sentence.
"""
from __future__ import annotations

import dataclasses
from typing import Any


from ...units import fmt_bytes


@dataclasses.dataclass
class PhaseRow:
    phase: str
    role: str | None
    occurrences: int
    allocated: int
    allocated_count: int
    freed: int
    freed_count: int
    peak: int  # highest allocated while this phase was current
    peak_over_start: int  # highest rise above the level at the start of an occurrence
    reserved_growth: int  # segments made minus segments released while current
    persistent: int  # allocated here, still live at the end
    handed_on: int  # outlived the occurrence, freed later
    transient: int  # freed within the occurrence that made it
    persistent_by_category: dict[str, int]
    handed_on_to: dict[str, int]
    first_occurrence_persistent: int
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def cells(self) -> tuple[Any, ...]:
        """The phase table's row, formatted as every report shows it: phase, occurrences,
        allocated, freed, peak, reserved growth, persistent, handed on, transient."""
        # A phase that never began (the default phase: outside every phase) has no occurrences to count.
        occurrences = self.occurrences if self.occurrences else "- (outside phases)"
        return (self.phase, occurrences, fmt_bytes(self.allocated), fmt_bytes(self.freed), fmt_bytes(self.peak),
                fmt_bytes(self.reserved_growth), fmt_bytes(self.persistent), fmt_bytes(self.handed_on),
                fmt_bytes(self.transient))


