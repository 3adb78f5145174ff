"""Shared by the puzzle_*.py examples: start torchalloc with a log, then explain the log.

Each puzzle calls `start()` first thing (before any CUDA use), runs on the
GPU with phases and markers, then `finish()` closes the log and analyses it
with torchalloc.analysis -- the same code as `torchalloc report`. Without
torch or a CUDA GPU, start() prints "SKIP: <reason>" and exits 77.

The last line a puzzle prints is "RESULT {json}": the facts its GPU test
(python/tests/test_examples_gpu.py) checks.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one

import torchalloc  # noqa: E402


def skip(reason: str) -> None:
    example_start.cannot_run(reason)


def start(name: str) -> tuple[Any, str]:
    """torchalloc.install(policy="caching", expandable="off", log=..., stacks=True), first thing: PyTorch's own
    segments, the ones the classic puzzles are about (puzzle 7's fragmentation needs them). Returns (torch, log
    path)."""
    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("no CUDA GPU")
    try:
        torchalloc.library_path()
    except Exception as e:  # noqa: BLE001 -- any reason the library cannot load
        skip(f"libtorchalloc.so not found ({str(e).splitlines()[0]}); build it: cmake -S . -B build && cmake --build build")
    log = os.environ.get("PUZZLE_LOG") or str(Path(tempfile.gettempdir()) / f"torchalloc-{name}-{os.getpid()}.talog")
    # stack_depth 64: torch.utils.checkpoint and nn.Module calls put many torch frames above the user's line
    torchalloc.install(policy="caching", expandable="off", log=log, stacks=True, stack_depth=64, warn=0)
    return torch, log


def here() -> int:
    """The line number of the caller: `LINE = here() + 1` names the statement on the next line.

    sys._getframe, not inspect.currentframe() stored in a local: that makes a
    frame cycle which keeps the caller's frame -- and its local tensors -- alive
    until the garbage collector runs, changing the very lifetimes shown."""
    return sys._getframe(1).f_lineno


def finish(log: str) -> Any:
    """Close the log and analyse it (torchalloc.analysis.analyze). Returns the Analysis."""
    from torchalloc import _lib
    from torchalloc.analysis import analyze

    if _lib.has("torchalloc_log_close"):
        _lib.lib().torchalloc_log_close()
    return analyze(log)


def reasons_at(a: Any, file: str, line: int) -> dict[str, int]:
    """{reason: block bytes} for the blocks allocated at file:line (the report's lifetime rows of that line)."""
    out: dict[str, int] = {}
    for r in rows_at(a, file, line):
        out[r.reason] = out.get(r.reason, 0) + r.bytes
    return out


def rows_at(a: Any, file: str, line: int) -> list[Any]:
    """The report's lifetime rows (every one, not only the top) whose allocation site is file:line."""
    base = os.path.basename(file)
    return [r for r in a.lifetimes() if r.site.startswith(f"{base}:{line} ")]


def explain_line(a: Any, file: str, line: int, what: str) -> list[dict[str, Any]]:
    """Print the report's lifetime rows for file:line; return them as dicts."""
    from torchalloc.units import fmt_bytes

    rows = rows_at(a, file, line)
    print(f"\n{what}  [{os.path.basename(file)}:{line}]")
    for r in rows:
        print(f"  {r.count} blocks, {fmt_bytes(r.bytes)}: {r.explanation}")
    if not rows:
        print("  (no blocks allocated on this line)")
    return [r.to_dict() for r in rows]


def print_phases(a: Any) -> None:
    print()
    for p in a.phases():
        print(f"  {p.sentence}")


def result(**facts: Any) -> None:
    print("RESULT " + json.dumps(facts, default=str))
