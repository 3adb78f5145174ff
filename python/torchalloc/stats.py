"""Allocator statistics under the names and layout torch users already know.

memory_stats() returns the same flat, key-sorted OrderedDict as
torch.cuda.memory_stats(); memory_summary() prints the same table as
torch.cuda.memory_summary(). Everything here reads the C library through
ctypes and works without torch (e.g. against the sim backend).
"""
from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

from . import _lib
from ._device import DeviceLike, device_index
from ._records import POOL_ALL, STAT_POOL_KEYS

# Keys torch.cuda.memory_stats_as_nested_dict() has (torch 2.11,
# torch/csrc/cuda/Module.cpp) that torchalloc has no counterpart for, and
# the value that means "does not apply":
#  - max_split_size: torchalloc never refuses to split a large block, which
#    is what torch reports by default (SIZE_MAX cast to int64: -1).
#  - num_sync_all_streams: torch counts synchronize_and_free_events calls;
#    torchalloc answers with every device synchronize it made
#    (num_synchronizes: releasing the cache, an OOM's retry, compact).
#  - oversize_allocations / oversize_segments: blocks above max_split_size;
#    with no max_split_size there are none: 0.
_MAX_SPLIT_SIZE_UNLIMITED = -1
_ZERO_STAT = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}


def _stat_dict(stat: _lib.Stat) -> dict[str, int]:
    return {"current": stat.current, "peak": stat.peak, "allocated": stat.allocated, "freed": stat.freed}


def _stat_array_dict(array: Any) -> dict[str, dict[str, int]]:
    return {pool: _stat_dict(array[i]) for i, pool in enumerate(STAT_POOL_KEYS)}


def memory_stats_as_nested_dict(device: DeviceLike = None) -> dict[str, Any]:
    """The statistics as torch's nested dict: same keys, same nesting, same key order."""
    s = _lib.get_stats(device_index(device))
    nested: dict[str, Any] = {
        "num_alloc_retries": s.num_alloc_retries,
        "num_ooms": s.num_ooms,
        "max_split_size": _MAX_SPLIT_SIZE_UNLIMITED,
        "num_sync_all_streams": s.num_synchronizes,  # torch counts its synchronize-and-free passes; ours: all
        "num_device_alloc": s.num_device_alloc,
        "num_device_free": s.num_device_free,
    }
    for name in _lib.layout("torchalloc_stats").fields("pooled"):
        nested[name] = _stat_array_dict(getattr(s, name))
    nested["oversize_allocations"] = dict(_ZERO_STAT)
    nested["oversize_segments"] = dict(_ZERO_STAT)
    return nested


def _flatten(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
    else:
        out.append((prefix, value))


def memory_stats(device: DeviceLike = None) -> collections.OrderedDict[str, int]:
    """torch.cuda.memory_stats() from torchalloc: "allocated_bytes.all.current" and friends.

    Flat "a.b.c" keys sorted by name in an OrderedDict, exactly as torch
    returns them, so code that indexes torch's dict works unchanged.
    """
    items: list[tuple[str, Any]] = []
    _flatten("", memory_stats_as_nested_dict(device), items)
    items.sort()
    return collections.OrderedDict(items)


def _all_pools(name: str, field: str, device: DeviceLike) -> int:
    s = _lib.get_stats(device_index(device))
    return int(getattr(getattr(s, name)[POOL_ALL], field))


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes in blocks handed to tensors (torch's "allocated_bytes.all.current")."""
    return _all_pools("allocated_bytes", "current", device)


def max_memory_allocated(device: DeviceLike = None) -> int:
    """Peak of memory_allocated() since start or the last reset_peak_memory_stats()."""
    return _all_pools("allocated_bytes", "peak", device)


def memory_reserved(device: DeviceLike = None) -> int:
    """Bytes of device memory torchalloc holds, in use or cached ("reserved_bytes.all.current")."""
    return _all_pools("reserved_bytes", "current", device)


def max_memory_reserved(device: DeviceLike = None) -> int:
    """Peak of memory_reserved() since start or the last reset_peak_memory_stats()."""
    return _all_pools("reserved_bytes", "peak", device)


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Set every "peak" to its "current", as torch's reset_peak_memory_stats()."""
    index = device_index(device)
    if _lib.lib().torchalloc_reset_peak_stats(index) != 0:
        raise ValueError(_lib.last_error())


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    """Zero every "allocated"/"freed" total, as torch's reset_accumulated_memory_stats()."""
    index = device_index(device)
    if _lib.lib().torchalloc_reset_accumulated_stats(index) != 0:
        raise ValueError(_lib.last_error())


def reset_max_memory_allocated(device: DeviceLike = None) -> None:
    """Deprecated in torch: resets /all/ peaks; kept so old scripts run."""
    warnings.warn(
        "reset_max_memory_allocated now calls reset_peak_memory_stats, which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: DeviceLike = None) -> None:
    """Deprecated in torch: resets /all/ peaks; kept so old scripts run."""
    warnings.warn(
        "reset_max_memory_cached now calls reset_peak_memory_stats, which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def empty_cache(device: DeviceLike | None = None) -> int:
    """Release every fully free cached segment (of `device`, or of all devices).

    Unlike torch's, returns the number of bytes released, which makes the
    effect testable. torch.cuda.empty_cache() reaches the same code through
    the reset hook that install() wires.
    """
    index = -1 if device is None else device_index(device)
    released = _lib.lib().torchalloc_empty_cache(index)
    if released < 0:
        raise ValueError(_lib.last_error())
    return int(released)


def misuse_counts(device: DeviceLike = None) -> dict[str, int]:
    """torchalloc's misuse counters (bad frees, double frees, ...), which torch has no keys for."""
    s = _lib.get_stats(device_index(device))
    return {name: int(getattr(s, name)) for name in _lib.layout("torchalloc_stats").fields("misuse")}


# ---------------------------------------------------------------------------
# memory_summary: torch's table, cell for cell
# ---------------------------------------------------------------------------

_WIDTH = 75
_SIZE_UNITS = ("B  ", "KiB", "MiB", "GiB", "TiB", "PiB")
_COUNT_UNITS = (" ", "K", "M")

# (stat key, row title, "size" or "count"), in torch's row order.
_POOLED_ROWS = (
    ("allocated_bytes", "Allocated memory", "size"),
    ("active_bytes", "Active memory", "size"),
    ("requested_bytes", "Requested memory", "size"),
    ("reserved_bytes", "GPU reserved memory", "size"),
    ("inactive_split_bytes", "Non-releasable memory", "size"),
    ("allocation", "Allocations", "count"),
    ("active", "Active allocs", "count"),
    ("segment", "GPU reserved segments", "count"),
    ("inactive_split", "Non-releasable allocs", "count"),
)
_UNPOOLED_ROWS = (
    ("oversize_allocations", "Oversize allocations", "count"),
    ("oversize_segments", "Oversize GPU segments", "count"),
)
_POOL_ROW_TITLES = (("large_pool", "      from large pool"), ("small_pool", "      from small pool"))
_COLUMNS = ("current", "peak", "allocated", "freed")


def _format_size(value: int, scale_by: float) -> str:
    """A byte count in the unit chosen by `scale_by` (the "all" row's value), as torch does."""
    unit = _SIZE_UNITS[0]
    for bigger in _SIZE_UNITS[1:]:
        if scale_by < 768 * 1024:
            break
        unit, value, scale_by = bigger, value // 1024, scale_by / 1024
    return f"{value:6d} {unit}"


def _format_count(value: int, scale_by: float) -> str:
    unit = _COUNT_UNITS[0]
    for bigger in _COUNT_UNITS[1:]:
        if scale_by < 750 * 1000:
            break
        unit, value, scale_by = bigger, value // 1000, scale_by / 1000
    return f"{value:7d} {unit} "


_FORMATTERS: dict[str, Callable[[int, float], str]] = {"size": _format_size, "count": _format_count}


def _row(title: str, values: list[int], scales: list[int], kind: str) -> str:
    fmt = _FORMATTERS[kind]
    cells = " | ".join(fmt(v, s) for v, s in zip(values, scales))
    return f" {title:<21} | {cells} "


def _pooled_rows(stats: dict[str, int], key: str, title: str, kind: str, abbreviated: bool) -> list[str]:
    def values(pool: str) -> list[int]:
        return [stats[f"{key}.{pool}.{col}"] for col in _COLUMNS]

    # Every row of a block uses the units of its "all" row, so columns line up.
    scales = values("all")
    rows = [_row(title, scales, scales, kind)]
    if not abbreviated:
        rows += [_row(sub_title, values(pool), scales, kind) for pool, sub_title in _POOL_ROW_TITLES]
    return rows


def _header(device: int, stats: dict[str, int]) -> list[str]:
    title = f"torchalloc CUDA memory summary, device ID {device}"
    counts = (
        f"CUDA OOMs: {stats['num_ooms']:<12d} | "
        f"{'':6} cudaMalloc retries: {stats['num_alloc_retries']:<8d}"
    )
    return [
        "=" * _WIDTH,
        f"{'':18}{title}".ljust(_WIDTH),
        "-" * _WIDTH,
        f"  {'':9} {counts}".ljust(_WIDTH),
        "=" * _WIDTH,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """A printable table of the statistics in torch.cuda.memory_summary()'s layout.

    Same rows, columns, units and widths as torch's, so people (and scripts
    that diff summaries) read it the same way; only the title names torchalloc.
    """
    index = device_index(device)
    stats = memory_stats(index)
    lines = _header(index, stats)
    for key, title, kind in _POOLED_ROWS:
        lines.append("-" * _WIDTH)
        lines += _pooled_rows(stats, key, title, kind, abbreviated)
    for key, title, kind in _UNPOOLED_ROWS:
        lines.append("-" * _WIDTH)
        values = [stats[f"{key}.{col}"] for col in _COLUMNS]
        # torch scales each cell of these rows by its own value.
        lines.append(_row(title, values, values, kind))
    lines.append("=" * _WIDTH)
    return "".join(f"|{line}|\n" for line in lines)
