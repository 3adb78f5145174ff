"""Runs of the shapes a leak rule meets, recorded by the C library on the simulated device with Python stacks, for
test_leak_shapes.py.

A run is a list of steps; `Run` drives the library the way a training or generation loop drives PyTorch's
allocator: `mark` writes a step marker, `keep` allocates a block at one of the sites below and holds it in a named
bag until `free` empties the bag, `temporary` allocates and frees at once (an activation). Each site is a
function of its own, so each is its own line in the log's stacks: `site_label(fn)` is how the report names it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

MiB = 1 << 20
CONF = "backend:sim,sim_capacity:16GiB,warn:0,oom_report:off,stacks:1"


def leaky(lib: Any, size: int) -> int:
    return lib.torchalloc_malloc(size, 0, None)  # the line a leak allocates at (history.append(loss), say)


def cycling(lib: Any, size: int) -> int:
    return lib.torchalloc_malloc(size, 0, None)  # a gradient per micro-step, a KV cache, a per-epoch buffer


def warming(lib: Any, size: int) -> int:
    return lib.torchalloc_malloc(size, 0, None)  # a cache filling to its bound


def noisy(lib: Any, size: int) -> int:
    return lib.torchalloc_malloc(size, 0, None)  # blocks that come and go, a drawn number and size at each marker


def activation(lib: Any, size: int) -> int:
    return lib.torchalloc_malloc(size, 0, None)  # freed within the step


def site_label(fn: Callable[..., int]) -> str:
    return f"leak_runs.py:{fn.__code__.co_firstlineno + 1} {fn.__name__}"


class Run:
    """The library's calls of one run (module docstring)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.bags: dict[str, list[tuple[int, int]]] = {}

    def mark(self, label: str) -> None:
        assert self.lib.torchalloc_mark(label.encode()) == 0

    def keep(self, bag: str, site: Callable[[Any, int], int], size: int) -> None:
        ptr = site(self.lib, size)
        assert ptr
        self.bags.setdefault(bag, []).append((ptr, size))

    def free(self, bag: str) -> None:
        for ptr, size in self.bags.pop(bag, []):
            self.lib.torchalloc_free(ptr, size, 0, None)

    def temporary(self, size: int = 2 * MiB) -> None:
        ptr = activation(self.lib, size)
        assert ptr
        self.lib.torchalloc_free(ptr, size, 0, None)


def record(path: Path, loop: Callable[[Run], None], before: Callable[[Run], None] | None = None) -> Path:
    """Runs `loop` with the log at `path`; `before`, when given, runs first with no log (a log opened mid-run).
    The library is the sim fixture's (loaded once per process), configured here and torn down after."""
    from torchalloc import _lib

    _lib.teardown()  # the fixture's configuration: this one logs, with stacks
    lib = _lib.lib()
    if before is None:
        _lib.init(f"{CONF},log:{path}")
    else:
        _lib.init(CONF)
    run = Run(lib)
    try:
        if before is not None:
            before(run)
            assert lib.torchalloc_log_open(os.fsencode(str(path))) == 0, _lib.last_error()
        loop(run)
    finally:
        _lib.teardown()  # closes the log
    return path
