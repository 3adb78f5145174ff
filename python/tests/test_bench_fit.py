"""bench/fit.py without a GPU: the plan, SKIP, argument errors, the bisection and the table.

The figures come from the lead's GPU run (BENCHMARKS.md); here CI checks
that the search finds what it should on a made-up allocator and that the
script is not broken.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "fit.py"
sys.path.insert(0, str(REPO / "bench"))

from suite import fit_search  # noqa: E402
from suite.fit_search import MiB, Fit, smallest_cap  # noqa: E402


def fit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO / "python"), **(env or {}))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=full_env,
                          timeout=120)


def test_dry_run_prints_the_plan_without_a_gpu() -> None:
    done = fit("--dry-run")
    assert done.returncode == 0, done.stderr
    searches = done.stdout.strip().splitlines()
    # the transformer workloads and the inference one x native, PyTorch's expandable, the default, expandable:2
    assert len(searches) == 4 * 4
    assert searches[:4] == ["llama native", "llama native+expandable", "llama torchalloc", "llama caching+compact"]
    assert {s.split()[0] for s in searches} == {"llama", "moe", "gpt2", "llama_generate"}
    assert "16 searches of ~" in done.stderr and "bisection to 0.5 % of the peak allocated" in done.stderr
    assert "TORCHALLOC_CONF=policy:caching,expandable:compact" in done.stderr
    done = fit("--dry-run", "--workloads", "llama", "--variants", "native,native+async,torchalloc,caching")
    assert done.stdout.strip().splitlines() == ["llama native", "llama native+async", "llama torchalloc",
                                                "llama caching"]


def test_without_a_gpu_it_skips() -> None:
    done = fit("--workloads", "convnet", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("SKIP: "), done.stdout


@pytest.mark.parametrize("args, names", [
    (["--workloads", "lama"], ["lama", "llama"]),
    (["--variants", "torchalloc+compact"], ["torchalloc+compact"]),
    (["--precision", "0"], ["--precision"]),
    (["--steps", "0"], ["--steps"]),
])
def test_argument_errors_are_one_line(args: list[str], names: list[str]) -> None:
    done = fit(*args, "--dry-run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    for name in names:
        assert name in done.stderr


@pytest.mark.parametrize("needs, allocated, reserved", [
    (1000 * MiB, 990 * MiB, 1200 * MiB),  # fits between the peaks
    (995 * MiB, 990 * MiB, 995 * MiB),    # exactly at its peak reserved
    (1300 * MiB, 1000 * MiB, 1240 * MiB),  # under a cap it needs more than it reserved without one
])
def test_bisection_finds_the_smallest_cap_to_the_precision(needs: int, allocated: int, reserved: int) -> None:
    cap, tried = smallest_cap(lambda c: c >= needs, allocated, reserved)
    assert cap is not None and needs <= cap <= needs + max(MiB, int(0.01 * allocated)) + MiB, (cap, tried)
    assert all(ok == (c >= needs) for c, ok in tried)
    assert len(tried) <= 10
    assert all(c % MiB == 0 for c, _ in tried)


def test_bisection_gives_up_when_nothing_fits() -> None:
    cap, tried = smallest_cap(lambda c: False, 1000 * MiB, 1100 * MiB)
    assert cap is None and len(tried) == fit_search.RAISES + 1
    assert tried[-1][0] > tried[0][0]  # raised each time


def test_targets_and_tables() -> None:
    fits = [Fit("llama", "native", 1000 * MiB, 1125 * MiB, 1130 * MiB, [(1125 * MiB, False), (1130 * MiB, True)]),
            Fit("llama", "native+expandable", 1000 * MiB, 1083 * MiB, 1085 * MiB, [(1085 * MiB, True)]),
            Fit("llama", "torchalloc", 1000 * MiB, 1003 * MiB, 1005 * MiB, [(1005 * MiB, True)]),
            Fit("convnet", "torchalloc", 100 * MiB, None, None, [], error="child exited with status 1")]
    lines = fit_search.targets(fits)
    assert lines == ["llama: torchalloc's smallest cap 1005 MiB = 1.005x its peak allocated (goal <= 1.01x): met; "
                     "PyTorch's best, native+expandable, 1085 MiB = 1.085x its own (+7.4 % for torchalloc)"]
    text = fit_search.text(fits)
    assert "== llama" in text and "1.005" in text and "n/a: child exited with status 1" in text
    md = fit_search.markdown(fits)
    assert md.splitlines()[0].count("|") == md.splitlines()[2].count("|")
    assert "| llama | torchalloc | 1000 | 1003 | 1.003 | 1005 | 1.005 | 2 |" in md
    assert fits[2].as_dict()["cap_over_allocated"] == pytest.approx(1.005)
