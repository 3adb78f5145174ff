"""The report's timeline as a PNG, with matplotlib (optional: a clear error when it is missing).

Same picture as the HTML report's SVG: allocated bytes stacked by phase,
reserved as a dashed line, markers, OOMs and the peak.
"""
from __future__ import annotations

import os

from ..analysis import Analysis
from .svg import phase_colors
from ..units import byte_unit, fmt_bytes

__all__ = ["write_png"]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            "--png needs matplotlib, which is not installed (pip install matplotlib); "
            "--html draws the same timeline without it"
        ) from e
    return plt


def write_png(a: Analysis, path: str | os.PathLike[str], *, width: float = 11.0, height: float = 4.2, dpi: int = 120) -> None:
    plt = _pyplot()
    tl = a.timeline
    fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
    try:
        names = list(tl.by_phase)
        colors = phase_colors(names)
        unit, scale = byte_unit(max(tl.peak_reserved, tl.peak_allocated))
        if len(tl.t_s):
            ax.stackplot(tl.t_s, [tl.by_phase[n] / scale for n in names], labels=names,
                         colors=[colors[n] for n in names], alpha=0.85)
            ax.plot(tl.t_s, tl.reserved / scale, "k--", linewidth=1.3, label="reserved")
        for ts, label, _ in tl.markers[:100]:
            ax.axvline(ts, color="#6b4fa0", linestyle=":", linewidth=1)
            ax.annotate(label, (ts, ax.get_ylim()[1]), rotation=90, va="top", ha="right", fontsize=8, color="#6b4fa0")
        for ts, _size in tl.ooms:
            ax.plot([ts], [tl.peak_reserved / scale], "x", color="#d62728", markersize=10, mew=3)
        if tl.peak_allocated:
            ax.plot([tl.peak_t], [tl.peak_allocated / scale], "o", color="#d62728")
            ax.annotate(f"peak {fmt_bytes(tl.peak_allocated)}", (tl.peak_t, tl.peak_allocated / scale),
                        textcoords="offset points", xytext=(6, 6), fontsize=9, color="#b01e1e", weight="bold")
        ax.set_xlabel("seconds")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{os.path.basename(a.table.path) or 'log'}: allocated by phase, reserved (device {a.device})")
        ax.legend(loc="upper left", fontsize=8, ncol=min(len(names) + 1, 6))
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
