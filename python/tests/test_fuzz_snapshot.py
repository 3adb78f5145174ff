"""tests/fuzz/fuzz_snapshot.py finds what it is meant to find: a short clean run passes, its seeds hold the
shared references of issue 36 (and what PyTorch itself shares), and a loader that raises anything but
TraceError, or takes longer than the per-input bound, fails the run with the input saved."""
from __future__ import annotations

import importlib.util
import pickle
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FUZZER = Path(__file__).resolve().parents[2] / "tests" / "fuzz" / "fuzz_snapshot.py"


@pytest.fixture
def fuzzer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_snapshot", FUZZER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(fuzzer: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *extra: str) -> int:
    monkeypatch.setattr(sys, "argv", ["fuzz_snapshot.py", "--seed", "11", "--save", str(tmp_path), *extra])
    return int(fuzzer.main())


def test_a_short_run_passes(fuzzer: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "2") == 0
    out = capsys.readouterr().out
    assert "0 failures" in out and "loaded" in out and "refused: shared reference" in out
    assert "memo reference retargeted" in out and not list(tmp_path.iterdir())


def test_the_seeds_share_what_they_should(fuzzer: ModuleType) -> None:
    """The shared blocks list and segment are written once and named by memo references: small pickles."""
    seeds = fuzzer.seeds()
    names = {"small-p2", "pytorch-like-p4", "shared-blocks-p2", "shared-segment-p4", "shared-blocks-p2.xz"}
    assert names <= set(seeds)
    shared = pickle.loads(seeds["shared-blocks-p4"])["segments"]
    assert all(s["blocks"] is shared[0]["blocks"] for s in shared) and len(seeds["shared-blocks-p4"]) < 4096
    entries = pickle.loads(seeds["pytorch-like-p2"])["device_traces"][0]
    assert all(e["frames"] is entries[0]["frames"] for e in entries)


def _failing_after(fuzzer: ModuleType, monkeypatch: pytest.MonkeyPatch, seeds: int, fail: Any) -> None:
    real = fuzzer.load_trace
    calls: list[int] = []

    def patched(path: Path) -> Any:
        calls.append(1)
        if len(calls) > seeds:  # the seeds themselves load first
            fail()
        return real(path)

    monkeypatch.setattr(fuzzer, "load_trace", patched)


def test_an_exception_other_than_trace_error_fails_with_the_input_saved(
        fuzzer: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    def planted() -> None:
        raise TypeError("planted")

    _failing_after(fuzzer, monkeypatch, len(fuzzer.seeds()), planted)
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "30") == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "TypeError: planted" in out
    assert len(list(tmp_path.glob("fuzz_snapshot-crash-11-*"))) == 1


def test_an_input_past_the_time_bound_fails(fuzzer: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Even where the loader turns every Exception into TraceError, as the unpickler's caller does."""
    def slow() -> None:
        try:
            time.sleep(5)
        except Exception as e:  # noqa: BLE001 -- the timer must not be caught here
            raise fuzzer.TraceError(f"caught {e!r}") from None

    _failing_after(fuzzer, monkeypatch, len(fuzzer.seeds()), slow)
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "30", "--per-input", "0.2") == 1
    assert "took over 0.2 s" in capsys.readouterr().out
