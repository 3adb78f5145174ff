"""The pipeline up to the timeline, for one device: what every result row reads.

Takes an `EventTable` (every device) and a device; runs the stages in the
order the data flows -- blocks and phase occurrences (blocks.py), backward
detection and reasons (classify.py), categories (categorize.py), levels and
timeline (timeline.py) -- and gives `Derived`, with notes on what the log
lacked (stacks, a backward pass, its beginning). The row stages (anatomy,
lifetimes, phase_summary, estimate, ooms) each take a `Derived`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .blocks import NEVER, Blocks, Occurrences, pair_blocks, phase_occurrences
from .categorize import Classified, categorize
from .classify import backward_mask, classify
from .events import _COLUMNS, EventTable, devices_in, time_base_ns

# The kind of the row derive() puts first in a log opened mid-run (no record has kind 0): the log's
# opening, the one moment every block allocated before the log is live.
LOG_OPENED = 0
from .sites import BEFORE_LOG, Site, SiteTable
from .timeline import Timeline, build_timeline, levels


@dataclasses.dataclass
class Derived:
    """Everything derived from one device's events, before any result row or sentence."""

    table: EventTable
    device: int
    blocks: Blocks
    occ: Occurrences
    classified: Classified
    sites: list[Site]
    allocated: np.ndarray  # after every event
    reserved: np.ndarray
    timeline: Timeline
    has_stacks: bool
    backward_from: str  # "phase", "stacks", "phase+stacks" or "none"
    notes: list[str]

    def phase_name(self, p: int) -> str:
        """The name of phase id p; blocks allocated before the log began have phase -1."""
        if p < 0:
            return BEFORE_LOG.label
        return self.table.phase_names.get(int(p), f"phase {p}")

    def time_s(self, i: int) -> float:
        """Seconds from the report's time zero to event i (clamped to the table)."""
        t = self.table
        if not len(t):
            return 0.0
        return (int(t.time_ns[min(max(i, 0), len(t) - 1)]) - time_base_ns(t)) / 1e9

    def live_at(self, i: int) -> np.ndarray:
        """Indices of the blocks live just after event i."""
        b = self.blocks
        return np.flatnonzero((b.alloc_i <= i) & (b.free_i > i))


def bytes_by(codes: np.ndarray, weights: np.ndarray, names: Sequence[Any]) -> dict[str, int]:
    """Total weight per code, named by `names` (REASONS, CATEGORIES), largest first; zero totals left out."""
    totals = np.bincount(codes.astype(np.int64), weights=weights.astype(np.float64), minlength=len(names))
    out = {str(names[k]): int(v) for k, v in enumerate(totals.tolist()) if v}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def dominant(codes: np.ndarray, weights: np.ndarray, names: Sequence[Any]) -> Any:
    """The name of the code with the largest total weight."""
    totals = np.bincount(codes.astype(np.int64), weights=weights.astype(np.float64), minlength=len(names))
    return names[int(np.argmax(totals))]


def _with_opening_row(t: EventTable, blocks: Blocks) -> tuple[EventTable, Blocks]:
    """`t` with a LOG_OPENED row first, at the log's opening, and `blocks` indexed into it.

    The levels are taken after every event; the level before the first one
    (every pre-log block live) had no index, so a 20 GiB block that the
    first record frees never counted in the peak. The row gives that moment
    an index (and a time: the report's time zero).
    """
    first = {name: np.zeros(1, dtype=getattr(t, name).dtype) for name in _COLUMNS}
    first["time_ns"][0] = time_base_ns(t)
    first["device"][0] = -1
    first["seq"][0] = t.seq[0] if len(t) else 0
    t = dataclasses.replace(t, **{name: np.concatenate((first[name], getattr(t, name))) for name in _COLUMNS})
    before = blocks.alloc_i < 0
    blocks = dataclasses.replace(
        blocks,
        alloc_i=np.where(before, blocks.alloc_i, blocks.alloc_i + 1),
        free_i=np.where(blocks.free_i == NEVER, NEVER, blocks.free_i + 1),
        alloc_t=np.where(before, first["time_ns"][0], blocks.alloc_t),
    )
    return t, blocks


def derive(table: EventTable, *, device: int | None = None, max_points: int = 1500, progress: bool = False) -> Derived:
    """Run the stages on `device`'s events (default: the one with the most allocations)."""
    devices = devices_in(table)
    if device is None:
        device = devices[0] if devices else 0
    elif devices and device not in devices:
        raise ValueError(f"no events for device {device}; the log has devices {devices}")
    t = table.select((table.device == device) | (table.device < 0))
    notes = list(table.notes)
    if len(devices) > 1:
        notes.append(f"the log has devices {devices}; this is device {device} (--device picks another)")
    blocks, odd = pair_blocks(t)
    if odd["before_log"]:
        t, blocks = _with_opening_row(t, blocks)
        notes.append(f"{odd['before_log']} blocks were allocated before the log began (their frees are in it): "
                     "they count as live from its opening, so the peak includes them; it is a lower bound, "
                     "since blocks allocated and freed before the log are not in it")
    if odd["lost_frees"]:
        notes.append(f"{odd['lost_frees']} addresses were allocated again while still live (a lost free record)")
    occ = phase_occurrences(t)
    in_bw, bw_from = backward_mask(t, occ)
    sites = SiteTable()
    classified = categorize(t, blocks, occ, classify(t, blocks, occ, in_bw, sites, progress))
    has_stacks = classified.has_stacks
    if len(blocks) and not has_stacks:
        notes.append("no stacks in this log (TORCHALLOC_CONF stacks:1, or install(stacks=True)): reasons come from "
                     "phases only, and allocation sites are unknown")
    if bw_from == "none" and np.any(blocks.free_i != NEVER):
        notes.append("no backward pass found (no phase named backward, no Tensor.backward frames): "
                     "nothing can be called 'saved for backward'")
    allocated, reserved, _ = levels(t, blocks)
    timeline = build_timeline(t, blocks, occ, allocated, reserved, max_points)
    return Derived(t, device, blocks, occ, classified, sites.sites, allocated, reserved, timeline, has_stacks, bw_from,
                   notes)
