"""tests/fuzz/fuzz_log_decode.py finds what it is meant to find.

run.sh runs the fuzzer for a minute and trusts its exit status; these
check that the status means something: a short clean run passes, and a
decoder that raises anything but LogFormatError, or takes longer than the
per-input bound, fails the run with the input saved.
"""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

FUZZER = Path(__file__).resolve().parents[2] / "tests" / "fuzz" / "fuzz_log_decode.py"


@pytest.fixture
def fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_log_decode", FUZZER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(fuzzer, monkeypatch, tmp_path: Path, *extra: str) -> int:
    monkeypatch.setattr(sys, "argv", ["fuzz_log_decode.py", "--seed", "11", "--save", str(tmp_path), *extra])
    return fuzzer.main()


def test_a_short_run_of_the_real_decoder_passes(fuzzer, monkeypatch, tmp_path: Path, capsys) -> None:
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "2") == 0
    out = capsys.readouterr().out
    assert "0 failures" in out and "LogFormatError" in out and "decoded" in out
    assert not list(tmp_path.iterdir())


def test_an_exception_other_than_log_format_error_fails_with_the_input_saved(fuzzer, monkeypatch, tmp_path: Path,
                                                                             capsys) -> None:
    real = fuzzer.read_log
    calls = []

    def broken(source, *, warn=True):
        calls.append(1)
        if len(calls) > 20:  # the seeds themselves decode first
            raise IndexError("planted")
        return real(source, warn=warn)

    monkeypatch.setattr(fuzzer, "read_log", broken)
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "30") == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "IndexError: planted" in out
    assert len(list(tmp_path.glob("fuzz_log_decode-crash-11-*"))) == 1


def test_an_input_past_the_time_bound_fails(fuzzer, monkeypatch, tmp_path: Path, capsys) -> None:
    real = fuzzer.read_log
    calls = []

    def slow(source, *, warn=True):
        calls.append(1)
        if len(calls) > 20:
            time.sleep(5)
        return real(source, warn=warn)

    monkeypatch.setattr(fuzzer, "read_log", slow)
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "30", "--per-input", "0.2") == 1
    assert "took over 0.2 s" in capsys.readouterr().out
