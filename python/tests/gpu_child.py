"""Running a GPU scenario in a fresh Python process, for the GPU tests.

torchalloc.install() must run before CUDA is initialised, so every GPU
scenario runs in its own interpreter. The scenario's code gets `emit(**kw)`,
which prints one RESULT line of JSON that the test reads back.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

PYTHON_DIR = Path(__file__).resolve().parents[1]
RESULT = "RESULT "
PRELUDE = f"import json\nRESULT = {RESULT!r}\ndef emit(**kw): print(RESULT + json.dumps(kw), flush=True)\n"


def prelude(timeout: float) -> str:
    """PRELUDE, and a child that is still running 10 s before `timeout` prints every thread's stack and
    exits (faulthandler): a hang ends with what the child was doing instead of a bare timeout."""
    return f"import faulthandler\nfaulthandler.dump_traceback_later({max(timeout - 10, 1)!r}, exit=True)\n" + PRELUDE


@dataclasses.dataclass
class Finished:
    returncode: int
    result: dict[str, Any] | None  # the last RESULT line, None when there was none
    stdout: str
    stderr: str


def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here (no torch, no CUDA GPU), or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


def child_env(library_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a GPU child: this checkout's package and library, no inherited TORCHALLOC_CONF."""
    env = dict(os.environ, TORCHALLOC_LIB=str(library_path), PYTHONPATH=str(PYTHON_DIR), **extra)
    env.pop("TORCHALLOC_CONF", None)
    return env


def run_logged_script(script: str, library_path: Path, folder: Path, timeout: float = 300) -> Path:
    """Write `script` (it takes its log's path as argv[1]) into `folder`, run it with this checkout's package
    and library, check that it succeeded, and return the path of the log it wrote."""
    path, log = folder / "script.py", folder / "run.talog"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path), str(log)], capture_output=True, text=True,
                          env=child_env(library_path), timeout=timeout, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return log


def run_python(code: str, library_path: Path, timeout: float = 300, env: dict[str, str] | None = None) -> Finished:
    """Run `code` (dedented) in a fresh interpreter with this checkout's package and library."""
    full_env = child_env(library_path, **(env or {}))
    done = subprocess.run([sys.executable, "-c", prelude(timeout) + textwrap.dedent(code)], capture_output=True,
                          text=True, env=full_env, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    result = json.loads(lines[-1][len(RESULT):]) if lines else None
    return Finished(done.returncode, result, done.stdout, done.stderr)


def run_child(code: str, library_path: Path, timeout: float = 300, env: dict[str, str] | None = None) -> dict[str, Any]:
    """run_python for a scenario that must succeed; its result, with its stderr under "_stderr"."""
    done = run_python(code, library_path, timeout, env)
    assert done.returncode == 0, f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    assert done.result is not None, f"child printed no result:\n{done.stdout}\n{done.stderr}"
    return {**done.result, "_stderr": done.stderr}


def native_and_torchalloc(code: str, library_path: Path, timeout: float = 300) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scenario's results under PyTorch's allocator and under torchalloc (installed with its defaults, the
    bridge route), each in a fresh process: for tests whose answers must match PyTorch's."""
    native = run_child(code, library_path, timeout=timeout)
    ours = run_child("import torchalloc\ntorchalloc.install()\n" + code, library_path, timeout=timeout)
    return native, ours
