"""GPU: each examples/puzzle_*.py runs, and the report gives the right reason for its puzzle.

Each puzzle runs in its own process (torchalloc.install must precede CUDA
init) and ends with a "RESULT {json}" line of facts taken from the report's
analysis of its own log; the assertions here check those facts, not only
that something printed. Skipped without torch or a CUDA GPU.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_child import child_env, gpu_skip_reason

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
MiB = 1 << 20


_WHY = gpu_skip_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"GPU examples: {_WHY}")


def run_puzzle(name: str, library_path: Path, tmp_path: Path) -> dict[str, Any]:
    env = child_env(library_path, PUZZLE_LOG=str(tmp_path / f"{name}.talog"))
    done = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True, text=True, env=env,
                          timeout=600)
    print(done.stdout)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert "SKIP" not in done.stdout.splitlines()[0], done.stdout
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"{name} printed no RESULT line:\n{done.stdout[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_puzzle_1_first_forward_extra_is_cublas_workspace(library_path: Path, tmp_path: Path) -> None:
    r = run_puzzle("puzzle_1_first_forward", library_path, tmp_path)
    after = r["after"]  # allocated after minus before each forward
    assert after[1] == after[2] == 0, "later forwards must leave nothing behind"
    assert r["extra"] > 0, "the first forward should leave more memory allocated"
    left = r["left_behind"]
    assert left and all(row["reason"] == "persistent" for row in left), left
    assert sum(row["bytes"] for row in left) == r["extra"]
    workspace = [row for row in left if row["category"] == "library workspace"]
    assert workspace, f"no block of a cuBLAS workspace size: {left}"


def test_puzzle_2_no_grad_frees_at_once_grad_saves_for_backward(library_path: Path, tmp_path: Path) -> None:
    r = run_puzzle("puzzle_2_no_grad", library_path, tmp_path)
    no_grad, grad = r["no_grad"], r["grad"]
    assert no_grad.get("temporary", 0) >= 2 * 512 * 4096 * 4, no_grad  # the hidden activations
    assert "saved for backward" not in no_grad, no_grad
    assert grad.get("saved for backward", 0) >= 2 * 512 * 4096 * 4, grad


def test_puzzle_3_gradients_appear_in_backward_and_stay(library_path: Path, tmp_path: Path) -> None:
    r = run_puzzle("puzzle_3_gradients", library_path, tmp_path)
    assert r["backward_persistent"].get("gradients", 0) >= r["param_bytes"], r
    assert abs(r["gradients"] - r["param_bytes"]) <= 0.01 * r["param_bytes"] + 64 * 1024, r
    assert abs(r["parameters"] - r["param_bytes"]) <= 0.01 * r["param_bytes"] + 64 * 1024, r
    assert "gradients" in r["backward_sentence"] and "stays" in r["backward_sentence"], r["backward_sentence"]


def test_puzzle_4_checkpoint_keeps_only_the_submodule_output(library_path: Path, tmp_path: Path) -> None:
    r = run_puzzle("puzzle_4_checkpoint", library_path, tmp_path)
    assert r["saved_checkpoint"] < r["saved_plain"], r
    # what checkpointing stopped saving: block 1's inner activation (its ReLU output)
    assert r["saved_plain"] - r["saved_checkpoint"] >= 0.9 * r["hidden_bytes"], r
    ckpt_reasons = {row["reason"]: row["bytes"] for row in r["ckpt_line"]}
    assert ckpt_reasons.get("temporary", 0) >= r["hidden_bytes"], r["ckpt_line"]  # freed at once in forward
    plain_reasons = {row["reason"]: row["bytes"] for row in r["plain_line"]}
    assert plain_reasons.get("saved for backward", 0) >= r["hidden_bytes"], r["plain_line"]
    assert r["recompute"] >= r["hidden_bytes"], r  # backward recomputes block 1


def test_puzzle_5_temporary_function_return_rebinding(library_path: Path, tmp_path: Path) -> None:
    r = run_puzzle("puzzle_5_x_plus_1", library_path, tmp_path)
    lines = r["lines"]
    size = 6 * MiB * 4
    assert r["temp"] == {"temporary": size}, r["temp"]
    assert r["local"] == {"freed when its function returned": size}, r["local"]
    assert r["local_free_site"] == [f"puzzle_5_x_plus_1.py:{lines['call']} <module>"], r  # the caller's line
    assert r["first"] == {"freed on rebinding": size}, r["first"]
    assert r["first_free_site"] == [f"puzzle_5_x_plus_1.py:{lines['rebind']} <module>"], r
    assert r["rebind"] == {"freed on rebinding": size}, r["rebind"]


def test_puzzle_6_adam_state_is_two_parameters_persistent(library_path: Path, tmp_path: Path) -> None:
    r = run_puzzle("puzzle_6_adam_first_step", library_path, tmp_path)
    o, p = r["optimizer"], r["param_bytes"]
    state = o["persistent_by_category"].get("optimizer state", 0)
    assert 1.95 * p <= state <= 2.05 * p + 64 * 1024, (state, p)
    assert o["first_occurrence_persistent"] == o["persistent"], o
    assert o["transient"] > 0, o
    assert "optimizer state that stays" in o["sentence"] and "× parameters" in o["sentence"], o["sentence"]
    assert 1.95 * p <= r["estimate"]["optimizer_state"] <= 2.05 * p + 64 * 1024


def test_puzzle_7_oom_explained_by_fragmentation(library_path: Path, tmp_path: Path) -> None:
    r = run_puzzle("puzzle_7_fragmentation_oom", library_path, tmp_path)
    assert r["error"], "the 12 MiB allocation should have failed"
    (oom,) = r["ooms"]
    assert oom["fragmentation"], oom
    assert oom["requested"] == 12 * MiB
    assert oom["free_in_reserved"] >= 100 * MiB > oom["largest_free_range"], oom
    assert oom["largest_free_range"] < 12 * MiB
    assert oom["site"] == f"puzzle_7_fragmentation_oom.py:{r['oom_line']} <module>"


def test_fragmentation_demo_diagnoses_and_fixes(library_path: Path, tmp_path: Path) -> None:
    """PyTorch's allocator and torchalloc caching run out with live memory far below the cap; torchalloc
    says fragmentation, blames the cache entries and advises expandable:reclaim first; followed, it completes the
    same workload, and so does phase_arena."""
    out = tmp_path / "demo.json"
    env = child_env(library_path)
    done = subprocess.run([sys.executable, str(EXAMPLES / "fragmentation_demo.py"), "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    print(done.stdout[-6000:])
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    r = json.loads(out.read_text())
    native, caching, arena = r["native"], r["caching"], r["phase_arena"]
    assert not native["completed"] and "CUDA out of memory" in native["error"]
    assert native["live_at_failure"] < 0.8 * 150 * MiB
    assert not caching["completed"] and caching["verdict"] == "fragmentation"
    assert "a rolling-cache entry" not in caching["report"]  # sites are lines, not comments ...
    assert "fragmentation_demo.py:" in caching["report"]  # ... of the demo: the blocks that pin the segments
    diagnosis = r["caching_log_report"]
    assert diagnosis["verdict"] == "fragmentation"
    fits = {a["policy"]: a["fits"] for a in diagnosis["alternatives"]}
    assert fits["phase_arena"] and not fits["caching"]
    assert arena["completed"]
    # The advice in the exception: expandable:reclaim first, from its figures; followed, the workload completes; the
    # replay of the log confirms it.
    assert caching["advice"][0].startswith("1. expandable:reclaim would have served this request: "), caching["advice"]
    assert any("policy:phase_arena" in line and "phase 'cache'" in line for line in caching["advice"])
    assert r["advised"]["completed"]
    assert diagnosis["advice"][0]["confirmed"] is True, diagnosis["advice"][0]
    assert r["default"]["completed"]  # torchalloc installed with nothing set (expandable:reclaim) fits
