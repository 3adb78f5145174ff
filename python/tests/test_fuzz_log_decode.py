"""tests/fuzz/fuzz_log_decode.py finds what it is meant to find.

run.sh runs the fuzzer for FUZZ_SECONDS (30 s) and trusts its exit status; these
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
# read_log calls before the first mutated input: each stored seed, each generated one, and each compressed
# seed read again from a file (fuzz_log_decode.main)
SEED_DECODES = 40


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
        if len(calls) > SEED_DECODES:  # the seeds themselves decode first
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
        if len(calls) > SEED_DECODES:
            time.sleep(5)
        return real(source, warn=warn)

    monkeypatch.setattr(fuzzer, "read_log", slow)
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "30", "--per-input", "0.2") == 1
    assert "took over 0.2 s" in capsys.readouterr().out


def test_the_tools_run_on_the_seeds_and_their_failures_fail_the_run(fuzzer, monkeypatch, tmp_path: Path,
                                                                    capsys) -> None:
    """Issue 23: report, export and replay's trace read every seed (the hostile-* shapes among them) and a
    share of the inputs; an exception from them other than the tools' own refusal is a failure."""
    seeds = {p.name for p in (FUZZER.parent / "corpus" / "decoder").iterdir()}
    assert {"mid-run", "hostile-two-allocs-of-2-63", "hostile-repeated-phase-start", "hostile-oom-of-2-62",
            "hostile-control-characters"} <= seeds
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "2", "--tools", "1") == 0
    assert "tools ran" in capsys.readouterr().out

    import torchalloc.analysis

    real = torchalloc.analysis.analyze
    calls = []

    def broken(log, **kw):
        calls.append(1)
        if len(calls) > 40:  # past the seeds
            raise IndexError("planted in the analysis")
        return real(log, **kw)

    monkeypatch.setattr(torchalloc.analysis, "analyze", broken)
    assert run(fuzzer, monkeypatch, tmp_path, "--seconds", "30", "--tools", "1") == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "IndexError: planted in the analysis" in out


def test_the_generated_seeds_are_small_files_that_inflate_far(fuzzer) -> None:
    """Issue 36: a log followed by many zero slots, compressed, is among the seeds (made at start, not
    stored), read from a file and mutated compressed; the bytes that reach the fuzzer are a few KB."""
    from torchalloc._compressed import decompress

    plain = {p.name: decompress(p.read_bytes()) for p in (FUZZER.parent / "corpus" / "decoder").iterdir()}
    packed, small = fuzzer.generated_seeds(plain)
    assert {"closed-stacks+zeros.xz", "open-when-copied+zeros.gz"} <= set(packed) == set(small)
    for name, data in packed.items():
        assert len(data) < 64 << 10, name
        assert len(decompress(data)) >= fuzzer.ZERO_PAD, name


def test_resealed_mutations_keep_the_checksums(fuzzer) -> None:
    """The two resealing mutations must give slots that pass their checksum: that is how impossible values
    reach the tools instead of being dropped by the decoder."""
    import random

    from torchalloc.log import read_log

    seed = (FUZZER.parent / "corpus" / "decoder" / "closed-stacks").read_bytes()
    rng = random.Random(5)
    resealed = 0
    for _ in range(300):
        data = bytearray(seed)
        while fuzzer.mutate(rng, data, seed) not in ("record field, resealed", "record copied, resealed"):
            data = bytearray(seed)
        resealed += 1
        assert not any("checksum" in d for d in read_log(bytes(data)).damage)
    assert resealed == 300
