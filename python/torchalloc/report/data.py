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
  (`module_what`: analysis/modules.py's WHAT);
- `budget`: how many blocks the log has, how many the page holds, and
  what was cut.

Which blocks: a click can only ask for a moment the page knows (a sample,
the peak, an OOM, a marker). For each of those moments, its `PER_MOMENT`
largest live blocks are candidates, ranked by their best position at any
moment; the page keeps the best `TOTAL_BLOCKS` of them, so that at every
moment it holds at least its `exact` largest live blocks (`exact` is
`PER_MOMENT` when nothing was cut). The peak's and every OOM's
`PER_MOMENT` largest are always held (the first `PRIORITY_OOMS` OOMs'):
they are what the buttons show. The page says so where it lists fewer
blocks than were live.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from .._records import MARKER
from ..analysis import CATEGORIES, NEVER, REASONS, Analysis, is_library_frame, time_base_ns
from ..analysis.lifetimes import lifetime_rows
from ..analysis.modules import WHAT as MODULE_WHAT
from .svg import BOTTOM, H, LEFT, MAX_MARKERS, MAX_SPANS, RIGHT, STRIP, TOP, W, phase_colors, plot_extent

__all__ = ["page_data", "embed_json", "lifetime_examples", "module_blocks", "PER_MOMENT", "PER_MODULE", "TOTAL_BLOCKS"]

PER_MOMENT = 100  # the largest blocks live at one moment that the page can list
TOTAL_BLOCKS = 4000  # blocks embedded in all (the lifetimes' examples come on top)
PER_MODULE = 50  # a module's blocks at the peak the page lists (its largest)
PRIORITY_OOMS = 10  # OOMs whose PER_MOMENT largest blocks are held whatever the budget (a log may have thousands)
NO_STACK = -1  # a block's stack id when it has none (no Python frames, or a log without stacks)


def _r(x: float) -> float:
    return round(float(x), 6)


def moments(a: Analysis) -> np.ndarray:
    """The event indices a click may ask for: the timeline's samples, the peak, every OOM, the markers drawn."""
    t, tl = a.table, a.timeline
    marks = np.flatnonzero(t.kind == MARKER)[:MAX_MARKERS]
    extra = [tl.peak_index] + [o.index for o in a.ooms()]
    return np.unique(np.concatenate((tl.index, marks, np.asarray(extra, dtype=np.int64)))).astype(np.int64)


def live_counts(a: Analysis, indices: np.ndarray) -> np.ndarray:
    """How many blocks are live just after each event of `indices` (Derived.live_at, counted)."""
    b = a.blocks
    made = np.searchsorted(np.sort(b.alloc_i), indices, side="right")
    gone = np.searchsorted(np.sort(b.free_i), indices, side="right")
    return (made - gone).astype(np.int64)


def choose_blocks(a: Analysis, at: np.ndarray, priority: Sequence[int] = (), per_moment: int = PER_MOMENT,
                  total: int = TOTAL_BLOCKS) -> tuple[np.ndarray, int]:
    """The blocks the page holds (indices into a.blocks, ascending) and `exact`: at every moment of `at`
    the page holds at least its `exact` largest live blocks; at the `priority` moments (the peak, the
    OOMs: a button away) its `per_moment` largest, whatever the budget."""
    b = a.blocks
    size = b.block_size
    best = np.full(len(b), per_moment, dtype=np.int64)  # best rank at any moment; per_moment = never in a top
    first = set(int(i) for i in priority)
    # blocks are sorted by alloc_i: those made by event i are a prefix
    made = np.searchsorted(b.alloc_i, at, side="right")
    for i, m in zip(at.tolist(), made.tolist()):
        live = np.flatnonzero(b.free_i[:m] > i)
        if live.size > per_moment:
            live = live[np.argpartition(-size[live], per_moment - 1)[:per_moment]]
        ranked = live[np.lexsort((live, -size[live]))]
        np.minimum.at(best, ranked, np.full(ranked.size, -1) if i in first else np.arange(ranked.size))
    held = np.flatnonzero(best < 0)
    candidates = np.flatnonzero((best >= 0) & (best < per_moment))
    order = candidates[np.lexsort((candidates, -size[candidates], best[candidates]))]
    room = max(0, total - held.size)
    if order.size <= room:
        return np.sort(np.concatenate((held, order))), per_moment
    return np.sort(np.concatenate((held, order[:room]))), int(best[order[room]])


def lifetime_examples(a: Analysis) -> list[int]:
    """The block that speaks for each row of a.lifetimes(), in that order: the stage writes each row's
    sentence from one block, so ask it which (same rows, same order: the sentence is not a sort key)."""
    spoke: dict[int, int] = {}

    def record(b: int, phases: list[str]) -> str:
        spoke[len(spoke)] = b
        return str(len(spoke) - 1)

    return [spoke[int(r.explanation)] for r in lifetime_rows(a, record)]


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


def _block_columns(a: Analysis, held: np.ndarray, shared: _Shared) -> dict[str, list[Any]]:
    """The held blocks as columns; -1 where there is none (free of a live block, stack, site)."""
    b, c = a.blocks, a.classified
    base = time_base_ns(a.table)
    cols: dict[str, list[Any]] = {k: [] for k in (
        "id", "addr", "size", "requested", "phase", "free_phase", "site", "free_site", "category", "reason", "why",
        "alloc_i", "free_i", "alloc_t", "free_t", "alloc_stack", "free_stack")}
    for k in held.tolist():
        freed, known = int(b.free_i[k]) != NEVER, int(b.alloc_i[k]) >= 0
        cols["id"].append(k)
        cols["addr"].append(hex(int(b.addr[k])))
        cols["size"].append(int(b.block_size[k]))
        cols["requested"].append(int(b.size[k]))
        cols["phase"].append(shared.phase(int(b.alloc_phase[k])))
        cols["free_phase"].append(shared.phase(int(b.free_phase[k])) if freed else -1)
        cols["site"].append(shared.site(int(c.site[k])))
        cols["free_site"].append(shared.site(int(c.free_site[k])))
        cols["category"].append(int(c.category[k]))
        cols["reason"].append(int(c.reason[k]))
        cols["why"].append(shared.sentences.id(a.explanation(k)))
        cols["alloc_i"].append(int(b.alloc_i[k]))
        cols["free_i"].append(int(b.free_i[k]) if freed else -1)
        cols["alloc_t"].append(_r((int(b.alloc_t[k]) - base) / 1e9) if known else -1)
        cols["free_t"].append(_r((int(b.free_t[k]) - base) / 1e9) if freed else -1)
        cols["alloc_stack"].append(shared.stack(int(b.alloc_stack[k])))
        cols["free_stack"].append(shared.stack(int(b.free_stack[k])) if freed else NO_STACK)
    return cols


def module_blocks(a: Analysis, shown: int) -> list[tuple[int, list[int]]]:
    """For the first `shown` rows of a.modules(): the module's id and its blocks live at the peak, largest first
    (at most PER_MODULE)."""
    m, _ = a.modules()
    if not m.rows:
        return []
    live = a.live_at(m.peak_index)
    return rows_blocks(m.rows[:shown], m.name, np.unique(m.module_of), live, m.module_of[live],
                       a.blocks.block_size[live])


def rows_blocks(rows: Sequence[Any], name: Any, ids: np.ndarray, live: np.ndarray, module: np.ndarray,
                size: np.ndarray) -> list[tuple[int, list[int]]]:
    """module_blocks from the blocks live at the peak (`live`, in the blocks' order, with their module and size)
    and every module id a block has (`ids`, ascending: of two with one name, the later is the row's); the
    streamed page (data_stream.py) asks it too."""
    by_name = {name(int(k)): int(k) for k in ids.tolist()}
    out = []
    for row in rows:
        mine = np.flatnonzero(module == by_name.get(row.module, -1))
        mine = mine[np.argsort(-size[mine], kind="stable")][:PER_MODULE]
        out.append((by_name.get(row.module, -1), live[mine].tolist()))
    return out


def page_data(a: Analysis, *, lifetimes_shown: int = 60, modules_shown: int = 60) -> dict[str, Any]:
    """Everything the page's script needs (module docstring), as plain lists and numbers."""
    t, tl, b = a.table, a.timeline, a.blocks
    shared = _Shared(a)
    timeline = {
        "t": [_r(x) for x in tl.t_s], "i": tl.index.tolist(), "allocated": tl.allocated.tolist(),
        "reserved": tl.reserved.tolist(), "live": live_counts(a, tl.index).tolist(),
        "phases": list(tl.by_phase), "by_phase": [v.tolist() for v in tl.by_phase.values()],
        "fragmented": [int(v) for v in a.fragmented_samples()],
    }
    spans = [[shared.names.id(n), _r(t0), _r(t1)] for n, t0, t1 in tl.phase_spans[:MAX_SPANS]]
    marker_i = np.flatnonzero(t.kind == MARKER)[:MAX_MARKERS].tolist()  # the order timeline.markers has
    markers = [{"t": _r(ts), "label": label, "phase": phase, "i": i}
               for (ts, label, phase), i in zip(tl.markers[:MAX_MARKERS], marker_i)]

    def moment(i: int) -> dict[str, Any]:
        return {"i": i, "t": _r(a.time_s(i)), "allocated": int(a.allocated[i]), "reserved": int(a.reserved[i]),
                "live": int(live_counts(a, np.array([i]))[0])}

    ooms = [dict(moment(o.index), requested=o.requested, phase=o.phase, site=o.site, verdict=o.verdict,
                 verdict_from=o.verdict_from, explanation=o.explanation,
                 advice=[dict(number=c.number, text=c.text, check=c.check, confirmed=c.confirmed) for c in o.advice])
            for o in a.ooms()]
    priority = ([tl.peak_index] if len(t) else []) + [o.index for o in a.ooms()[:PRIORITY_OOMS]]
    chosen, exact = choose_blocks(a, moments(a), priority) if len(b) else (np.zeros(0, dtype=np.int64), PER_MOMENT)
    examples = lifetime_examples(a)[:lifetimes_shown]
    per_module = module_blocks(a, modules_shown)
    module_held = [k for _, ks in per_module for k in ks]
    held = np.union1d(np.union1d(chosen, np.asarray(examples, dtype=np.int64)), np.asarray(module_held, dtype=np.int64))
    row_of = {int(k): r for r, k in enumerate(held.tolist())}
    lifetimes = [{"site": r.site, "location": r.location, "reason": r.reason, "category": r.category,
                  "count": r.count, "bytes": r.bytes, "typical_s": _r(r.typical_lifetime_s), "why": r.explanation,
                  "block": row_of[k]} for r, k in zip(a.lifetimes()[:lifetimes_shown], examples)]
    blocks = _block_columns(a, held, shared)
    mods, _ = a.modules()
    names = [mods.name(module) for module, _ in per_module]
    name_of = {module: n for n, (module, _) in enumerate(per_module)}
    blocks["module"] = [name_of.get(int(mods.module_of[k]), -1) if len(mods.module_of) else -1 for k in held.tolist()]
    blocks["module_what"] = [int(mods.what_of[k]) if len(mods.what_of) else -1 for k in held.tolist()]
    modules = [{"module": row.module, "at_peak": row.at_peak, "count": row.blocks_at_peak,
                "blocks": [row_of[k] for k in ks]} for row, (_, ks) in zip(mods.rows, per_module)]
    return {
        **page_frame(t.path, a, tl),
        "timeline": timeline, "spans": spans, "spans_total": len(tl.phase_spans),
        "markers": markers, "markers_total": len(tl.markers),
        "peak": moment(tl.peak_index) if len(t) else None, "ooms": ooms,
        "blocks": blocks, "lifetimes": lifetimes, "modules": modules, "module_names": names,
        **shared.to_dict(),
        "budget": page_budget(len(b), int(held.size), exact, priority),
    }


def page_frame(path: str, a: Any, tl: Any) -> dict[str, Any]:
    """The page's fields that do not depend on which blocks it shows: the log, the plot's frame and scales,
    the phases' colours and the names of reasons, categories and what a module holds. `a` and `tl` are a
    whole-log or a streamed analysis and its timeline (streamed pages share this with page_data)."""
    x_max, y_max = plot_extent(tl)
    colors = phase_colors(list(tl.by_phase))
    return {
        "log": path, "device": a.device, "has_stacks": a.has_stacks,
        "layout": {"w": W, "h": H, "left": LEFT, "right": RIGHT, "top": TOP, "bottom": BOTTOM, "strip": STRIP},
        "xmax": x_max, "ymax": y_max,
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
