"""Phases and markers from Python, on the sim backend."""
from __future__ import annotations

import ctypes
import threading
import warnings
from pathlib import Path

import pytest

import torchalloc
from torchalloc import _lib

KiB = 1 << 10


def test_context_manager_sets_and_restores(sim: ctypes.CDLL) -> None:
    assert torchalloc.current_phase() == "default"
    with torchalloc.phase("load"):
        assert torchalloc.current_phase() == "load"
        with torchalloc.phase("parse"):
            assert torchalloc.current_phase() == "parse"
        assert torchalloc.current_phase() == "load"
    assert torchalloc.current_phase() == "default"
    assert torchalloc.phase_names()[:3] == ["default", "load", "parse"]


def test_restored_when_the_body_raises(sim: ctypes.CDLL) -> None:
    with pytest.raises(KeyError):
        with torchalloc.phase("boom"):
            raise KeyError("body")
    assert torchalloc.current_phase() == "default"


def test_decorator_including_recursion(sim: ctypes.CDLL) -> None:
    seen: list[str] = []
    torchalloc.memory_allocated()  # a device counts occurrences once its heap exists

    @torchalloc.phase("step")
    def step(depth: int) -> int:
        seen.append(torchalloc.current_phase())
        return depth if depth == 0 else step(depth - 1)

    assert step(2) == 0
    assert seen == ["step"] * 3
    assert torchalloc.current_phase() == "default"
    assert torchalloc.phase_stats("step").occurrences == 3


def test_allocations_are_accounted_to_the_phase(sim: ctypes.CDLL) -> None:
    outside = sim.torchalloc_malloc(8 * KiB, 0, None)
    with torchalloc.phase("fwd"):
        kept = sim.torchalloc_malloc(4 * KiB, 0, None)
        temp = sim.torchalloc_malloc(2 * KiB, 0, None)
        sim.torchalloc_free(temp, 2 * KiB, 0, None)
    fwd = torchalloc.phase_stats("fwd")
    assert fwd.allocated_bytes == 6 * KiB and fwd.allocated_count == 2
    assert fwd.freed_bytes == 2 * KiB
    assert fwd.live_bytes == 4 * KiB and fwd.live_peak_bytes == 6 * KiB
    assert fwd.last_persistent_bytes == 4 * KiB and fwd.last_transient_bytes == 2 * KiB
    assert torchalloc.phase_stats()["default"].allocated_bytes == 8 * KiB

    # A block belongs to the phase that allocated it, wherever it is freed.
    sim.torchalloc_free(kept, 4 * KiB, 0, None)
    assert torchalloc.phase_stats("fwd").live_bytes == 0
    sim.torchalloc_free(outside, 8 * KiB, 0, None)


def test_phase_is_process_wide(sim: ctypes.CDLL) -> None:
    """The autograd engine allocates on its own threads for the main thread's phase."""
    seen: list[str] = []
    with torchalloc.phase("backward"):
        worker = threading.Thread(target=lambda: seen.append(torchalloc.current_phase()))
        worker.start()
        worker.join()
    assert seen == ["backward"]


def test_out_of_order_exit_leaves_that_phase(sim: ctypes.CDLL) -> None:
    """phase() leaves the occurrence it entered (issue 23: this used to raise and leave it open)."""
    outer = torchalloc.phase("outer")
    outer.__enter__()
    with torchalloc.phase("inner"):
        outer.__exit__(None, None, None)
        assert torchalloc.current_phase() == "inner"
    assert torchalloc.current_phase() == "default"


def test_out_of_order_end_by_name_is_an_error(sim: ctypes.CDLL) -> None:
    """begin()/end() stay innermost-only."""
    from torchalloc import phases

    phases.begin("outer")
    phases.begin("inner")
    with pytest.raises(RuntimeError, match="innermost phase is 'inner'"):
        phases.end("outer")
    phases.end("inner")
    phases.end("outer")
    assert torchalloc.current_phase() == "default"


def test_failing_end_does_not_mask_the_body_exception(sim: ctypes.CDLL) -> None:
    from torchalloc import phases

    p = torchalloc.phase("a")
    p.__enter__()
    phases.end("a")  # its occurrence is left behind its back: leaving it again fails
    with pytest.warns(RuntimeWarning, match="cannot end phase 'a'"):
        assert p.__exit__(ValueError, ValueError("x"), None) is None
    assert torchalloc.current_phase() == "default"


def test_bad_names(sim: ctypes.CDLL) -> None:
    with pytest.raises(ValueError):
        torchalloc.phase("")
    with pytest.raises(ValueError):
        torchalloc.phase("x" * 64)
    with pytest.raises(TypeError):
        torchalloc.phase(3)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="never-seen"):
        torchalloc.phase_stats("never-seen")


def test_mark_without_a_log_returns_false(sim: ctypes.CDLL) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torchalloc.mark("epoch 1") is False  # no log open (or no log in this build)
    with pytest.raises(TypeError):
        torchalloc.mark(1)  # type: ignore[arg-type]


def test_mark_writes_into_an_open_log(sim: ctypes.CDLL, tmp_path: Path) -> None:
    if not _lib.has("torchalloc_log_open"):
        pytest.skip("this libtorchalloc has no event log yet")
    path = tmp_path / "run.talog"
    torchalloc.configure(backend="sim", log=path)
    assert torchalloc.mark("epoch 1") is True
    _lib.lib().torchalloc_log_close()
    assert path.stat().st_size > 0
