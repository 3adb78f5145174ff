"""Explain a torchalloc event log: what was live, when, and why it was freed when it was.

    from torchalloc.analysis import analyze
    a = analyze("run.talog")                 # or a decoded Log, or an EventTable
    a.anatomy("peak"); a.lifetimes(); a.phases(); a.estimate(); a.ooms(); a.to_dict()

The analysis is a pipeline; each module is one stage, takes what the stages
before it give, and can be used and tested alone:

- frames, roles, sites -- what the names in a log mean: Python frames (the
  user's or a library's), phase names (forward, backward, optimizer, setup),
  allocation sites;
- events -- the decoded log as an `EventTable` of parallel numpy arrays,
  the one adapter between the log format and the analysis;
- blocks -- one row per block (alloc paired with its free by address), and
  the occurrences of each phase;
- classify -- why each block was freed when it was (`Reason`: the rules are
  in its docstring), with backward detection and allocation sites;
- categorize -- what each block was for (`Category`): parameters,
  gradients, optimizer state, optimizer intermediates, activations,
  temporaries, library workspaces -- the terms of the usual estimate
  params + optimizer state + max(grads + optimizer intermediates, activations);
- timeline -- allocated and reserved bytes after every event, allocated
  split by the phase that allocated each block, the peaks;
- derived -- runs the stages above for one device (`Derived`);
- anatomy, lifetimes, phase_summary, estimate, ooms -- the report's
  sections as rows of numbers: what was live at the peak (or a marker, or a
  time), per site and reason how long blocks lived, per phase what stayed,
  was handed on or was transient, the estimate measured, each OOM;
- wording -- the sentences, from those numbers;
- result -- `Analysis` (the derived data with one method per section) and
  `analyze`.

Stacks and phases are optional: a log written without stacks gets reasons
from phases, one without phases gets every stack-based answer, and one
with neither still gets a report (classify and categorize say how).
"""
from __future__ import annotations

# The record kinds an EventTable's `kind` column holds: tools and tests build tables with them.
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
from .blocks import NEVER, Blocks, Occurrences, pair_blocks, phase_occurrences
from .categorize import CATEGORIES, WORKSPACE_SIZES, Category, Classified, categorize
from .classify import REASONS, Reason, Reasons, StackVerdict, backward_mask, classify, classify_stacks
from .derived import Derived, derive
from .estimate import Estimate
from .events import EventTable, devices_in, load, table_from_log, time_base_ns
from .frames import Frame, Stack, is_library_frame, user_suffix
from .lifetimes import LifetimeRow
from .modules import ModuleRow, Modules
from .ooms import OomRow
from .phase_summary import PhaseRow
from .result import Analysis, analyze
from .roles import phase_role
from .sites import BEFORE_LOG, NO_PYTHON, NO_STACKS, Site, SiteTable
from .timeline import Timeline, build_timeline

__all__ = [
    "ALLOC", "END", "FREE", "FREE_DEFERRED", "MARKER", "OOM", "PHASE_BEGIN", "PHASE_END", "SEGMENT_ALLOC",
    "SEGMENT_FREE", "TRIM", "TRUNCATED",
    "Anatomy", "AnatomyRow",
    "NEVER", "Blocks", "Occurrences", "pair_blocks", "phase_occurrences",
    "CATEGORIES", "WORKSPACE_SIZES", "Category", "Classified", "categorize",
    "REASONS", "Reason", "Reasons", "StackVerdict", "backward_mask", "classify", "classify_stacks",
    "Derived", "derive",
    "Estimate",
    "EventTable", "devices_in", "load", "table_from_log", "time_base_ns",
    "Frame", "Stack", "is_library_frame", "user_suffix",
    "LifetimeRow",
    "ModuleRow", "Modules",
    "OomRow",
    "PhaseRow",
    "Analysis", "analyze",
    "phase_role",
    "BEFORE_LOG", "NO_PYTHON", "NO_STACKS", "Site", "SiteTable",
    "Timeline", "build_timeline",
]
