"""GPU reliability: a training process killed mid-run loses no completed log record; repeated OOMs stay exact.

- SIGKILL: a GPT-style training loop logs with stacks on; after each step it
  reads torch.cuda.memory_stats() (answered by torchalloc on the bridge
  route), writes a marker "step N", and prints the counts. The parent kills
  it with SIGKILL in the middle of a later step; the log, decoded, holds
  exactly the reported number of alloc and free records before each
  reported marker, every record in sequence order, and the report and
  export run on it.
- OOM under pressure: 12 rounds of filling the device with blocks of mixed
  sizes until torch.OutOfMemoryError, then freeing everything and
  empty_cache(): each round's OOM is raised (the process goes on), the
  heap's invariant check passes after every round, allocated returns to
  its baseline, reserved to zero after the trim and the driver's free
  memory to where it was.

Each case runs in its own process. Skipped without torch or a CUDA GPU.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpu_child import child_env, gpu_skip_reason

REPO = Path(__file__).resolve().parents[2]


_WHY = gpu_skip_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"GPU reliability: {_WHY}")

KILL_CHILD = """\
import sys
sys.path.insert(0, {python!r})
import torch, torchalloc
torchalloc.install(policy="caching", log={log!r}, stacks=True)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 6).cuda()
opt = torch.optim.AdamW(model.parameters())
step = 0
while True:
    x = torch.randn(16, 256, 512, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    torchalloc.mark(f"step {{step}}")
    print(f"STEP {{step}} {{s['allocation.all.allocated']}} {{s['allocation.all.freed']}}", flush=True)
    step += 1
"""


def test_sigkill_mid_training_loses_no_completed_record(library_path: Path, tmp_path: Path) -> None:
    from torchalloc.analysis import analyze
    from torchalloc.cli.export import main as export_main
    from torchalloc.log.reader import read_log

    log_path = tmp_path / "killed.talog"
    script = tmp_path / "kill_child.py"
    script.write_text(KILL_CHILD.format(python=str(REPO / "python"), log=str(log_path)))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=child_env(library_path))
    reported: dict[int, tuple[int, int]] = {}
    assert child.stdout is not None
    deadline = time.monotonic() + 240
    while len(reported) < 20 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        m = re.match(r"STEP (\d+) (\d+) (\d+)", line)
        if m:
            reported[int(m[1])] = (int(m[2]), int(m[3]))
    time.sleep(0.013)  # into the middle of a later step
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert len(reported) >= 20, f"the child reported {len(reported)} steps: {child.stderr.read()[-3000:]}"

    log = read_log(log_path, warn=False)
    assert not log.complete and log.header.status_name != "closed"
    records = log.records
    seq = records["seq"].astype("int64")
    assert (seq[1:] > seq[:-1]).all()
    kinds = records["kind"]
    markers = {log.label(r): i for i, r in enumerate(records) if int(r["kind"]) == 9}
    for step, (allocs, frees) in reported.items():
        at = markers[f"step {step}"]
        assert (int((kinds[:at] == 1).sum()), int((kinds[:at] == 2).sum())) == (allocs, frees), step
    last_allocs = reported[max(reported)][0]
    print(f"SIGKILL after {len(reported)} steps: {len(records)} records decoded, "
          f"{last_allocs} allocations reported by the last completed step, all found")
    assert analyze(log_path).timeline.peak_allocated > 0
    assert export_main([str(log_path), "-o", str(tmp_path / "killed.pickle")]) == 0


OOM_CHILD = """\
import json, random, sys
sys.path.insert(0, {python!r})
import torch, torchalloc
from torchalloc import _lib
torchalloc.install(policy={policy!r})
torch.cuda.init()
free0, total = torch.cuda.mem_get_info()
base = torch.cuda.memory_allocated()
rnd = random.Random(0)
rounds = []
for r in range(12):
    held, ooms = [], 0
    while True:
        n = rnd.choice((1, 3, 20, 100, 700, 2500)) << 20
        try:
            held.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            ooms += 1
            break
    filled = torch.cuda.memory_allocated() - base
    ok = _lib.lib().torchalloc_check_invariants(0) == 0
    blocks = len(held)
    held.clear()
    torch.cuda.empty_cache()
    rounds.append(dict(blocks=blocks, filled=filled, ooms=ooms, invariants=ok,
                       allocated=torch.cuda.memory_allocated() - base, reserved=torch.cuda.memory_reserved(),
                       driver_free=torch.cuda.mem_get_info()[0]))
s = torch.cuda.memory_stats()
print("RESULT " + json.dumps(dict(rounds=rounds, free0=free0, total=total, num_ooms=s["num_ooms"],
                                  route=torchalloc.installed().route)))
"""


@pytest.mark.parametrize("policy", ["caching", "phase_arena"])
def test_repeated_oom_keeps_stats_exact_and_leaks_nothing(policy: str, library_path: Path, tmp_path: Path) -> None:
    script = tmp_path / "oom_child.py"
    script.write_text(OOM_CHILD.format(python=str(REPO / "python"), policy=policy))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env(library_path),
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert r["route"] == "bridge" and r["num_ooms"] == 12
    for i, row in enumerate(r["rounds"]):
        assert row["ooms"] == 1 and row["invariants"], (i, row)
        assert row["filled"] > r["total"] // 2, (i, row)  # the device was really full
        assert row["allocated"] == 0 and row["reserved"] == 0, (i, row)
        # the driver gets every byte back (within 64 MiB of what other users of the GPU may do meanwhile)
        assert abs(row["driver_free"] - r["free0"]) <= 64 << 20, (i, row)
    filled = [row["filled"] for row in r["rounds"]]
    print(f"{policy}: 12 OOM rounds, filled {min(filled) / 2**30:.2f}-{max(filled) / 2**30:.2f} GiB "
          f"of {r['total'] / 2**30:.1f} GiB each, reserved 0 after every trim")
