"""Between markers: what each stretch of the run, from a marker to the next, allocated, freed and kept.

A marker (`torchalloc.mark("checkpoint")`) names a moment; what the user
wants to know of it is what the code after it did to memory. A stretch runs
from a marker's record to the next marker's (or to the log's end). Its row
says what was live at the marker, how many bytes the stretch allocated and
freed, the largest groups of blocks it freed -- (allocation site, reason,
site of the free, category), the lifetimes section's groups -- and those it
kept: blocks allocated in it and still live when it ended, by allocation
site.

The second pass hands `MarkersFollower` each piece's new and ended blocks
(`step`, once their reasons are known), the blocks from before the log freed
(`orphans_ended`) and the blocks live at the end (`finish`): each event
falls in the stretch of the last marker at or before it, and the follower
keeps sums per stretch only. It follows the first STRETCHES markers (the
page draws as many); the view and the summary (summary.py) read the rows.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...log.chunks import ChunkedLog
from ...units import fmt_bytes, fmt_time
from ..passes.first import Scan
from ..passes.follow import Follower, FreedOrphans
from ..rules.categorize import CATEGORIES
from ..rules.classify import REASONS
from ..rules.sites import BEFORE_LOG
from .section import Part, Section
from .views import Analyzed, SectionView, Table

STRETCHES = 200  # markers followed (the first ones): passes/moments.py's PAGE_MAX_MARKERS, the page's
GROUPS_SHOWN = 2  # freed and kept groups a row lists
_ORPHAN = -2  # the site id of a block from before the log, in the follower's keys (the pass' ids are >= 0)


@dataclasses.dataclass
class StretchGroup:
    """Blocks a stretch freed (or kept) that share their allocation site, reason, site of the free and category."""

    bytes: int
    count: int
    site: str  # where they were allocated ("train.py:42 main")
    has_line: bool  # the site is a Python source line (not "(no Python stack)" or another stand-in)
    reason: str  # why they were freed when they were ("" for those kept, and those from before the log)
    category: str
    free_site: str | None  # the source line that freed them, when the stacks name one

    def words(self) -> str:
        """'64.0 MiB in 1 block, freed on rebinding, allocated at train.py:42 main, freed at train.py:50 main' (or
        'freed there')"""
        n = f"{self.count} block{'s' if self.count != 1 else ''}"
        freed = (", freed there" if self.free_site == self.site else f", freed at {self.free_site}" if self.free_site
                 else "")
        return f"{fmt_bytes(self.bytes)} in {n}, {self.reason or self.category}, allocated at {self.site}{freed}"

    def short(self) -> str:
        """'64.0 MiB freed on rebinding at train.py:42 main, freed at train.py:50 main' (the summary's)"""
        freed = f", freed at {self.free_site}" if self.free_site and self.free_site != self.site else ""
        return f"{fmt_bytes(self.bytes)} {self.reason or self.category} at {self.site}{freed}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Stretch:
    """One marker and the stretch of the run after it, up to the next marker (`until`)."""

    label: str
    index: int  # the marker's event index
    t_s: float
    phase: str  # the phase running at the marker ("" outside phases)
    until: str | None  # the next marker's label; None: the stretch runs to the end of the log
    live: int  # bytes allocated at the marker
    allocated: int  # bytes the stretch allocated
    freed: int  # bytes it freed (blocks allocated anywhere before)
    kept: int  # bytes it allocated that were still live when it ended
    freed_groups: list[StretchGroup]  # the largest it freed, those with a Python source line first
    kept_groups: list[StretchGroup]  # the largest it kept, those with a Python source line first

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["freed_groups"] = [g.to_dict() for g in self.freed_groups]
        d["kept_groups"] = [g.to_dict() for g in self.kept_groups]
        return d


@dataclasses.dataclass
class Stretches:
    rows: list[Stretch]
    markers: int  # markers in the log (rows: the first STRETCHES)


def _add(groups: dict[tuple[int, ...], list[int]], keys: np.ndarray, size: np.ndarray) -> None:
    """Adds each row's size (and a count) under its key (a row of `keys`)."""
    if not len(size):
        return
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    total = np.zeros(len(uniq), dtype=np.int64)
    count = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(total, inv, size)
    np.add.at(count, inv, 1)
    for key, b, c in zip(map(tuple, uniq.tolist()), total.tolist(), count.tolist()):
        slot = groups.setdefault(key, [0, 0])
        slot[0] += b
        slot[1] += c


class MarkersFollower(Follower):
    """Sums per stretch (module docstring). Stretch k+1 holds the events from marker k on; 0 those before."""

    def __init__(self, scan: Scan) -> None:
        # one more than those followed: the last followed stretch ends at the next marker
        self.at = np.asarray([m[0] for m in scan.markers[:STRETCHES + 1]], dtype=np.int64)
        n = len(self.at) + 1
        self.allocated = np.zeros(n, dtype=np.int64)
        self.freed = np.zeros(n, dtype=np.int64)
        self.kept = np.zeros(n, dtype=np.int64)
        # (stretch, site, reason, free site, category) -> [bytes, count]; (stretch, site, category) for kept
        self.freed_by: dict[tuple[int, ...], list[int]] = {}
        self.kept_by: dict[tuple[int, ...], list[int]] = {}
        self.orphan_sizes = scan.orphans["block_size"]

    def _stretch(self, i: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.at, i, side="right")

    def step(self, bt: dict[str, np.ndarray], nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        size = bt["block_size"]
        np.add.at(self.allocated, self._stretch(bt["alloc_i"][nc:]), size[nc:])
        if not ended.size:
            return
        s_end, s_alloc = self._stretch(end_i), self._stretch(bt["alloc_i"][ended])
        size_end = size[ended]
        np.add.at(self.freed, s_end, size_end)
        sel = (s_end > 0) & (s_end <= STRETCHES)  # grouped only where a row shows them
        keys = np.stack((s_end, bt["site"][ended], bt["reason"][ended], bt["free_site"][ended],
                         bt["category"][ended]), axis=1)
        _add(self.freed_by, keys[sel], size_end[sel])
        self._keep(s_alloc, s_end, bt["site"][ended], bt["category"][ended], size_end)

    def _keep(self, s_alloc: np.ndarray, s_end: np.ndarray, site: np.ndarray, category: np.ndarray,
              size: np.ndarray) -> None:
        """Blocks allocated in a stretch and ended in a later one (or never: s_end past the last)."""
        sel = (s_alloc > 0) & (s_alloc < s_end) & (s_alloc <= STRETCHES)
        np.add.at(self.kept, s_alloc[sel], size[sel])
        _add(self.kept_by, np.stack((s_alloc, site, category), axis=1)[sel], size[sel])

    def orphans_ended(self, freed: FreedOrphans) -> None:
        s_end, size = self._stretch(freed.free_i), self.orphan_sizes[freed.k]
        np.add.at(self.freed, s_end, size)
        sel = (s_end > 0) & (s_end <= STRETCHES)
        none = np.full(int(sel.sum()), -1, dtype=np.int64)
        keys = np.stack((s_end[sel], np.full(none.size, _ORPHAN), none, none, none), axis=1)
        _add(self.freed_by, keys, size[sel])

    def finish(self, bt: dict[str, np.ndarray]) -> None:
        alloc_i = bt["alloc_i"]
        self._keep(self._stretch(alloc_i), np.full(alloc_i.size, len(self.at) + 1), bt["site"], bt["category"],
                   bt["block_size"])


def _groups(a: Any, by: dict[tuple[int, ...], list[int]], stretch: int) -> list[StretchGroup]:
    """The stretch's groups, those with a Python source line first, each part largest first; the first few."""
    out = []
    for key, (b, c) in by.items():
        if key[0] != stretch:
            continue
        site = BEFORE_LOG if key[1] == _ORPHAN else a.site(key[1])
        if len(key) == 3:  # kept: (stretch, site, category)
            reason, free_site, category = "", None, str(CATEGORIES[key[2]])
        else:
            reason = str(REASONS[key[2]]) if key[2] >= 0 else ""
            free_site = a.site(key[3]).label if key[3] >= 0 else None
            category = str(CATEGORIES[key[4]]) if key[4] >= 0 else BEFORE_LOG.label
        out.append(StretchGroup(b, c, site.label, site.frame is not None, reason, category, free_site))
    out.sort(key=lambda g: (not g.has_line, -g.bytes, g.site, g.reason))
    return out[:GROUPS_SHOWN]


def _rows(a: Any, follower: Follower | None) -> Stretches:
    """The rows, for the analysis `a` (front.Analysis)."""
    if not isinstance(follower, MarkersFollower):
        return Stretches([], 0)
    marks = a.timeline.markers  # (t_s, label, phase), in the scan's order
    live = a.scan.initial + np.cumsum(follower.allocated - follower.freed)
    rows = []
    for k, i in enumerate(follower.at[:STRETCHES].tolist()):
        t_s, label, phase = marks[k]
        rows.append(Stretch(label, i, t_s, phase, marks[k + 1][1] if k + 1 < len(marks) else None, int(live[k]),
                            int(follower.allocated[k + 1]), int(follower.freed[k + 1]), int(follower.kept[k + 1]),
                            _groups(a, follower.freed_by, k + 1), _groups(a, follower.kept_by, k + 1)))
    return Stretches(rows, a.scan.marker_count)


def _follow(log: ChunkedLog, scan: Scan) -> MarkersFollower | None:
    return MarkersFollower(scan) if scan.markers else None  # no marker: nothing to follow


MARKERS = Part("markers", _follow, _rows)


def _view(a: Analyzed, top: int) -> SectionView | None:
    s: Stretches = a.section_rows(MARKERS.key)
    if not s.rows:
        return None
    shown = s.rows[:top]
    cells = [(f"'{r.label}'", fmt_time(r.t_s), fmt_bytes(r.live), fmt_bytes(r.allocated), fmt_bytes(r.freed),
              fmt_bytes(r.kept)) for r in shown]
    notes = [[f"freed: {g.words()}" for g in r.freed_groups] + [f"kept: {g.words()}" for g in r.kept_groups]
             for r in shown]
    more = f"... {s.markers - len(shown)} more markers" if s.markers > len(shown) else ""
    table = Table(["marker", "at", "live then", "allocated", "freed", "kept"], cells, right=(2, 3, 4, 5),
                  css="stretches", row_notes=notes, more=more)
    return SectionView(table, [], {"markers": s.markers, "stretches": [r.to_dict() for r in s.rows]})


SECTION = Section("stretches", "Between markers: what the run did from each marker to the next",
                  "Live then: allocated at the marker. Allocated, freed: by the stretch up to the next marker. Kept: "
                  "what the stretch allocated that was still live when it ended.", _view, MARKERS)
