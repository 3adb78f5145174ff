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
    assert len(searches) == 7 * 3
    assert searches[:3] == ["convnet native", "convnet native+expandable", "convnet torchalloc"]
    assert "llama_generate torchalloc" in searches
    assert "21 searches of ~" in done.stderr and "bisection to 1 % of the peak allocated" in done.stderr
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
    assert "llama: torchalloc's smallest cap 1005 MiB = 1.005x its peak allocated (target <= 1.01): met" in lines
    assert any(line.startswith("llama: 7.4 % below PyTorch's best, native+expandable at 1085 MiB") and
               line.endswith(": met") for line in lines), lines
    text = fit_search.text(fits)
    assert "== llama" in text and "1.005" in text and "n/a: child exited with status 1" in text
    md = fit_search.markdown(fits)
    assert md.splitlines()[0].count("|") == md.splitlines()[2].count("|")
    assert "| llama | torchalloc | 1000 | 1003 | 1.003 | 1005 | 1.005 | 2 |" in md
    assert fits[2].as_dict()["cap_over_allocated"] == pytest.approx(1.005)
