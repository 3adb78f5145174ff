"""From run records to rows: medians, spread over rounds, ratios to native, peaks; as text or Markdown.

Step time: the median of all timed steps of all rounds, and each round's
median. The ratio to native is taken per round (this variant's round
median over native's round median in the same round, same workload), and
the table shows the median of those ratios with their min-max over rounds:
interleaving makes a round's ratio immune to slow drift, and the spread
says how much to trust the figure. Peaks are the largest over rounds (they
repeat from round to round: the data is seeded).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

MiB = 2**20
MEMORY_TARGET = 1.02  # the issue's goal: peak reserved <= 1.02 x peak allocated ...
TIME_TARGET = 1.0  # ... at a step time no slower than native
STACKS_TARGET, LOG_TARGET = 1.10, 1.03  # logging with Python stacks <= +10 %, without <= +3 % (GPT-2)


@dataclass
class Cell:
    workload: str
    variant: str
    ok: list[dict[str, Any]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def cells(records: list[dict[str, Any]]) -> list[Cell]:
    """One cell per (workload, variant), in the order first run."""
    out: dict[tuple[str, str], Cell] = {}
    for r in records:
        cell = out.setdefault((r["workload"], r["variant"]), Cell(r["workload"], r["variant"]))
        if "error" in r:
            cell.failed.append(f"round {r['round'] + 1}: {r['error']}")
        else:
            cell.ok.append(r)
    return list(out.values())


def _round_medians(cell: Cell) -> dict[int, float]:
    return {r["round"]: statistics.median(r["step_ms"]) for r in cell.ok if r["step_ms"]}


def _max(cell: Cell, key: str) -> Any:
    values = [r[key] for r in cell.ok if r.get(key) is not None]
    return max(values) if values else None


def row(cell: Cell, native: Cell | None) -> dict[str, Any]:
    medians = _round_medians(cell)
    base = _round_medians(native) if native is not None else {}
    ratios = [medians[k] / base[k] for k in medians if k in base and base[k] > 0]
    steps = [ms for r in cell.ok for ms in r["step_ms"]]
    alloc, res = _max(cell, "peak_allocated"), _max(cell, "peak_reserved")
    first = cell.ok[0] if cell.ok else {}
    return {
        "workload": cell.workload, "variant": cell.variant, "rounds_ok": len(cell.ok), "failed": cell.failed,
        "median_ms": statistics.median(steps) if steps else None,
        "round_median_ms": [medians[k] for k in sorted(medians)],
        "time_vs_native": statistics.median(ratios) if ratios else None,
        "time_vs_native_min": min(ratios) if ratios else None,
        "time_vs_native_max": max(ratios) if ratios else None,
        "peak_allocated": alloc, "peak_reserved": res,
        "reserved_over_allocated": res / alloc if alloc and res else None,
        "device_allocs": _max(cell, "device_allocs"),
        "first_loss": first.get("first_loss"), "last_loss": first.get("last_loss"),
        "log_bytes": _max(cell, "log_bytes"),
    }


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    all_cells = cells(records)
    natives = {c.workload: c for c in all_cells if c.variant == "native"}
    return [row(c, natives.get(c.workload)) for c in all_cells]


def _f(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _ratio(r: dict[str, Any]) -> str:
    if r["time_vs_native"] is None:
        return "-"
    if r["rounds_ok"] < 2:
        return f"{r['time_vs_native']:.3f}"
    return f"{r['time_vs_native']:.3f} ({r['time_vs_native_min']:.3f}-{r['time_vs_native_max']:.3f})"


def _mib(value: int | None) -> str:
    return _f(value and value / MiB, ".0f")


def _allocs(r: dict[str, Any]) -> str:
    return _f(r["device_allocs"], "d", "n/a")


def _loss(r: dict[str, Any]) -> str:
    return f"{_f(r['first_loss'], '.4f')} -> {_f(r['last_loss'], '.4f')}"


COLUMNS = ("variant", "step ms", "x native (min-max)", "alloc MiB", "reserved MiB", "res/alloc", "device allocs",
           "loss first -> last")


def _cells_of(r: dict[str, Any]) -> list[str]:
    status = f"  FAILED {len(r['failed'])}x" if r["failed"] else ""
    return [r["variant"] + status, _f(r["median_ms"], ".1f"), _ratio(r), _mib(r["peak_allocated"]),
            _mib(r["peak_reserved"]), _f(r["reserved_over_allocated"], ".3f"), _allocs(r), _loss(r)]


def text(table_rows: list[dict[str, Any]]) -> str:
    """One block per workload, fixed-width columns."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in table_rows):
        body = [_cells_of(r) for r in table_rows if r["workload"] == workload]
        widths = [max(len(line[i]) for line in body + [list(COLUMNS)]) for i in range(len(COLUMNS))]
        out.append(f"== {workload}")
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(COLUMNS, widths))))
        for line in body:
            out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
        out.append("")
    return "\n".join(out)


def markdown(table_rows: list[dict[str, Any]]) -> str:
    """One table, a workload column first (BENCHMARKS.md)."""
    head = ("| workload | variant | median step ms | step time vs native (min-max over rounds) | peak allocated MiB "
            "| peak reserved MiB | reserved / allocated | device allocations | loss first -> last |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in table_rows:
        cells_ = _cells_of(r)
        lines.append(f"| {r['workload']} | " + " | ".join(c.replace("->", "→") for c in cells_) + " |")
    return "\n".join(lines) + "\n"


def targets(table_rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, reported (never asserted: timings are noisy)."""
    lines = []
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for r in table_rows:
        by_workload.setdefault(r["workload"], []).append(r)
    for workload, group in by_workload.items():
        find = {r["variant"]: r for r in group}
        candidates = [r for r in group if not r["variant"].startswith("native") and r["reserved_over_allocated"]
                      and "+log" not in r["variant"] and "+stacks" not in r["variant"]]
        if candidates:
            best = min(candidates, key=lambda r: r["reserved_over_allocated"])
            met = best["reserved_over_allocated"] <= MEMORY_TARGET and (best["time_vs_native"] or 99) <= TIME_TARGET
            lines.append(f"{workload}: least reserve: {best['variant']} {best['reserved_over_allocated']:.3f}x "
                         f"allocated (target <= {MEMORY_TARGET}) at {_f(best['time_vs_native'], '.3f')}x native's "
                         f"step time (target <= {TIME_TARGET}): {'met' if met else 'NOT met'}")
        for name, limit in (("caching+stacks", STACKS_TARGET), ("caching+log", LOG_TARGET)):
            r = find.get(name)
            if r and r["time_vs_native"] is not None:
                lines.append(f"{workload}: {name} step time {r['time_vs_native']:.3f}x native (target <= {limit}): "
                             f"{'met' if r['time_vs_native'] <= limit else 'NOT met'}")
        stacks, history = find.get("caching+stacks"), find.get("native+history")
        if stacks and history and stacks["time_vs_native"] and history["time_vs_native"]:
            cheaper = stacks["time_vs_native"] < history["time_vs_native"]
            lines.append(f"{workload}: caching+stacks {stacks['time_vs_native']:.3f}x vs PyTorch's "
                         f"_record_memory_history(stacks='python') {history['time_vs_native']:.3f}x: "
                         f"{'cheaper (met)' if cheaper else 'NOT cheaper'}")
    return lines
