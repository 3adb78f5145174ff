"""Configuration mistakes said at once, with the valid values (issue 23, findings 9 and 10).

- log_max past what can be mapped (2^64 - 1) used to pass the check and then
  fail every allocation; integer keys out of range did not say the range.
- A log whose first 16 MiB cannot be written (a full disk) is refused where
  the log is opened: configure() / install() raise with the reason.
- `TORCHALLOC_CONF=policy:cachng torchalloc info` said it inside the
  devices: line; `torchalloc compare --policies cachng` ran the script once
  per policy and reported "install failed" instead of naming the valid ones.
"""
from __future__ import annotations

import ctypes
import io
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import torchalloc
from torchalloc.cli import compare

PYTHON_DIR = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "options, says",
    [
        ({"log_max": "18446744073709551615"}, "from 4 KiB to 1 TiB"),
        ({"log_max": "2TiB"}, "from 4 KiB to 1 TiB"),
        ({"log_max": "100"}, "from 4 KiB to 1 TiB"),
        ({"expandable": 4}, "from 0 to 3"),
        ({"stack_depth": 0}, "from 1 to 64"),
    ],
)
def test_out_of_range_values_name_the_range(sim: ctypes.CDLL, options: dict[str, object], says: str) -> None:
    key = next(iter(options))
    with pytest.raises(ValueError, match=f"'{key}'.*{says}"):
        torchalloc.configure(backend="sim", **options)


def test_a_log_that_cannot_be_written_is_refused_at_once(library_path: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk: writing past 1 MiB fails (EFBIG) as it would with ENOSPC."""
    log = tmp_path / "train.talog"
    child = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        import torchalloc
        from torchalloc import _lib, plug
        for how in ("conf", "api"):
            try:
                if how == "conf":
                    torchalloc.configure(backend="sim", oom="null", log={str(log)!r})
                else:
                    torchalloc.configure(backend="sim", oom="null")
                    plug._open_log({str(log)!r})   # what install(log=...) calls
            except (ValueError, RuntimeError) as e:
                print(how, type(e).__name__, e)
            else:
                print(how, "no error")
        print("malloc", _lib.lib().torchalloc_malloc(4096, 0, None) is not None)
    """)
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    env.pop("TORCHALLOC_CONF", None)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("conf ValueError") and "cannot write the first" in lines[0], lines
    assert lines[1].startswith("api RuntimeError") and "cannot write the first" in lines[1], lines
    assert all("File too large" in line and str(log) in line for line in lines[:2])
    assert lines[2] == "malloc True"  # the log failed, not the allocator: the last configure() stands
    assert not log.exists()  # the file the failed open created is gone


def run_cli(*args: str, conf: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    env.pop("TORCHALLOC_CONF", None)
    if conf is not None:
        env["TORCHALLOC_CONF"] = conf
    return subprocess.run([sys.executable, "-m", "torchalloc.cli", *args], capture_output=True, text=True, env=env,
                          check=False, timeout=120)


def test_info_says_a_bad_policy_with_the_valid_ones(library_path: Path) -> None:
    done = run_cli("info", conf="policy:cachng")
    assert done.returncode == 1
    assert "torchalloc info: error:" in done.stderr and "'cachng'" in done.stderr
    assert "caching, exact or phase_arena" in done.stderr
    assert "devices:     unavailable" not in done.stdout  # not dressed up as a missing device
    json_done = run_cli("info", "--json", conf="policy:cachng")
    assert json_done.returncode == 1 and "'cachng'" in json_done.stderr


def test_compare_refuses_an_unknown_policy_before_running_anything(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = compare.main(["--policies", "native,cachng", "--", sys.executable, str(script)])
    assert status == 2
    assert "unknown policy 'cachng' (did you mean 'caching'?)" in err.getvalue()
    assert "valid: native, caching, exact, phase_arena" in err.getvalue()
    assert not ran.exists()  # not even the native run
