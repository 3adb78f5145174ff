"""Bytes and seconds for people: the formatters every report and table prints with, and size parsing.

    fmt_bytes(3 << 29)            -> "1.5 GiB"   (binary units, as PyTorch's messages use)
    fmt_bytes(3 << 29, 2)         -> "1.50 GiB"  (replay's and compare's tables)
    fmt_bytes(None)               -> "-"         (a figure that is not known)
    fmt_seconds(0.0034)           -> "3.4 ms"
    fmt_time(1.25)                -> "t=1.250 s"
    fmt_times([1.25, 1.2501])     -> ["t=1.2500 s", "t=1.2501 s"]  (moments that differ read differently)
    parse_bytes("1.5GiB")         -> 1610612736  (the size syntax of TORCHALLOC_CONF)

Plain Python, no numpy: usable anywhere in the package.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Sequence

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

# Largest first: a figure is shown in the largest unit it reaches.
_BINARY_UNITS = (("GiB", GiB), ("MiB", MiB), ("KiB", KiB))
_UNIT_SCALE = {"B": 1, **dict(_BINARY_UNITS)}


def byte_unit(n: float) -> tuple[str, int]:
    """The largest binary unit that |n| reaches, and its size in bytes: ("MiB", 1048576); ("B", 1) below 1 KiB."""
    for name, scale in _BINARY_UNITS:
        if abs(n) >= scale:
            return name, scale
    return "B", 1


def fmt_bytes(n: float | None, decimals: int = 1, *, unit: str | None = None) -> str:
    """n bytes in the largest binary unit it reaches ("1.5 GiB", "32.0 MiB", "512 B"), or in `unit`
    ("B", "KiB", "MiB", "GiB") when given; bytes are whole. "-" for None (a figure not known)."""
    if n is None:
        return "-"
    name, scale = byte_unit(n) if unit is None else (unit, _UNIT_SCALE[unit])
    if scale == 1:
        return f"{int(n)} B"
    return f"{n / scale:.{decimals}f} {name}"


def fmt_seconds(s: float) -> str:
    """A duration or a time since the start: 12 µs, 3.4 ms, 1.25 s; negative means "until the end"."""
    if s < 0:
        return "until the end"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_time(s: float) -> str:
    """A moment: "t=1.250 s", "t=3.4 ms"."""
    return f"t={fmt_seconds(s) if s < 1 else f'{s:.3f} s'}"


def fmt_times(moments: Sequence[float]) -> list[str]:
    """Moments as fmt_time writes them, with as many more decimals as it takes for two different moments not to
    read the same ("t=21.8157586 s", "t=21.8157590 s": the peak reserved one event before the peak allocated)."""
    decimals = 3
    out = [fmt_time(s) for s in moments]
    while len(set(out)) < len(set(moments)) and decimals < 9:
        decimals += 1
        out = [f"t={s:.{decimals}f} s" for s in moments]
    return out


def fmt_axis_seconds(value: float, span: float) -> str:
    """A tick label of a time axis that spans `span` seconds: every tick in the unit the span suits."""
    if span < 2e-3:
        return f"{value * 1e6:g} µs"
    if span < 2:
        return f"{value * 1e3:g} ms"
    return f"{value:g} s"


_SIZE_SUFFIXES = {
    "": 1, "b": 1,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "k": KiB, "m": MiB, "g": GiB, "t": TiB,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}


def parse_bytes(text: str) -> int:
    """ "80GiB", "512MB", "1.5GiB", "1048576" -> bytes (the units of TORCHALLOC_CONF)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_SUFFIXES:
        raise ValueError(f"not a size: {text!r} (expected e.g. 80GiB, 512MiB, 1.5GiB or a number of bytes)")
    return int(Fraction(m.group(1)) * _SIZE_SUFFIXES[m.group(2).lower()])
