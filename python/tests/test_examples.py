"""Every example script, run as a user without a GPU would: it says `SKIP: <reason>` and exits 0.

CI has no torch and this VM's venv has torch without CUDA: both ways reach
the same line. (train_small.py died with a raw ModuleNotFoundError and
record_trace.py exited 2 before.) What the examples do on a GPU is checked
in test_examples_gpu.py and test_integrations_gpu.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.py") if p.name != "puzzle_common.py")


def _has_cuda() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_skips_cleanly_without_a_gpu(script: Path) -> None:
    if _has_cuda():
        pytest.skip("a CUDA GPU is visible: the example would run (see the GPU tests)")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("SKIP: "), done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
