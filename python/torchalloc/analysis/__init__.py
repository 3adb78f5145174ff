"""Explain a torchalloc event log: what was live, when, and why it was freed when it was.

    from torchalloc.analysis import analyze
    a = analyze("run.talog")                 # a log's path (or its bytes); any size: it is read in pieces
    a.anatomy("peak"); a.lifetimes(); a.phases(); a.estimate(); a.reserve(); a.modules(); a.ooms(); a.to_dict()

The package by role:

- front.py: `analyze` and `Analysis`, the front every report asks: one
  pipeline for every log, read in pieces, twice;
- passes/: the two passes -- the first gathers what the second needs
  (first.py: the levels, the peaks, the phase occurrences, backward, the
  markers and OOMs, the timeline's samples); the second classifies each
  block as it ends and keeps the blocks live at the moments the report
  shows (second.py), feeding every section's follower as it goes
  (follow.py: the hooks; it names no section);
- rules/: what the names in a log mean (frames, roles, sites), and the
  rules that say why a block lived as long as it did and what it was for
  (classify, categorize; blocks.py applies them block by block);
- sections/: the report's sections after the timeline and the anatomy,
  one module (or small package) each -- its follower of the pass, its
  rows, their words and its view -- listed in order in
  sections/__init__.py: markers, leaks, lifetimes, phases, estimate,
  reserve, modules, ooms;
- the report's head: anatomy.py (what was live at a moment), timeline.py,
  notes.py, summary.py (what the report says first); job.py: several
  logs, one per rank, side by side.

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
from .front import Analysis, analyze
from .passes.follow import Blocks, Follower
from .rules.categorize import CATEGORIES, WORKSPACE_SIZES, Category
from .rules.classify import REASONS, Reason
from .rules.frames import Frame, Stack, is_library_frame, user_suffix
from .rules.roles import phase_role
from .rules.sites import BEFORE_LOG, NO_PYTHON, NO_STACKS, Site
from .sections.estimate import Estimate
from .sections.leaks import step_markers
from .sections.lifetimes import LifetimeRow
from .sections.modules import ModuleRow, Modules
from .sections.ooms.diagnosis import OomRow
from .sections.phases import PhaseRow
from .sections.reserve.rows import Reserve
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
    "Blocks", "Follower",  # a tool's own follower of the second pass (analyze(followers=...))
    "step_markers",  # which of a log's markers mark its steps (the leak rule's choice)
    "phase_role",
    "BEFORE_LOG", "NO_PYTHON", "NO_STACKS", "Site",
    "Timeline",
]
