"""The log's SIGBUS guard under Python's faulthandler (issue 47).

A training script that calls `faulthandler.enable()` (at the top of
main(), or through torch.distributed.elastic's `@record`) puts
faulthandler's handler over the log's guard, or under it when it ran
first. On a fault faulthandler prints the stacks, puts back the handler it
replaced and raises the signal again: the guard then sees a signal the
process sent itself, without the fault's address. Either way a live log cut
short by another program must stop logging and leave the process alive.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# The child: a log on the sim device, faulthandler enabled before or after it opened, the file cut to
# nothing by "another program" (here the child itself, as logrotate's copytruncate would), then enough
# records to run past every page still mapped.
_CHILD = r"""
import faulthandler, os, sys
from torchalloc import _lib
path, when = sys.argv[1], sys.argv[2]
if when == "before":
    faulthandler.enable()
# log_max: the whole file allocated at open, so no later growth check finds the cut before a store faults on it
_lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,log:{path},log_max:16MiB")
if when == "after":
    faulthandler.enable(all_threads=True)
lib = _lib.lib()
def churn(n):
    for _ in range(n):
        p = lib.torchalloc_malloc(4096, 0, None)
        lib.torchalloc_free(p, 4096, 0, None)
churn(1000)
os.truncate(path, 0)
churn(100000)
print("SURVIVED", flush=True)
"""


@pytest.mark.parametrize("when", ["after", "before"])
def test_a_cut_log_stops_logging_whatever_faulthandler_did(tmp_path: Path, when: str) -> None:
    path = tmp_path / "run.talog"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), when], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "SURVIVED" in done.stdout
    # installed after the guard, faulthandler takes the fault first and prints; installed before, it never sees it
    assert ("Fatal Python error: Bus error" in done.stderr) == (when == "after")
    assert "cut short by another program" in done.stderr
    assert path.stat().st_size == 0  # the other program's cut is left as it is


_RAISED = r"""
import faulthandler, os, signal, sys
from torchalloc import _lib
_lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,log:{sys.argv[1]}")
faulthandler.enable()
signal.raise_signal(signal.SIGBUS)
print("SURVIVED", flush=True)
"""


def test_a_sigbus_that_is_not_the_logs_still_ends_the_process(tmp_path: Path) -> None:
    """The log is whole: a SIGBUS raised by the program is not the guard's to swallow."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    done = subprocess.run([sys.executable, "-c", _RAISED, str(tmp_path / "run.talog")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -7, f"exit {done.returncode}\n{done.stderr[-3000:]}"  # SIGBUS
    assert "SURVIVED" not in done.stdout
    assert "Fatal Python error: Bus error" in done.stderr
