"""Every example's start on the CPU, run as a user without a GPU would after `pip install .` (issue 50).

The examples sit in a copy of the repository whose source tree has no built
library and whose python/torchalloc cannot be imported at all, beside an
"installed" copy of the package with the library in it (as pip lays it out):
each example must pick the installed package, reach its first check, print
`SKIP: <reason>` and exit 77 (example_start.CANNOT_RUN) -- non-zero, so that
nothing takes it for a run that passed. Before, every example put the source
tree first and exited 0. What the examples do on a GPU is checked in
test_examples_gpu.py and test_integrations_gpu.py.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.py") if p.name not in ("puzzle_common.py", "example_start.py"))
CANNOT_RUN = 77  # examples/example_start.py's


def _has_cuda() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def installed_layout(tmp_path_factory: pytest.TempPathFactory, library_path: Path) -> tuple[Path, Path]:
    """(a clone whose source tree has no library and a torchalloc that must not be imported, a site directory
    with the package installed, library included)."""
    root = tmp_path_factory.mktemp("after-pip-install")
    clone, site = root / "clone", root / "site"
    shutil.copytree(REPO / "examples", clone / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "python" / "torchalloc").mkdir(parents=True)
    (clone / "python" / "torchalloc" / "__init__.py").write_text(
        "raise SystemExit('imported the source tree, which has no built library')\n")
    shutil.copytree(REPO / "python" / "torchalloc", site / "torchalloc",
                    ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy2(library_path, site / "torchalloc" / "libtorchalloc.so")
    return clone, site


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_starts_from_the_installed_package_and_says_it_cannot_run_without_a_gpu(
        script: Path, installed_layout: tuple[Path, Path]) -> None:
    if _has_cuda():
        pytest.skip("a CUDA GPU is visible: the example would run (see the GPU tests)")
    clone, site = installed_layout
    env = {key: value for key, value in os.environ.items() if key not in ("TORCHALLOC_LIB", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(clone / "examples" / script.name)], capture_output=True, text=True,
                          env=env, cwd=clone, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == CANNOT_RUN, said
    assert done.stdout.strip().splitlines()[-1].startswith("SKIP: "), said
    assert "Traceback" not in done.stderr, done.stderr


def test_the_source_tree_is_used_when_it_has_a_built_library(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    examples.mkdir()
    shutil.copy2(REPO / "examples" / "example_start.py", examples)
    (tmp_path / "python" / "torchalloc").mkdir(parents=True)
    probe = "import example_start; print(example_start.choose_torchalloc())"
    env = {key: value for key, value in os.environ.items() if key != "TORCHALLOC_LIB"}
    env["PYTHONPATH"] = str(REPO / "python")  # a torchalloc is importable: "installed"

    def choice() -> str:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=examples,
                              check=True).stdout.strip()

    assert choice() == "installed"
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "libtorchalloc.so").write_bytes(b"")
    assert choice() == "source"
