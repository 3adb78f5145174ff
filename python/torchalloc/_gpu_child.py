"""Shared by the GPU scripts that run once per allocator in a child process each
(examples/train_parity.py, bench/step_time.py).

PyTorch chooses its CUDA allocator once per process, before CUDA starts, so
such a script runs itself again with ``--child`` for every allocator it
compares; the child prints one line, a tag then JSON, and the parent reads
it back. This module holds both halves' common parts:

- the parent's: `skip_reason` (no torch, no GPU), `library_missing`,
  `run_child` and `tail`;
- the child's: `install_library` (the library at --lib as PyTorch's
  allocator, the plain CUDAPluggableAllocator route that README.md shows),
  the statistics it reads through this package's bindings (`peaks`,
  `counters`, `reset_peaks`, `empty_cache`) and `print_result`.

The scripts run from a checkout: they put its python/ directory first on
sys.path. Runtime only (no numpy); nothing in the package imports this.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from . import _lib, stats

BUILD_HINT = (
    "build it from the repository root with:\n"
    "  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF && cmake --build build -j"
)


# ---------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------


def skip_reason() -> str | None:
    """Why this machine cannot run the script (no torch, no CUDA GPU), or None when it can."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not installed ({e})"
    if not torch.cuda.is_available():
        return (f"no CUDA GPU: torch.cuda.is_available() is False "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    return None


def library_missing(lib: Path) -> bool:
    """True, after saying so on stderr with how to build it, when `lib` is not a file."""
    if lib.is_file():
        return False
    print(f"error: {lib} does not exist; {BUILD_HINT}", file=sys.stderr)
    return True


def tail(text: str, lines: int = 30) -> str:
    """The last `lines` lines of a child's output."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_child(script: str | os.PathLike[str], args: Sequence[str], env: dict[str, str], timeout: float,
              tag: str) -> dict[str, Any]:
    """Run `script --child ARGS` in a fresh interpreter; its result (the JSON after `tag`), or
    {"error": ..., "stderr": ..., "stdout": ...} when it failed, timed out or printed none."""
    cmd = [sys.executable, str(Path(script).resolve()), "--child", *args]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"error": f"timed out after {timeout:.0f} s", "stderr": err}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(tag) and proc.returncode == 0:
            return json.loads(line[len(tag):])
    return {"error": f"child exited with status {proc.returncode} and no result",
            "stderr": proc.stderr, "stdout": proc.stdout}


# ---------------------------------------------------------------------------
# Child
# ---------------------------------------------------------------------------


ROUTES = ("plain", "bridge")


def install_library(torch: Any, lib: Path, policy: str, route: str = "plain") -> None:
    """Make the library at `lib` PyTorch's allocator, configured by $TORCHALLOC_CONF, and check that it
    took `policy`. Must run before CUDA is initialised.

    route "plain": the bare CUDAPluggableAllocator usage README.md shows;
    "bridge": torchalloc.install(bridge=True), the C++ bridge (built on first use).
    """
    # This package's bindings load the very file torch dlopen()s: one copy of the allocator's state.
    os.environ[_lib.ENV_LIB] = str(lib)
    if route == "bridge":
        from . import plug

        plug.install(policy=policy, bridge=True)
    got = (_lib.lib().torchalloc_policy_name() or b"").decode(errors="replace")  # reads TORCHALLOC_CONF now
    if got != policy:
        raise RuntimeError(f"torchalloc did not take policy {policy!r} (TORCHALLOC_CONF="
                           f"{os.environ.get('TORCHALLOC_CONF')!r}): {_lib.last_error() or 'policy is ' + repr(got)}")
    if route == "plain":
        alloc = torch.cuda.memory.CUDAPluggableAllocator(str(lib), "torchalloc_malloc", "torchalloc_free")
        torch.cuda.memory.change_current_allocator(alloc)


def peaks(device: int) -> tuple[int, int]:
    """(peak reserved bytes, peak allocated bytes) of torchalloc on `device`."""
    return stats.max_memory_reserved(device), stats.max_memory_allocated(device)


def counters(device: int) -> dict[str, int]:
    """torchalloc's counters on `device`: torch's (retries, OOMs, device calls), the misuse ones, synchronizes."""
    s = _lib.get_stats(device)
    counters = _lib.layout("torchalloc_stats").fields("torch", "misuse", "torchalloc")
    return {name: int(getattr(s, name)) for name in counters}


def reset_peaks(device: int) -> None:
    """torch.cuda.reset_peak_memory_stats() does not reach a pluggable allocator's stats: ask the library."""
    stats.reset_peak_memory_stats(device)


def empty_cache(device: int) -> None:
    """torch.cuda.empty_cache() does not reach a plain pluggable allocator (no reset hook): ask the library."""
    stats.empty_cache(device)


def print_result(tag: str, result: dict[str, Any]) -> None:
    """The child's one line for the parent (see run_child)."""
    print(tag + json.dumps(result), flush=True)
