"""The HTML page's data for a log analysed in pieces (analysis/streamed.py): report_data.page_data's object.

Takes a `StreamedAnalysis` (built with `page=True`, its second pass kept,
at every moment the page can show, the `PER_MOMENT` largest live blocks,
and the details of each; else one more pass does); gives what report_data.page_data gives for the
same log analysed whole: the same blocks chosen by the same rule
(report_data.choose_blocks), the same columns, ids and sentences.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.modules import what_codes
from ..analysis.streamed import StreamedAnalysis
from .data import (NO_STACK, PER_MOMENT, PRIORITY_OOMS, TOTAL_BLOCKS, _r, _Shared, page_budget, page_frame,
                   rows_blocks)
from .svg import MAX_MARKERS, MAX_SPANS

__all__ = ["streamed_page_data"]


def _choose(a: StreamedAnalysis, priority: list[int], per_moment: int = PER_MOMENT, total: int = TOTAL_BLOCKS
            ) -> tuple[list[int], int]:
    """report_data.choose_blocks over the moments the second pass ranked."""
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


def _columns(a: StreamedAnalysis, held: list[int], details: dict[int, dict[str, Any]], shared: _Shared
             ) -> dict[str, list[Any]]:
    """report_data._block_columns from the kept details."""
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


def _module_blocks(a: StreamedAnalysis, shown: int) -> tuple[list[tuple[int, list[int]]], dict[int, dict[str, Any]]]:
    """report_data.module_blocks from the blocks followed from the peak (stream_modules.py), and their details."""
    m, _ = a.modules()
    follower = a.followers[1]
    if not m.rows or follower is None:
        return [], {}
    k, module, _, size = follower.peak_blocks()
    per_module = rows_blocks(m.rows[:shown], m.name, np.array(sorted(follower.seen), dtype=np.int64),
                             np.arange(k.size), module, size)
    positions = sorted({j for _, js in per_module for j in js})
    details = {int(k[j]): d for j, d in zip(positions, follower.peak_details(positions, a.before_log_site()))}
    return [(module_id, [int(k[j]) for j in js]) for module_id, js in per_module], details


def streamed_page_data(a: StreamedAnalysis, *, lifetimes_shown: int = 60, modules_shown: int = 60) -> dict[str, Any]:
    """report_data.page_data for a streamed analysis (module docstring)."""
    a.ensure_page()
    t, tl, s = a.table, a.timeline, a.scan
    shared = _Shared(a)  # type: ignore[arg-type]  (it reads only what both analyses have)
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
