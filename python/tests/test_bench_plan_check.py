"""bench/plan_check.py without a GPU: the runs it plans, SKIP, argument errors, and its CPU parts -- the
prediction from a log (against runs written at the sizes predicted), the bisection, the table.

The figures come from a GPU run (BENCHMARKS.md when measured); here CI checks that the script is not broken
and that what it computes on the CPU is right."""
from __future__ import annotations

import json
import os
import shutil
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
    assert runs[:7] == ["gpt2 record torchalloc+stacks batch 4", "gpt2 real torchalloc batch 8",
                        "gpt2 real native batch 8", "gpt2 real torchalloc batch 16", "gpt2 real native batch 16",
                        "gpt2 memtracker native batch 8", "gpt2 memtracker native batch 16"]  # the real runs first
    assert "llama_prompt record torchalloc+stacks prompt length 512" in runs  # two logs: the law measured
    assert "gpt2: batch 4 recorded, predicted and run at 2x, 4x" in done.stderr
    assert len(script("--dry-run", "--no-memtracker", "--multiples", "2").stdout.splitlines()) == 4 * 3 + 1


def test_without_a_gpu_it_skips() -> None:
    done = script("--workloads", "gpt2", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("SKIP: "), done.stdout


@pytest.mark.parametrize("args", [["--workloads", "gpt3"], ["--multiples", "1"], ["--multiples", "2x"],
                                  ["--steps", "0"], ["--out", "no/such/folder/out.json"], ["--budget", "0"]])
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


@pytest.mark.parametrize("start, runs", [(13, 3), (12, 5), (15, 5), (2, 4), (None, 5)])
def test_bisection_from_the_prediction_finds_the_same_in_fewer_runs(start: int | None, runs: int) -> None:
    """From plan's answer: lo, then the answer and the one past it when plan is right; steps doubling out from
    a wrong answer until the real one is bracketed."""
    for last in range(7, 18):
        largest, probes = plan_check.bisect_largest(8, 16, lambda n: n <= last, start=start)
        assert largest == (None if last < 8 else min(last, 16)), (start, last, probes)
    largest, probes = plan_check.bisect_largest(8, 16, lambda n: n <= 13, start=start)
    assert largest == 13 and len(probes) == runs, probes


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


def test_memtracker_on_data_dependent_shapes_is_said_as_such() -> None:
    check = plan_check.CHECKS["detection"]
    results = plan_check.Results(machine={"gpu": "GPU", "torch": "2.x", "device_total": 80 << 30})
    stderr = {"data": "torch._subclasses.fake_tensor.DataDependentOutputException: aten._local_scalar_dense.default",
              "other": "RuntimeError: _apply(): Couldn't swap Conv2d.weight"}
    for knob, why in ((4, "data"), (8, "other")):
        results.runs += [
            {"check": "detection", "what": "real", "variant": v, "knob": knob, "peak_allocated": 1000 << 20,
             "peak_reserved": 1100 << 20} for v in ("torchalloc", "native")]
        results.runs.append({"check": "detection", "what": "memtracker", "variant": "native", "knob": knob,
                             "error": "child exited with status 1 and no result", "stderr": stderr[why]})
        results.predictions += [
            {"check": "detection", "multiple": knob // 2, "from": "one log", "policy": p, "peak_allocated": 1000 << 20,
             "peak_reserved": 1100 << 20, "high_peak_reserved": 1100 << 20, "seconds": 0.1}
            for p in (INSTALL_DEFAULT, "caching")]
    rows = plan_check.rows(results, [check], [2, 4])
    assert [r["memtracker_error"] for r in rows] == [plan_check.DATA_DEPENDENT] * 2 + ["child exited with status 1 "
                                                                                      "and no result"] * 2
    body = plan_check.table(rows, []).splitlines()[2:6]
    assert [line.split()[-4] for line in body] == ["data-dep."] * 2 + ["failed"] * 2


class FakeGpu:
    """bench/plan_check.py's children answered on the CPU: a recording run writes plan_runs' training log at its
    batch where the library would write its log; a real run (or a bisection's, under its cap) replays the
    training log written at its batch under the allocator it names; MemTracker estimates 90 % of allocated."""

    TOTAL = 1 << 30

    def __init__(self, folder: Path) -> None:
        self.folder, self.calls, self.timeouts = folder, [], []

    def run_child(self, script: Path, argv: list[str], env: dict[str, str], timeout: float,
                  tag: str) -> dict[str, object]:
        def arg(name: str) -> str:
            return argv[argv.index(name) + 1]

        variant, batch, cap = arg("--variant"), int(arg("--run-batch")), float(arg("--cap"))
        self.calls.append((variant, batch, cap))
        self.timeouts.append(timeout)
        machine = {"torch": "2.x", "gpu": "fake", "device_total": self.TOTAL}
        log = write(training(batch), self.folder, f"b{batch}.talog")
        policy = INSTALL_DEFAULT if variant.startswith("torchalloc") else "caching"
        got, _ = replay_once(load_trace(log), policy, int(cap * self.TOTAL))
        if "--memtracker" in argv:
            return {"estimate": int(got["peak_allocated"] * 0.9), "seconds": 1.5, **machine}
        if variant == plan_check.RECORD:
            where = env["TORCHALLOC_CONF"].split("log:")[1].split(",")[0]
            shutil.copy(log, where.replace("%p", str(len(self.calls))))
        return {"oom": bool(got["oom"]), "peak_allocated": got["peak_allocated"],
                "peak_reserved": got["peak_reserved"], **machine}


def test_the_parent_end_to_end_on_fake_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], library_path: Path) -> None:
    """The parent as the GPU runs it, its children answered on the CPU (FakeGpu): the runs in order, the
    prediction from the recorded log, --out, the table (the fake real runs are what plan models: no error), the
    bisection from plan's answer, the closing JSON line, the exit status; every child's timeout within the
    budget."""
    gpu = FakeGpu(tmp_path)
    monkeypatch.setattr(plan_check.gpu_child, "run_child", gpu.run_child)
    monkeypatch.setitem(plan_check.CHECKS, "synthetic", plan_check.Check("synthetic", "synthetic", "batch", 4, 1,
                                                                         True))
    out = tmp_path / "out.json"
    args = plan_check.parse_args(["--workloads", "synthetic", "--out", str(out), "--lib", str(library_path),
                                  "--budget", "300"])
    assert plan_check.Parent(args).main() == 0
    printed = capsys.readouterr().out
    assert [(v, b) for v, b, cap in gpu.calls if not cap][:7] == [
        ("torchalloc+stacks", 4), ("torchalloc", 8), ("native", 8), ("torchalloc", 16), ("native", 16),
        ("native", 8), ("native", 16)]
    assert max(gpu.timeouts) <= 300
    saved = json.loads(out.read_text())
    assert {(p["multiple"], p["policy"]) for p in saved["predictions"]} == {
        (2, INSTALL_DEFAULT), (2, "caching"), (4, INSTALL_DEFAULT), (4, "caching")}
    rows = json.loads(printed.strip().splitlines()[-1])["rows"]
    assert len(rows) == 4 and all(r["error_allocated_pct"] == 0 and r["error_reserved_pct"] == 0 for r in rows)
    assert all(r["memtracker_error_pct"] == pytest.approx(-10, abs=0.01) for r in rows)
    (b,) = saved["bisections"]
    assert b["real"] == b["predicted"] and 8 <= b["real"] < 16 and len(b["probes"]) <= 3
    assert "within one step" in printed and "synthetic  batch 8 (2x)" in printed


def test_the_budget_stops_runs_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str], library_path: Path) -> None:
    gpu = FakeGpu(tmp_path)
    monkeypatch.setattr(plan_check.gpu_child, "run_child", gpu.run_child)
    monkeypatch.setitem(plan_check.CHECKS, "synthetic", plan_check.Check("synthetic", "synthetic", "batch", 4, 1,
                                                                         True, startup_s=5))
    args = plan_check.parse_args(["--workloads", "synthetic", "--lib", str(library_path), "--budget", "12"])
    assert plan_check.Parent(args).main() == 0
    assert len(gpu.calls) == 0  # the first run's guess (5 + 10 s) passes the budget: nothing started
    assert "stopped before synthetic record" in capsys.readouterr().out
