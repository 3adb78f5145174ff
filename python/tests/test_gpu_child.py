"""torchalloc._gpu_child, the half of examples/train_parity.py and bench/step_time.py that needs no GPU:
the child's install and statistics on the sim backend (torch stood in for), the parent's child runs."""
from __future__ import annotations

import ctypes
import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from torchalloc import _gpu_child as child
from torchalloc import _lib


class FakeTorch:
    """Just the torch.cuda.memory calls install_library makes, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        memory = SimpleNamespace(
            CUDAPluggableAllocator=lambda *args: self.calls.append(("allocator", *args)) or "alloc",
            change_current_allocator=lambda alloc: self.calls.append(("change", alloc)),
        )
        self.cuda = SimpleNamespace(memory=memory)


def test_install_library_checks_the_policy_then_installs(sim: ctypes.CDLL, library_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_lib.ENV_LIB, str(library_path))  # restored after: install_library sets it
    torch = FakeTorch()
    with pytest.raises(RuntimeError, match="did not take policy 'exact'"):
        child.install_library(torch, library_path, "exact")  # the sim conf says caching
    assert torch.calls == []
    child.install_library(torch, library_path, "caching")
    assert os.environ[_lib.ENV_LIB] == str(library_path)
    assert torch.calls == [("allocator", str(library_path), "torchalloc_malloc", "torchalloc_free"),
                           ("change", "alloc")]


def test_child_statistics(sim: ctypes.CDLL) -> None:
    ptr = sim.torchalloc_malloc(3 << 20, 0, None)
    sim.torchalloc_free(ptr, 3 << 20, 0, None)
    peak_reserved, peak_allocated = child.peaks(0)
    assert peak_allocated >= 3 << 20 and peak_reserved >= peak_allocated
    assert set(child.counters(0)) == set(_lib.layout("torchalloc_stats").fields("torch", "misuse", "torchalloc"))
    assert child.counters(0)["num_device_alloc"] >= 1
    child.empty_cache(0)
    child.reset_peaks(0)
    assert child.peaks(0) == (0, 0)


def test_run_child_reads_the_tagged_line_or_says_why_not(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import sys
        if sys.argv[1:3] == ["--child", "ok"]:
            print("noise")
            print('TAG {"x": 1}')
        else:
            print("it broke", file=sys.stderr)
            sys.exit(3)
    """))
    env = dict(os.environ)
    assert child.run_child(script, ["ok"], env, 60, "TAG ") == {"x": 1}
    failed = child.run_child(script, ["bad"], env, 60, "TAG ")
    assert failed["error"] == "child exited with status 3 and no result" and "it broke" in failed["stderr"]
    assert child.tail("a\nb\nc\n", 2) == "b\nc"


def test_library_missing_says_how_to_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert child.library_missing(tmp_path / "nope.so")
    assert "cmake -S . -B build" in capsys.readouterr().err
    present = tmp_path / "lib.so"
    present.write_bytes(b"")
    assert not child.library_missing(present)


def test_skip_reason_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert (child.skip_reason() or "").startswith("torch is not installed")
