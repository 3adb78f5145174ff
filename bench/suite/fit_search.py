"""bench/fit.py's search and table: the smallest memory cap under which a run completes.

A cap is torch.cuda.set_per_process_memory_fraction(cap / device memory),
set in the run's process before the model is built (bench/suite/child.py,
--cap). Per (workload, variant): one run without a cap gives the peaks;
its peak reserved is the first cap tried (it held everything then, and is
checked: under a cap an allocator may behave otherwise, so it is raised by
5 % at a time, a few times, until a run completes); below the peak
allocated nothing can fit, so that (less 2 %) is the lower bound, not
tried. Bisection then halves the interval until it is narrower than
`precision` (1 %) of the peak allocated; the smallest cap that completed
is the answer. As with replay's min capacity, success is assumed to be
monotone in the cap: the figure is what bisection finds.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MiB = 2**20
PRECISION = 0.005  # bisection stops when the interval is narrower than this fraction of the peak allocated
RAISES = 3  # times the first cap may be raised by RAISE_STEP when a run does not complete under it
RAISE_STEP = 1.05
TARGET_CAP = 1.01  # the goal: torchalloc's smallest cap <= 1.01 x its peak allocated on the transformer workloads
TRANSFORMERS = ("encoder", "vit_b16", "gpt2", "llama", "moe", "llama_generate")
DEFAULT_VARIANT = "torchalloc"


@dataclass
class Fit:
    workload: str
    variant: str
    peak_allocated: int | None = None  # of the run without a cap
    peak_reserved: int | None = None
    cap: int | None = None  # the smallest cap that completed
    probes: list[tuple[int, bool]] = field(default_factory=list)  # (cap, completed) in the order tried
    error: str | None = None  # why there is no figure

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "variant": self.variant, "peak_allocated": self.peak_allocated,
                "peak_reserved": self.peak_reserved, "cap": self.cap,
                "cap_over_allocated": self.cap / self.peak_allocated if self.cap and self.peak_allocated else None,
                "probes": [[c, ok] for c, ok in self.probes], "error": self.error}


def _mib_round(n: float) -> int:
    return max(MiB, int(round(n / MiB)) * MiB)


def smallest_cap(probe: Callable[[int], bool], peak_allocated: int, peak_reserved: int,
                 precision: float = PRECISION) -> tuple[int | None, list[tuple[int, bool]]]:
    """The smallest cap (whole MiB) under which `probe(cap)` completes, by bisection; None when even
    the raised first cap does not. Returns it with every (cap, completed) tried."""
    tried: list[tuple[int, bool]] = []

    def check(cap: int) -> bool:
        ok = probe(cap)
        tried.append((cap, ok))
        return ok

    hi = _mib_round(max(peak_reserved, peak_allocated))
    for _ in range(RAISES + 1):
        if check(hi):
            break
        hi = _mib_round(hi * RAISE_STEP)
    else:
        return None, tried
    lo = _mib_round(peak_allocated * 0.98)  # fails by construction: less than the tensors need
    step = max(MiB, int(precision * peak_allocated))
    while hi - lo > step:
        mid = _mib_round((lo + hi) / 2)
        if mid in (lo, hi):
            break
        if check(mid):
            hi = mid
        else:
            lo = mid
    return hi, tried


def estimated_probes(ratio: float = 1.15, precision: float = PRECISION) -> int:
    """Runs a search takes for a variant reserving `ratio` x what it allocates: one without a cap,
    the first cap, and the bisection's halvings."""
    width, n = ratio - 0.98, 0
    while width > precision:
        width /= 2
        n += 1
    return 2 + n


def _f(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


COLUMNS = ("variant", "peak alloc MiB", "peak reserved MiB", "res/alloc", "smallest cap MiB", "cap/alloc", "runs")


def _cells(f: Fit) -> list[str]:
    if f.error:
        return [f.variant, _f(f.peak_allocated and f.peak_allocated / MiB, ".0f"), "-", "-", f"n/a: {f.error}", "-",
                str(len(f.probes))]
    ratio = f.peak_reserved / f.peak_allocated if f.peak_allocated and f.peak_reserved else None
    over = f.cap / f.peak_allocated if f.cap and f.peak_allocated else None
    return [f.variant, _f(f.peak_allocated and f.peak_allocated / MiB, ".0f"),
            _f(f.peak_reserved and f.peak_reserved / MiB, ".0f"), _f(ratio, ".3f"),
            _f(f.cap and f.cap / MiB, ".0f"), _f(over, ".3f"), str(len(f.probes) + 1)]


def text(fits: list[Fit]) -> str:
    out = []
    for workload in dict.fromkeys(f.workload for f in fits):
        body = [_cells(f) for f in fits if f.workload == workload]
        widths = [max(len(line[i]) for line in body + [list(COLUMNS)]) for i in range(len(COLUMNS))]
        out.append(f"== {workload}")
        for line in [list(COLUMNS)] + body:
            out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
        out.append("")
    return "\n".join(out)


def markdown(fits: list[Fit]) -> str:
    head = ("| workload | variant | peak allocated MiB (no cap) | peak reserved MiB (no cap) | reserved / allocated "
            "| smallest cap MiB | cap / peak allocated | runs |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    lines += [f"| {f.workload} | " + " | ".join(_cells(f)) + " |" for f in fits]
    return "\n".join(lines) + "\n"


def targets(fits: list[Fit]) -> list[str]:
    """The goal, reported (never asserted): per workload, torchalloc's smallest cap over its peak allocated
    against TARGET_CAP, and PyTorch's best option (the native variant with the smallest cap) beside it."""
    lines = []
    for workload in dict.fromkeys(f.workload for f in fits):
        group = {f.variant: f for f in fits if f.workload == workload}
        ours = group.get(DEFAULT_VARIANT)
        if not ours or not ours.cap or not ours.peak_allocated:
            continue
        over = ours.cap / ours.peak_allocated
        goal = ("met" if over <= TARGET_CAP else "NOT met") if workload in TRANSFORMERS else "no goal"
        line = f"{workload}: {DEFAULT_VARIANT}'s smallest cap {ours.cap / MiB:.0f} MiB = {over:.3f}x its peak " \
               f"allocated (goal <= {TARGET_CAP}x): {goal}"
        native = [f for name, f in group.items() if name.startswith("native") and f.cap and f.peak_allocated]
        if native:
            best = min(native, key=lambda f: f.cap or 0)
            assert best.cap and best.peak_allocated
            line += f"; PyTorch's best, {best.variant}, {best.cap / MiB:.0f} MiB = " \
                    f"{best.cap / best.peak_allocated:.3f}x its own ({(1 - ours.cap / best.cap) * 100:+.1f} % for torchalloc)"
        lines.append(line)
    return lines
