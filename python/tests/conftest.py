"""Shared fixtures: find (or build) libtorchalloc.so, and a clean sim allocator per test.

The library is taken from $TORCHALLOC_LIB when set. Otherwise it is built
with CMake into build-py/ at the repository root once per session (an
incremental build: cheap when nothing changed), falling back to an existing
build/libtorchalloc.so when that build fails; without either, the tests
that need the library skip with the reason. The chosen path is exported as
$TORCHALLOC_LIB so subprocesses (the GPU tests) load the same file.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))  # run from a checkout without installing

BUILD_DIR = REPO / "build-py"
LIB_NAME = "libtorchalloc.so"

# A device small enough that tests can fill it: 1 GiB, two devices. Ordinary
# segments: the tests pin caching's numbers, PyTorch's byte for byte; the
# default mode (expandable:reclaim) has its own tests (test_reclaim.py).
SIM_CONF = "backend:sim,sim_capacity:1GiB,sim_devices:2,warn:0,oom_report:off,expandable:off"


def _build_library() -> tuple[Path | None, str]:
    cmake = shutil.which("cmake")
    if cmake is None:
        return None, "cmake is not installed"
    configure = [cmake, "-S", str(REPO), "-B", str(BUILD_DIR), "-DTORCHALLOC_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"]
    build = [cmake, "--build", str(BUILD_DIR), "--target", "torchalloc", "-j", str(os.cpu_count() or 1)]
    for command in (configure, build):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    return BUILD_DIR / LIB_NAME, ""


def _locate_library() -> tuple[Path | None, str]:
    env = os.environ.get("TORCHALLOC_LIB")
    if env:
        return (Path(env), "") if Path(env).is_file() else (None, f"$TORCHALLOC_LIB={env} is not a file")
    built, why = _build_library()
    if built is not None and built.is_file():
        return built, ""
    fallback = REPO / "build" / LIB_NAME
    if fallback.is_file():
        return fallback, ""
    return None, f"no {LIB_NAME}: {why}"


_LIBRARY, _WHY_NOT = _locate_library()
if _LIBRARY is not None:
    os.environ["TORCHALLOC_LIB"] = str(_LIBRARY.resolve())


@pytest.fixture(scope="session")
def library_path() -> Path:
    if _LIBRARY is None:
        pytest.skip(_WHY_NOT)
    return _LIBRARY


@pytest.fixture
def sim(library_path: Path) -> Iterator[object]:
    """The C library configured with the sim backend; torn down after the test.

    Yields the ctypes handle, for driving torchalloc_malloc/free directly.
    """
    from torchalloc import _lib

    _lib.init(SIM_CONF)
    try:
        yield _lib.lib()
    finally:
        _lib.teardown()


@pytest.fixture(autouse=True)
def _work_in_a_scratch_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in its own folder: an OOM report written to the working directory (no log, no
    oom_report directory: torchalloc-oom-PID-cudaN.txt), or any other file a test or its child leaves
    there, never lands in the repository."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _no_terminal_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools' text fits $COLUMNS, else the terminal, else 100 columns; tests that care set COLUMNS
    themselves. A pytest-xdist worker (tests/run.sh: pytest -n) has COLUMNS=80 and LINES=24 in its
    environment, put there by readline when it is imported, which made reports wrap where the tests read them
    whole."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
