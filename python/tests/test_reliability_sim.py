"""Crash safety on the simulated device (CPU): test_reliability_gpu.py's SIGKILL case, without a GPU.

A child process drives the C library on two sim devices with logging and
Python stacks on: steps of allocations and frees of mixed sizes on two
streams, inside phases. After each step it reads the allocator's own
counts (allocation.all.allocated and .freed, both devices), writes the
marker "step N" and prints the counts on a pipe. The parent kills it with
SIGKILL in the middle of a later step. Decoded, the log must hold every
marker the child printed before it died, and before each one exactly the
reported number of alloc and free records: no completed record lost. The
records are in sequence order, the step the kill interrupted is there in
part, and the report runs on the log.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = """\
import random, sys
sys.path.insert(0, {python!r})
from torchalloc import _lib
_lib.init("backend:sim,sim_devices:2,sim_capacity:1GiB,warn:0,oom_report:off,stacks:1,log:{log}")
lib = _lib.lib()
rnd = random.Random(5)
live = []
step = 0
while True:
    lib.torchalloc_phase_begin(b"forward" if step % 2 else b"backward")
    for _ in range(400):
        if live and rnd.random() < 0.48:
            p, size, device, stream = live.pop(rnd.randrange(len(live)))
            lib.torchalloc_free(p, size, device, stream)
        else:
            size = rnd.choice((rnd.randrange(1, 4096), rnd.randrange(4096, 1 << 20), rnd.randrange(1 << 20, 8 << 20)))
            device, stream = rnd.randrange(2), rnd.choice((0, 0x1000))
            p = lib.torchalloc_malloc(size, device, stream)
            if p:
                live.append((p, size, device, stream))
    lib.torchalloc_phase_end(None)
    s = [_lib.get_stats(d).allocation[0] for d in range(2)]
    lib.torchalloc_mark(f"step {{step}}".encode())
    print(f"STEP {{step}} {{sum(x.allocated for x in s)}} {{sum(x.freed for x in s)}}", flush=True)
    step += 1
"""

ALLOC, FREE, MARKER = 1, 2, 9


def test_sigkill_mid_run_loses_no_completed_record(library_path: Path, tmp_path: Path) -> None:
    from torchalloc._records import KIND_IDS
    from torchalloc.analysis import analyze
    from torchalloc.log.reader import read_log

    assert (KIND_IDS["alloc"], KIND_IDS["free"], KIND_IDS["marker"]) == (ALLOC, FREE, MARKER)
    log_path = tmp_path / "killed.talog"
    script = tmp_path / "kill_child.py"
    script.write_text(CHILD.format(python=str(REPO / "python"), log=str(log_path)))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while len(lines) < 15 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        lines.append(line)
    time.sleep(0.004)  # into the middle of a later step
    child.send_signal(signal.SIGKILL)
    # Read the rest through the same buffered reader: communicate() reads the raw pipe and would
    # skip lines readline() had already buffered (the child is dead, so neither read can block).
    rest, err = child.stdout.read(), child.stderr.read()
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL, f"the child ended by itself: {err[-3000:]}"
    # Everything it printed before it died, read or still in the pipe.
    reported = {int(m[1]): (int(m[2]), int(m[3]))
                for m in (re.match(r"STEP (\d+) (\d+) (\d+)", x) for x in lines + rest.splitlines()) if m}
    assert len(reported) >= 15, f"the child reported {len(reported)} steps: {err[-3000:]}"
    assert sorted(reported) == list(range(len(reported)))

    log = read_log(log_path, warn=False)
    assert not log.complete and log.header.status_name != "closed"
    records = log.records
    seq = records["seq"].astype("int64")
    assert (seq[1:] > seq[:-1]).all()
    kinds = records["kind"]
    markers = {log.label(r): i for i, r in enumerate(records) if int(r["kind"]) == MARKER}
    for step, (allocs, frees) in reported.items():
        at = markers[f"step {step}"]
        assert (int((kinds[:at] == ALLOC).sum()), int((kinds[:at] == FREE).sum())) == (allocs, frees), step
    last = max(reported)
    # The kill came after the last reported marker: what the next step had
    # completed is there too (the marker of a step is written after its work).
    after = int(((kinds == ALLOC) | (kinds == FREE))[markers[f"step {last}"]:].sum())
    print(f"SIGKILL after {len(reported)} reported steps: {len(records)} records decoded, "
          f"{reported[last][0]} allocations and {reported[last][1]} frees reported by the last one, all found; "
          f"{after} alloc/free records of the interrupted step; warnings: {log.warnings[:2]}")
    assert analyze(log_path).timeline.peak_allocated > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
