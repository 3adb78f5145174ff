"""The data the interactive HTML report embeds: one JSON object, bounded in size.

Takes an `Analysis`; gives `page_data(a)`, a dict of plain lists the page's
script (page.js) draws and lists from, and `embed_json`, that dict
as the text of a `<script type="application/json">` element. In it:

- `timeline`: the samples the analysis already made (`Timeline`, at most
  `max_points`): time, event index, allocated, reserved, the number of live
  blocks, allocated per phase; phase spans and markers as the SVG draws
  them (svg.py's bounds);
- `peak` and `ooms`: the moments the buttons jump to, each OOM with its
  verdict, explanation and advice lines with their replay checks
  (`Analysis.ooms()`);
- `blocks`: columns, one entry per block the page can list (below), with
  sizes, phases, sites, times, reason and its sentence, and stack ids;
- `sites`, `stacks` (lists of frame ids), `frames`, `files`: deduplicated;
- `lifetimes`: the rows of the lifetimes table, each with the block that
  speaks for it (the one its sentence was written from);
- `modules`: the rows of the "Memory by module" section (the first
  `modules_shown`), each with its blocks live at the peak, largest first
  (at most `PER_MODULE`), which the page holds whatever the budget; and
  per block its module (`module_names`, -1: none) and what it is to it
  (`module_what`: analysis/sections/modules.py's WHAT);
- `budget`: how many blocks the log has, how many the page holds, and
  what was cut.

Which blocks: a click can only ask for a moment the page knows (a sample,
the peak, an OOM, a marker). For each of those moments, its `PER_MOMENT`
largest live blocks are candidates (the analysis' second pass ranks them,
built with `page=True`, else one more pass does), ranked by their best
position at any moment; the page keeps the best `TOTAL_BLOCKS` of them, so
that at every moment it holds at least its `exact` largest live blocks
(`exact` is `PER_MOMENT` when nothing was cut). The peak's and every OOM's
`PER_MOMENT` largest are always held (the first `PRIORITY_OOMS` OOMs'):
they are what the buttons show. The page says so where it lists fewer
blocks than were live.
"""
from __future__ import annotations

import json
from typing import Any, Sequence, cast

import numpy as np

from ..analysis import CATEGORIES, REASONS, Analysis, is_library_frame
from ..analysis.sections.modules import WHAT as MODULE_WHAT
from ..analysis.sections.modules import ModulesFollower, what_codes
from .labels import GAP
from .svg import (BOTTOM, CACHE_FILL, FRAG_FILL, H, LABEL_ROWS, LEFT, MAX_MARKERS, MAX_SPANS, RIGHT, ROW_H, STRIP, TOP,
                  W, phase_colors, plot_extent, plot_top)

__all__ = ["page_data", "embed_json", "PER_MOMENT", "PER_MODULE", "TOTAL_BLOCKS"]

PER_MOMENT = 100  # the largest blocks live at one moment that the page can list
TOTAL_BLOCKS = 4000  # blocks embedded in all (the lifetimes' examples come on top)
PER_MODULE = 50  # a module's blocks at the peak the page lists (its largest)
PRIORITY_OOMS = 10  # OOMs whose PER_MOMENT largest blocks are held whatever the budget (a log may have thousands)
NO_STACK = -1  # a block's stack id when it has none (no Python frames, or a log without stacks)


def _r(x: float) -> float:
    return round(float(x), 6)


class _Interner:
    """Dense ids for values, in first-seen order."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._ids: dict[Any, int] = {}

    def id(self, value: Any) -> int:
        if value not in self._ids:
            self._ids[value] = len(self.items)
            self.items.append(value)
        return self._ids[value]


class _Shared:
    """What blocks refer to, each kept once: phase names, sites, files, frames, stacks, sentences."""

    def __init__(self, a: Analysis) -> None:
        self.a = a
        self.names, self.sites, self.files, self.frames, self.stacks, self.sentences = (_Interner() for _ in range(6))
        for name in a.timeline.by_phase:  # first, so that a phase's id is also its colour's index
            self.names.id(name)

    def phase(self, p: int) -> int:
        return self.names.id(self.a.phase_name(p))

    def site(self, s: int) -> int:
        return -1 if s < 0 else self.sites.id(s)

    def stack(self, stack_id: int) -> int:
        """A stack as frame ids (frame: file id, line, function, 1 for the user's own frame), or NO_STACK."""
        stack = self.a.table.stack_of(stack_id)
        if not stack:
            return NO_STACK
        return self.stacks.id(tuple(
            self.frames.id((self.files.id(f.filename), f.line, f.function, 0 if is_library_frame(f.filename) else 1))
            for f in stack))

    def to_dict(self) -> dict[str, Any]:
        a = self.a
        return {
            "phase_names": self.names.items, "sentences": self.sentences.items,
            # [label, location, whether it is a frame]: a stand-in ("(no Python stack)") reads as its label
            "sites": [[a.sites[s].label, a.sites[s].location, a.sites[s].frame is not None] for s in self.sites.items],
            "files": self.files.items, "frames": [list(f) for f in self.frames.items],
            "stacks": [list(s) for s in self.stacks.items],
        }


def rows_blocks(rows: Sequence[Any], name: Any, ids: np.ndarray, live: np.ndarray, module: np.ndarray,
                size: np.ndarray) -> list[tuple[int, list[int]]]:
    """For each module row: the module's id and its blocks live at the peak, largest first (at most PER_MODULE),
    from those blocks (`live`, with their module and size) and every module id a block has (`ids`, ascending:
    of two with one name, the later is the row's)."""
    by_name = {name(int(k)): int(k) for k in ids.tolist()}
    out = []
    for row in rows:
        mine = np.flatnonzero(module == by_name.get(row.module, -1))
        mine = mine[np.argsort(-size[mine], kind="stable")][:PER_MODULE]
        out.append((by_name.get(row.module, -1), live[mine].tolist()))
    return out


def _choose(a: Analysis, priority: list[int], per_moment: int = PER_MOMENT, total: int = TOTAL_BLOCKS
            ) -> tuple[list[int], int]:
    """The blocks the page holds (ascending ids) and `exact` (module docstring), from the moments the second pass
    ranked."""
    best: dict[int, int] = {}
    first = set(priority)
    for i in sorted(a.passed.page):
        for pos, k in enumerate(a.passed.page[i].tolist()):
            rank = -1 if i in first else pos
            best[k] = min(best.get(k, per_moment), rank)
    size = {k: a.passed.details[k]["block_size"] for k in best}
    held = [k for k, r in best.items() if r < 0]
    order = sorted((k for k, r in best.items() if 0 <= r < per_moment), key=lambda k: (best[k], -size[k], k))
    room = max(0, total - len(held))
    if len(order) <= room:
        return sorted(held + order), per_moment
    return sorted(held + order[:room]), best[order[room]]


def _columns(a: Analysis, held: list[int], details: dict[int, dict[str, Any]], shared: _Shared
             ) -> dict[str, list[Any]]:
    """The held blocks as columns, from their details; -1 where there is none (free of a live block, stack,
    site)."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "id", "addr", "size", "requested", "phase", "free_phase", "site", "free_site", "category", "reason", "why",
        "alloc_i", "free_i", "alloc_t", "free_t", "alloc_stack", "free_stack")}
    for k in held:
        d = details[k]
        freed, known = d["free_i"] >= 0, d["alloc_i"] >= 0
        cols["id"].append(k)
        cols["addr"].append(hex(d["addr"]))
        cols["size"].append(d["block_size"])
        cols["requested"].append(d["size"])
        cols["phase"].append(shared.phase(d["phase"]))
        cols["free_phase"].append(shared.phase(d["free_phase"]) if freed else -1)
        cols["site"].append(shared.site(int(a.site_map[d["site"]])))
        cols["free_site"].append(shared.site(int(a.site_map[d["free_site"]]) if d["free_site"] >= 0 else -1))
        cols["category"].append(d["category"])
        cols["reason"].append(d["reason"])
        cols["why"].append(shared.sentences.id(a.explain(d)))
        cols["alloc_i"].append(d["alloc_i"])
        cols["free_i"].append(d["free_i"] if freed else -1)
        cols["alloc_t"].append(_r((d["alloc_t"] - a.base_ns) / 1e9) if known else -1)
        cols["free_t"].append(_r((d["free_t"] - a.base_ns) / 1e9) if freed else -1)
        cols["alloc_stack"].append(shared.stack(d["alloc_stack"]))
        cols["free_stack"].append(shared.stack(d["free_stack"]) if freed else NO_STACK)
    return cols


def _module_blocks(a: Analysis, shown: int) -> tuple[list[tuple[int, list[int]]], dict[int, dict[str, Any]]]:
    """rows_blocks for the first `shown` rows of a.modules(), from the blocks followed from the peak
    (sections/modules.py), and their details."""
    m, _ = a.modules()
    follower = cast("ModulesFollower | None", a.followers.get("modules"))  # the modules section's part, if any
    if not m.rows or follower is None:
        return [], {}
    k, module, _, size = follower.peak_blocks()
    per_module = rows_blocks(m.rows[:shown], m.name, np.array(sorted(follower.seen), dtype=np.int64),
                             np.arange(k.size), module, size)
    positions = sorted({j for _, js in per_module for j in js})
    details = {int(k[j]): d for j, d in zip(positions, follower.peak_details(positions, a.before_log_site()))}
    return [(module_id, [int(k[j]) for j in js]) for module_id, js in per_module], details


def page_data(a: Analysis, *, lifetimes_shown: int = 60, modules_shown: int = 60) -> dict[str, Any]:
    """Everything the page's script needs (module docstring), as plain lists and numbers."""
    a.ensure_page()
    t, tl, s = a.table, a.timeline, a.scan
    shared = _Shared(a)
    timeline = {
        "t": [_r(x) for x in tl.t_s], "i": tl.index.tolist(), "allocated": tl.allocated.tolist(),
        "reserved": tl.reserved.tolist(), "live": [a.passed.live_at[int(i)] for i in tl.index.tolist()],
        "phases": list(tl.by_phase), "by_phase": [v.tolist() for v in tl.by_phase.values()],
        "fragmented": [int(v) for v in a.fragmented_samples()],
    }
    spans = [[shared.names.id(n), _r(t0), _r(t1)] for n, t0, t1 in tl.phase_spans[:MAX_SPANS]]
    marker_i = [m[0] for m in s.markers[:MAX_MARKERS]]
    markers = [{"t": _r(ts), "label": label, "phase": phase, "i": i}
               for (ts, label, phase), i in zip(tl.markers[:MAX_MARKERS], marker_i)]

    def moment(i: int) -> dict[str, Any]:
        return {"i": i, "t": _r(a.time_s(i)), "allocated": a.allocated_at(i), "reserved": a.reserved_at(i),
                "live": a.passed.live_at[i]}

    ooms = [dict(moment(o.index), requested=o.requested, phase=o.phase, site=o.site, verdict=o.verdict,
                 verdict_from=o.verdict_from, explanation=o.explanation,
                 advice=[dict(number=c.number, text=c.text, check=c.check, confirmed=c.confirmed) for c in o.advice])
            for o in a.ooms()]
    priority = ([tl.peak_index] if len(t) else []) + [o.index for o in a.ooms()[:PRIORITY_OOMS]]
    chosen, exact = _choose(a, priority) if len(a.blocks) else ([], PER_MOMENT)
    rows = a.lifetime_rows()
    examples = [rep["k"] for _, rep in rows][:lifetimes_shown]
    details = dict(a.passed.details)
    for _, rep in rows[:lifetimes_shown]:
        details.setdefault(rep["k"], rep)
    per_module, module_details = _module_blocks(a, modules_shown)
    for k, d in module_details.items():
        details.setdefault(k, d)
    module_held = [k for _, ks in per_module for k in ks]
    held = np.union1d(np.union1d(np.asarray(chosen, dtype=np.int64), np.asarray(examples, dtype=np.int64)),
                      np.asarray(module_held, dtype=np.int64)).tolist()
    row_of = {int(k): r for r, k in enumerate(held)}
    lifetimes = [{"site": r.site, "location": r.location, "reason": r.reason, "category": r.category,
                  "count": r.count, "bytes": r.bytes, "typical_s": _r(r.typical_lifetime_s), "why": r.explanation,
                  "block": row_of[k]} for (r, _), k in zip(rows[:lifetimes_shown], examples)]
    blocks = _columns(a, held, details, shared)
    mods, _ = a.modules()
    name_of = {module: n for n, (module, _) in enumerate(per_module)}
    blocks["module"] = [name_of.get(details[k]["module"], -1) for k in held]
    blocks["module_what"] = what_codes(np.array([details[k]["category"] for k in held], dtype=np.int64),
                                       np.array([details[k]["reason"] for k in held], dtype=np.int64),
                                       np.array([details[k]["tag"] for k in held], dtype=np.int64)).tolist()
    modules = [{"module": row.module, "at_peak": row.at_peak, "count": row.blocks_at_peak,
                "blocks": [row_of[k] for k in ks]} for row, (_, ks) in zip(mods.rows, per_module)]
    return {
        **page_frame(t.path, a, tl),
        "timeline": timeline, "spans": spans, "spans_total": len(s.occ_phase),
        "markers": markers, "markers_total": s.marker_count,
        "peak": moment(tl.peak_index) if len(t) else None, "ooms": ooms,
        "blocks": blocks, "lifetimes": lifetimes, "modules": modules,
        "module_names": [mods.name(module) for module, _ in per_module],
        **shared.to_dict(),
        "budget": page_budget(len(a.blocks), len(held), exact, priority),
    }


def page_frame(path: str, a: Any, tl: Any) -> dict[str, Any]:
    """The page's fields that do not depend on which blocks it shows: the log, the plot's frame and scales,
    the phases' colours and the names of reasons, categories and what a module holds."""
    x_min, x_max, y_max = plot_extent(tl)
    colors = phase_colors(list(tl.by_phase))
    top = plot_top(bool(tl.markers))
    return {
        "log": path, "device": a.device, "has_stacks": a.has_stacks,
        "layout": {"w": W, "h": H + top - TOP, "left": LEFT, "right": RIGHT, "top": top, "bottom": BOTTOM,
                   "strip": STRIP, "label_rows": LABEL_ROWS, "row_h": ROW_H, "label_gap": GAP,
                   "frag_fill": FRAG_FILL, "cache_fill": CACHE_FILL},
        "xmin": x_min, "xmax": x_max, "ymax": y_max,
        "colors": [colors[n] for n in tl.by_phase],
        "module_what": list(MODULE_WHAT),
        "reasons": [str(r) for r in REASONS], "categories": [str(x) for x in CATEGORIES],
    }


def page_budget(blocks: int, held: int, exact: int, priority: list[int]) -> dict[str, Any]:
    """How many blocks the page carries, of how many, and whether the per-moment budget cut any."""
    return {"blocks": blocks, "held": held, "per_moment": PER_MOMENT, "total": TOTAL_BLOCKS,
            "exact": exact, "cut": exact < PER_MOMENT, "priority": priority}


def embed_json(data: dict[str, Any]) -> str:
    """`data` as the text of a <script type="application/json"> element: every "<" escaped (a JSON string
    escape, so the parse is unchanged), so that no text from the log can end the element or open a comment."""
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
