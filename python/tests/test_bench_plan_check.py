"""bench/plan_check.py without a GPU: the runs it plans, SKIP, argument errors, and its CPU parts -- the
prediction from a log (against runs written at the sizes predicted), the bisection, the table.

The figures come from a GPU run (BENCHMARKS.md when measured); here CI checks that the script is not broken
and that what it computes on the CPU is right."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "plan_check.py"
sys.path[:0] = [str(REPO / "bench"), str(Path(__file__).resolve().parent)]

import plan_check  # noqa: E402
from plan_runs import training, write  # noqa: E402

from torchalloc.log.trace import load_trace  # noqa: E402
from torchalloc.replay.engine import INSTALL_DEFAULT, replay_once  # noqa: E402


def script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO / "python"), **(env or {}))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=full_env,
                          timeout=120)


def test_dry_run_lists_the_runs() -> None:
    done = script("--dry-run", "--workloads", "gpt2,llama_prompt")
    assert done.returncode == 0, done.stderr
    runs = done.stdout.strip().splitlines()
    assert runs[:4] == ["gpt2 record torchalloc+stacks batch 4", "gpt2 real torchalloc batch 8",
                        "gpt2 real native batch 8", "gpt2 memtracker native batch 8"]
    assert "llama_prompt record torchalloc+stacks prompt length 512" in runs  # two logs: the law measured
    assert "gpt2: batch 4 recorded, predicted and run at 2x, 4x" in done.stderr
    assert len(script("--dry-run", "--no-memtracker", "--multiples", "2").stdout.splitlines()) == 4 * 3 + 1


def test_without_a_gpu_it_skips() -> None:
    done = script("--workloads", "gpt2", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("SKIP: "), done.stdout


@pytest.mark.parametrize("args", [["--workloads", "gpt3"], ["--multiples", "1"], ["--multiples", "2x"],
                                  ["--steps", "0"]])
def test_argument_errors_are_one_line(args: list[str]) -> None:
    done = script(*args, "--dry-run")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_bisection_finds_the_last_that_fits() -> None:
    largest, probes = plan_check.bisect_largest(8, 16, lambda n: n <= 13)
    assert largest == 13 and probes[0] == (8, True) and (16, False) in probes
    assert plan_check.bisect_largest(8, 16, lambda n: False) == (None, [(8, False)])
    assert plan_check.bisect_largest(8, 16, lambda n: True)[0] == 16
    largest, probes = plan_check.bisect_largest(8, 16, lambda n: None if n == 12 else n <= 13)
    assert largest == 8 and probes == [(8, True), (16, False)]  # a failed run stops the search where it stands


def test_the_prediction_from_a_log_is_the_run_at_that_size(tmp_path: Path, library_path: Path) -> None:
    """The parent's step 2 on runs written by hand: what it predicts at 2x and 4x is what the runs at 2B and 4B
    replay to; from two logs (batch 4 and 8), the same."""
    check = plan_check.Check("synthetic", "synthetic", "batch", 4, 1, True, two_logs=True)
    logs = [write(training(4), tmp_path, "b4.talog"), write(training(8), tmp_path, "b8.talog")]
    got = plan_check.predict(check, logs, [2, 4], 1 << 30)
    assert {(p["multiple"], p["from"], p["policy"]) for p in got} == {
        (2, "one log", INSTALL_DEFAULT), (2, "one log", "caching"), (4, "one log", INSTALL_DEFAULT),
        (4, "one log", "caching"), (4, "two logs", INSTALL_DEFAULT), (4, "two logs", "caching")}
    for p in got:
        real, _ = replay_once(load_trace(write(training(4 * p["multiple"]), tmp_path, f"b{4 * p['multiple']}.talog")),
                              p["policy"], 0)
        assert (p["peak_allocated"], p["peak_reserved"]) == (real["peak_allocated"], real["peak_reserved"]), p
    assert plan_check.predicted_largest(logs[0], 4, 48 << 20) is not None


def test_the_table_sets_predictions_beside_real_runs_and_memtracker() -> None:
    check = plan_check.CHECKS["gpt2"]
    results = plan_check.Results(machine={"gpu": "GPU", "torch": "2.x", "device_total": 80 << 30})
    results.runs += [
        {"check": "gpt2", "what": "real", "variant": "torchalloc", "knob": 8, "peak_allocated": 1000 << 20,
         "peak_reserved": 1100 << 20},
        {"check": "gpt2", "what": "real", "variant": "native", "knob": 8, "peak_allocated": 1000 << 20,
         "peak_reserved": 1500 << 20},
        {"check": "gpt2", "what": "memtracker", "variant": "native", "knob": 8, "estimate": 900 << 20, "seconds": 4.0},
    ]
    results.predictions += [
        {"check": "gpt2", "multiple": 2, "from": "one log", "policy": INSTALL_DEFAULT, "peak_allocated": 1010 << 20,
         "peak_reserved": 1111 << 20, "high_peak_reserved": 1111 << 20, "seconds": 0.5},
        {"check": "gpt2", "multiple": 2, "from": "one log", "policy": "caching", "peak_allocated": 990 << 20,
         "peak_reserved": 1500 << 20, "high_peak_reserved": 1500 << 20, "seconds": 0.5},
    ]
    rows = plan_check.rows(results, [check], [2])
    assert [r["allocator"] for r in rows] == ["torchalloc (default)", "PyTorch's (native)"]
    assert rows[0]["error_allocated_pct"] == pytest.approx(1.0) and rows[0]["error_reserved_pct"] == pytest.approx(1.0)
    assert rows[1]["error_reserved_pct"] == 0.0 and rows[1]["memtracker_error_pct"] == pytest.approx(-10.0)
    text = plan_check.table(rows, [{"workload": "gpt2", "cap": 12 << 30, "real": 13, "predicted": 12,
                                    "probes": [(8, True)]}])
    assert "+1.0%" in text and "-10.0%" in text and "within one step" in text
