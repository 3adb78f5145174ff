"""How the package is built (issue 50): CMake from PyPI, one py3-none-<platform> wheel, the bridge probe."""
from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[2]


def setup_arguments(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any]]:
    """What setup.py passes to setup(), and its module globals, without building anything."""
    captured: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    module = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")
    return captured, module


def test_cmake_and_ninja_are_build_requirements_so_no_system_cmake_is_needed() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r"^requires = \[(.*)\]$", text, re.MULTILINE)
    assert requires is not None, "pyproject.toml has no [build-system] requires line"
    names = {re.split(r"[<>=;\s]", item.strip().strip('"'))[0] for item in requires.group(1).split(",")}
    assert {"setuptools", "cmake", "ninja"} <= names


def test_the_wheel_is_tagged_py3_none_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library is loaded with ctypes: one wheel a platform, for every Python 3, not cp311-cp311."""
    pytest.importorskip("setuptools.command.bdist_wheel", reason="needs setuptools >= 70.1 (the test extra)")
    arguments, _ = setup_arguments(monkeypatch)
    wheel_command = arguments["cmdclass"]["bdist_wheel"]
    distribution = arguments["distclass"]({"name": "torchalloc", "version": arguments["version"]})
    command = wheel_command(distribution)
    command.finalize_options()
    python, abi, platform = command.get_tag()
    assert (python, abi) == ("py3", "none")
    assert platform != "any" and platform.replace("-", "_") == platform


def test_the_bridge_is_probed_by_the_installing_python_outside_pip_build_isolation(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """pip's isolated build hides the installed torch (PYTHONPATH to its overlay): the probe runs without it."""
    _, module = setup_arguments(monkeypatch)
    overlay = tmp_path / "overlay"
    (overlay / "torch").mkdir(parents=True)
    (overlay / "torch" / "__init__.py").write_text("raise SystemExit('the build overlay was imported')\n")
    env = module["outside_build_isolation"]({"PYTHONPATH": str(overlay), "PYTHONNOUSERSITE": "1", "HOME": "/h"})
    assert env == {"HOME": "/h"}
    package = tmp_path / "lib"
    (package / "torchalloc").mkdir(parents=True)
    for name in ("__init__.py", "bridge.py", "_lib.py"):
        (package / "torchalloc" / name).write_bytes((ROOT / "python" / "torchalloc" / name).read_bytes())
    done = subprocess.run([sys.executable, "-c", module["BUILD_BRIDGE_SCRIPT"], str(package)],
                          env={**env, "PYTHONPATH": ""}, capture_output=True, text=True)
    assert done.returncode in (0, 3), done.stderr
    assert "overlay was imported" not in done.stdout + done.stderr
