"""Explain a torchalloc event log: what was live, when, and why it was freed when it was.

    from torchalloc.analysis import analyze
    a = analyze("run.talog")                 # a log's path (or its bytes); any size: it is read in pieces
    a.anatomy("peak"); a.lifetimes(); a.phases(); a.estimate(); a.reserve(); a.modules(); a.ooms(); a.to_dict()

One pipeline for every log (result.py): a first pass over the log's pieces
gathers what the second needs (passes/first.py: the levels, the peaks, the
phase occurrences, backward, the markers and OOMs, the timeline's
samples); the second classifies each block as it ends and keeps sums and
the blocks live at the moments the report shows (passes/second.py), with its
parts per section fed as it goes (passes/follow.py: a section's follower of
the pass, and the Part declaring it): the reserve and each policy's replay
(stream_reserve.py, reserve_terms.py), memory by module (stream_modules.py).
What the names in a log mean: frames, roles, sites; the rules that say why
a block lived as long as it did and what it was for: classify,
categorize, stream_blocks; the rows of each section and their types:
anatomy, lifetimes, phase_summary, estimate, reserve, modules, ooms; the
sentences: wording; the sections in order, as text and JSON views:
sections (what a view gives: views).

Stacks and phases are optional: a log written without stacks gets reasons
from phases, one without phases gets every stack-based answer, and one
with neither still gets a report (the notes say how).
"""
from __future__ import annotations

# The record kinds of a log: tools and tests that write or read logs name them.
from .._records import (
    ALLOC,
    END,
    FREE,
    FREE_DEFERRED,
    MARKER,
    OOM,
    PHASE_BEGIN,
    PHASE_END,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    TRIM,
    TRUNCATED,
)
from .anatomy import Anatomy, AnatomyRow
from .rules.categorize import CATEGORIES, WORKSPACE_SIZES, Category
from .rules.classify import REASONS, Reason
from .sections.estimate import Estimate
from .rules.frames import Frame, Stack, is_library_frame, user_suffix
from .lifetimes import LifetimeRow
from .modules import ModuleRow, Modules
from .sections.ooms.diagnosis import OomRow
from .sections.phases import PhaseRow
from .reserve import Reserve
from .result import Analysis, analyze
from .rules.roles import phase_role
from .rules.sites import BEFORE_LOG, NO_PYTHON, NO_STACKS, Site
from .timeline import Timeline

__all__ = [
    "ALLOC", "END", "FREE", "FREE_DEFERRED", "MARKER", "OOM", "PHASE_BEGIN", "PHASE_END", "SEGMENT_ALLOC",
    "SEGMENT_FREE", "TRIM", "TRUNCATED",
    "Anatomy", "AnatomyRow",
    "CATEGORIES", "WORKSPACE_SIZES", "Category",
    "REASONS", "Reason",
    "Estimate",
    "Frame", "Stack", "is_library_frame", "user_suffix",
    "LifetimeRow",
    "ModuleRow", "Modules",
    "OomRow",
    "PhaseRow",
    "Reserve",
    "Analysis", "analyze",
    "phase_role",
    "BEFORE_LOG", "NO_PYTHON", "NO_STACKS", "Site",
    "Timeline",
]
