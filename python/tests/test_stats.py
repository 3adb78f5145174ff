"""torchalloc's statistics under torch's names, driven through the C entry points on the sim backend."""
from __future__ import annotations

import collections
import ctypes
import dataclasses
import re
from pathlib import Path

import pytest

import torchalloc
from torchalloc import _lib

MiB = 1 << 20

# torch.cuda.memory_stats() keys in torch 2.11, read from torch/csrc/cuda/Module.cpp
# (THCPModule_memoryStats) and flattened as torch/cuda/memory.py does.
TORCH_STAT_ARRAYS = [
    "allocation", "segment", "active", "inactive_split", "allocated_bytes",
    "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
]
TORCH_POOLS = ["all", "small_pool", "large_pool"]
TORCH_METRICS = ["current", "peak", "allocated", "freed"]
TORCH_SCALARS = [
    "num_alloc_retries", "num_ooms", "max_split_size",
    "num_sync_all_streams", "num_device_alloc", "num_device_free",
]
TORCH_UNPOOLED = ["oversize_allocations", "oversize_segments"]
TORCH_NESTED_ORDER = TORCH_SCALARS + TORCH_STAT_ARRAYS + TORCH_UNPOOLED
TORCH_KEYS = sorted(
    [f"{a}.{p}.{m}" for a in TORCH_STAT_ARRAYS for p in TORCH_POOLS for m in TORCH_METRICS]
    + TORCH_SCALARS
    + [f"{u}.{m}" for u in TORCH_UNPOOLED for m in TORCH_METRICS]
)


def malloc(lib: ctypes.CDLL, size: int, device: int = 0) -> int:
    ptr = lib.torchalloc_malloc(size, device, None)
    assert ptr, f"sim malloc({size}) failed"
    return ptr


def test_struct_matches_library(sim: ctypes.CDLL) -> None:
    assert sim.torchalloc_stats_size() == ctypes.sizeof(_lib.layout("torchalloc_stats").struct)
    assert _lib.get_stats(0).version == _lib.STATS_VERSION


def test_the_library_lists_the_fields_its_structs_are_made_of(sim: ctypes.CDLL) -> None:
    stats = _lib.layout("torchalloc_stats")
    assert list(stats.fields("pooled")) == TORCH_STAT_ARRAYS
    assert stats.fields("misuse") == tuple(torchalloc.misuse_counts())
    assert all(name.startswith("num_bad_") for name in stats.fields("misuse"))
    assert set(stats.fields("torch")) <= set(TORCH_SCALARS)
    phase = _lib.layout("torchalloc_phase_stats")
    assert list(phase.kinds) == [f.name for f in dataclasses.fields(torchalloc.PhaseStats)]


class _FakeLibrary:
    """A library that lists `listing` as torchalloc_stats' fields and says its struct is `size` bytes."""

    def __init__(self, listing: bytes, size: int) -> None:
        self.torchalloc_stats_fields = lambda: listing
        self.torchalloc_stats_size = lambda: size


def test_a_library_whose_fields_these_bindings_cannot_read_is_refused() -> None:
    good = b"version\tversion\nallocation\tpooled\nnum_ooms\ttorch\n"
    assert ctypes.sizeof(_lib._layout(_FakeLibrary(good, 8 + 96 + 8), Path("lib"), "torchalloc_stats").struct) == 112
    with pytest.raises(_lib.LibraryError, match="sizeof"):
        _lib._layout(_FakeLibrary(good, 120), Path("lib"), "torchalloc_stats")
    with pytest.raises(_lib.LibraryError, match="does not list"):
        _lib._layout(_FakeLibrary(good + b"num_new\tint128\n", 128), Path("lib"), "torchalloc_stats")


def test_keys_and_order_equal_torchs(sim: ctypes.CDLL) -> None:
    stats = torchalloc.memory_stats()
    assert isinstance(stats, collections.OrderedDict)
    assert list(stats) == TORCH_KEYS  # same keys, sorted as torch sorts them
    assert all(isinstance(v, int) for v in stats.values())


def test_nested_dict_has_torchs_nesting(sim: ctypes.CDLL) -> None:
    nested = torchalloc.memory_stats_as_nested_dict()
    assert list(nested) == TORCH_NESTED_ORDER
    for name in TORCH_STAT_ARRAYS:
        assert list(nested[name]) == TORCH_POOLS
        for pool in TORCH_POOLS:
            assert list(nested[name][pool]) == TORCH_METRICS
    for name in TORCH_UNPOOLED:
        assert list(nested[name]) == TORCH_METRICS
    assert nested["max_split_size"] == -1  # torch's value when blocks of any size may split


def test_exact_values_after_a_sequence(sim: ctypes.CDLL) -> None:
    a = malloc(sim, 1000)  # small pool: 1024-byte block in a 2 MiB segment
    b = malloc(sim, 5 * MiB)  # large pool: 5 MiB block in a 20 MiB segment
    c = malloc(sim, 12 * MiB + 1)  # fits the 15 MiB remainder: block 12 MiB + 512, split again
    s = torchalloc.memory_stats()
    assert s["allocated_bytes.all.current"] == 1024 + 5 * MiB + 12 * MiB + 512
    assert s["allocated_bytes.small_pool.current"] == 1024
    assert s["requested_bytes.all.current"] == 1000 + 5 * MiB + 12 * MiB + 1
    assert s["reserved_bytes.all.current"] == 22 * MiB
    assert s["reserved_bytes.large_pool.current"] == 20 * MiB
    assert s["segment.all.current"] == 2 and s["num_device_alloc"] == 2
    assert s["allocation.all.current"] == 3 and s["allocation.large_pool.current"] == 2
    assert s["inactive_split.large_pool.current"] == 1
    assert s["inactive_split_bytes.large_pool.current"] == 3 * MiB - 512
    assert s["inactive_split_bytes.small_pool.current"] == 2 * MiB - 1024
    assert torchalloc.memory_allocated() == s["allocated_bytes.all.current"]
    assert torchalloc.memory_reserved() == 22 * MiB

    sim.torchalloc_free(b, 5 * MiB, 0, None)
    sim.torchalloc_free(c, 12 * MiB + 1, 0, None)
    s = torchalloc.memory_stats()
    assert s["allocated_bytes.all.current"] == 1024
    assert s["allocated_bytes.all.peak"] == 1024 + 17 * MiB + 512
    assert s["allocated_bytes.all.freed"] == 17 * MiB + 512
    assert s["allocation.all.allocated"] == 3 and s["allocation.all.freed"] == 2
    assert s["inactive_split.large_pool.current"] == 0  # the 20 MiB segment coalesced whole

    assert torchalloc.empty_cache() == 20 * MiB
    s = torchalloc.memory_stats()
    assert s["reserved_bytes.all.current"] == 2 * MiB
    assert s["reserved_bytes.all.peak"] == 22 * MiB
    assert s["num_device_free"] == 1 and s["segment.large_pool.freed"] == 1
    assert torchalloc.max_memory_reserved() == 22 * MiB

    torchalloc.reset_peak_memory_stats()
    assert torchalloc.max_memory_reserved() == 2 * MiB
    assert torchalloc.max_memory_allocated() == 1024
    torchalloc.reset_accumulated_memory_stats()
    assert torchalloc.memory_stats()["allocation.all.allocated"] == 0
    sim.torchalloc_free(a, 1000, 0, None)
    assert torchalloc.memory_allocated() == 0


def test_devices_are_separate_and_device_forms_agree(sim: ctypes.CDLL) -> None:
    malloc(sim, 3 * MiB, device=1)
    assert torchalloc.memory_allocated(0) == 0
    assert torchalloc.memory_allocated(1) == 3 * MiB
    assert torchalloc.memory_allocated("cuda:1") == 3 * MiB
    assert torchalloc.memory_allocated() == 0  # no torch: the current device is 0
    assert torchalloc.memory_allocated("cuda") == 0
    with pytest.raises(ValueError, match="out of range"):
        torchalloc.memory_allocated(7)
    with pytest.raises(ValueError, match="CUDA device"):
        torchalloc.memory_allocated("cpu")


def test_misuse_counts_are_kept_apart_from_torchs_keys(sim: ctypes.CDLL) -> None:
    ptr = malloc(sim, 4096)
    sim.torchalloc_free(ptr, 4096, 0, None)
    sim.torchalloc_free(ptr, 4096, 0, None)  # double free: counted, not fatal
    assert torchalloc.misuse_counts()["num_bad_double_free"] == 1
    assert not any("bad" in k for k in torchalloc.memory_stats())


def test_reset_max_memory_allocated_warns_like_torch(sim: ctypes.CDLL) -> None:
    with pytest.warns(FutureWarning):
        torchalloc.reset_max_memory_allocated()


# ---------------------------------------------------------------------------
# memory_summary: torch's layout
# ---------------------------------------------------------------------------

SUMMARY_ROW_TITLES = [
    "Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
    "Non-releasable memory", "Allocations", "Active allocs", "GPU reserved segments",
    "Non-releasable allocs", "Oversize allocations", "Oversize GPU segments",
]


def test_summary_layout(sim: ctypes.CDLL) -> None:
    malloc(sim, 1000)
    malloc(sim, 1000 * MiB)
    text = torchalloc.memory_summary()
    lines = text.splitlines()
    assert text.endswith("|\n")
    assert all(len(line) == 77 and line[0] == "|" and line[-1] == "|" for line in lines)
    assert "memory summary, device ID 0" in lines[1]
    assert re.search(r"CUDA OOMs: 0 +\| +cudaMalloc retries: 0", lines[3])
    assert lines[5] == "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |"
    titles = [line[2:23].strip() for line in lines[6:] if not line.startswith(("|-", "|="))]
    full = [t for t in titles if not t.startswith("from")]
    assert full == SUMMARY_ROW_TITLES
    assert titles.count("from large pool") == 9 and titles.count("from small pool") == 9
    # Units follow the "all" row: 1000 MiB + 1 KiB shows in MiB on every row of the block.
    allocated = lines[lines.index(next(l for l in lines if "Allocated memory" in l))]
    assert allocated.split("|")[2].strip() == "1000 MiB"
    assert len(lines) == 6 + 9 * 4 + 2 * 2 + 1


def test_summary_abbreviated_drops_pool_rows(sim: ctypes.CDLL) -> None:
    text = torchalloc.memory_summary(abbreviated=True)
    assert "from large pool" not in text
    assert len(text.splitlines()) == 6 + 9 * 2 + 2 * 2 + 1


def test_size_and_count_units() -> None:
    from torchalloc.stats import _format_count, _format_size

    assert _format_size(512, 512) == "   512 B  "
    assert _format_size(700 * 1024, 700 * 1024) == "716800 B  "  # a unit is used from 768 of it
    assert _format_size(3 * MiB, 3 * MiB) == "  3072 KiB"
    assert _format_size(800 * MiB, 800 * MiB) == "   800 MiB"
    assert _format_size(1 * MiB, 800 * MiB) == "     1 MiB"  # the row's unit, not its own
    assert _format_count(5, 5) == "      5   "
    assert _format_count(2_000_000, 2_000_000) == "   2000 K "
