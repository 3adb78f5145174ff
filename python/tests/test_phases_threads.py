"""Phases entered on several threads, and names that C would cut (issue 23, finding 7).

The current phase is process-wide (phases.py says what that means with
several threads). A phase() block leaves the occurrence it entered even
when another thread entered a phase after it: thread A enters "a", thread B
enters "b", A leaves first. That used to raise RuntimeError in A and leave
"a" open for ever, credited with every later allocation.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Callable

import pytest

import torchalloc
from torchalloc import _lib

KiB = 1 << 10


def _in_thread(body: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_leaves_before_b(sim: ctypes.CDLL) -> None:
    a_inside, b_inside, a_left, b_may_leave = (threading.Event() for _ in range(4))
    seen: dict[str, str] = {}

    def thread_a() -> None:
        with torchalloc.phase("a"):
            a_inside.set()
            assert b_inside.wait(10)
        seen["a left"] = torchalloc.current_phase()
        a_left.set()

    def thread_b() -> None:
        assert a_inside.wait(10)
        with torchalloc.phase("b"):
            b_inside.set()
            assert b_may_leave.wait(10)

    ta, errors_a = _in_thread(thread_a)
    tb, errors_b = _in_thread(thread_b)
    assert a_left.wait(10)
    block = sim.torchalloc_malloc(4 * KiB, 0, None)  # while only "b" is open
    assert torchalloc.current_phase() == "b"
    b_may_leave.set()
    ta.join(10)
    tb.join(10)
    assert errors_a == [] and errors_b == []
    assert seen["a left"] == "b"
    assert torchalloc.current_phase() == "default"
    stats = torchalloc.phase_stats()
    assert stats["a"].occurrences == 1 and stats["a"].allocated_count == 0
    assert stats["b"].occurrences == 1 and stats["b"].allocated_bytes == 4 * KiB
    sim.torchalloc_free(block, 4 * KiB, 0, None)


def test_one_phase_object_on_several_threads(sim: ctypes.CDLL) -> None:
    """A decorated function running on two threads at once: each call leaves its own entry."""
    inside = threading.Barrier(2, timeout=10)

    @torchalloc.phase("work")
    def work() -> None:
        inside.wait()  # both are inside "work" now
        inside.wait()

    threads = [_in_thread(work) for _ in range(2)]
    for thread, errors in threads:
        thread.join(10)
        assert errors == []
    assert torchalloc.current_phase() == "default"
    assert torchalloc.phase_stats("work").occurrences == 2


def test_many_threads_in_any_order(sim: ctypes.CDLL) -> None:
    def body(name: str) -> Callable[[], None]:
        def run() -> None:
            for _ in range(200):
                with torchalloc.phase(name):
                    p = sim.torchalloc_malloc(512, 0, None)
                    sim.torchalloc_free(p, 512, 0, None)

        return run

    threads = [_in_thread(body(f"t{i}")) for i in range(4)]
    for thread, errors in threads:
        thread.join(60)
        assert errors == []
    assert torchalloc.current_phase() == "default"


@pytest.mark.parametrize("name", ["a\0b", "\0", "forward\0"])
def test_a_nul_in_a_phase_name_is_refused(sim: ctypes.CDLL, name: str) -> None:
    from torchalloc import phases

    before = torchalloc.phase_names()
    with pytest.raises(ValueError, match="NUL"):
        torchalloc.phase(name)
    with pytest.raises(ValueError, match="NUL"):
        phases.begin(name)
    with pytest.raises(ValueError, match="NUL"):
        phases.end(name)
    assert torchalloc.phase_names() == before  # nothing interned under a cut name
    assert torchalloc.current_phase() == "default"


def test_the_c_entry_refuses_a_nul_too(sim: ctypes.CDLL) -> None:
    raw = b"fwd\0x"
    assert _lib.lib().torchalloc_phase_enter(raw, len(raw)) == -1
    assert "NUL" in _lib.last_error()


def test_a_nul_in_a_marker_label_is_refused(sim: ctypes.CDLL, tmp_path: Path) -> None:
    torchalloc.configure(backend="sim", log=tmp_path / "run.talog")
    with pytest.raises(ValueError, match="NUL"):
        torchalloc.mark("step\0 1")
    assert torchalloc.mark("step 1") is True
    _lib.lib().torchalloc_log_close()
