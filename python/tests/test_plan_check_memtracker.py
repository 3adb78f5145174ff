"""bench/plan_check.py's MemTracker child on fake CPU tensors (--device cpu): the estimate the GPU run sets beside
plan's is made at all. Building a model under FakeTensorMode and moving it with `.to()` failed ("_apply(): Couldn't
swap Conv2d.weight") on the H200 and on the CPU alike; the child builds it on the fake device with Module.to a no-op.
Needs torch and torchvision (skipped without them, as in CI)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TAG = "PLAN_CHECK_MEMTRACKER "


def test_memtracker_estimates_resnet50_on_fake_cpu_tensors() -> None:
    pytest.importorskip("torch", reason="needs torch (MemTracker, FakeTensorMode)")
    pytest.importorskip("torchvision", reason="needs torchvision (the ResNet-50 workload)")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "plan_check.py"), "--child", "--memtracker",
                           "--workload", "resnet50", "--variant", "native", "--run-batch", "4", "--device", "cpu",
                           "--lib", "/nonexistent"], capture_output=True, text=True, env=env, timeout=300,
                          cwd=REPO / "bench")
    lines = [line for line in done.stdout.splitlines() if line.startswith(TAG)]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    estimate = json.loads(lines[-1][len(TAG):])["estimate"]
    params = 25_557_032  # ResNet-50's: weights, their gradients and Adam's two moments, 4 bytes each, at least
    assert estimate >= 4 * 4 * params
