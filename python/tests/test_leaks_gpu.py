"""The logging-step leak on a real GPU (issue 52): `history.append(loss)` every 10 steps, the loss computed with its
graph, is named with its line by `torchalloc top --once` while the job runs and by `torchalloc report` after.

The job trains a two-layer model for STEPS steps, a step marker at the start of each. Every tenth step it logs the
loss of a held-out batch, computed outside torch.no_grad(), and keeps it in a list: each logged loss keeps its
graph, so the HIDDEN_BYTES activation that tanh saved at the hidden line stays live -- the site's live bytes at
the step markers rise at one step in ten only, a rhythm no rule of rises in a row would name. The
training step's own graph goes with its backward. Then the job waits, its log open, until the test has run top.
Skipped without torch or a CUDA GPU; the job runs in a fresh process because install() must precede CUDA
initialisation. Command:

    python3 -m pytest -q python/tests/test_leaks_gpu.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

from cli_in_process import cli  # noqa: E402
from gpu_child import RESULT, child_env, prelude  # noqa: E402

from torchalloc.units import fmt_bytes  # noqa: E402

STEPS, LOG_EVERY = 80, 10
BATCH, IN, HIDDEN = 256, 512, 8192
HIDDEN_BYTES = BATCH * HIDDEN * 4  # 8 MiB of float32: tanh's output, saved for its backward and fc2's
TIMEOUT = 300

SCRIPT = prelude(TIMEOUT) + textwrap.dedent(
    f"""\
    import sys
    import torch, torchalloc
    torchalloc.install(policy="caching", log=sys.argv[1], stacks=True)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear({IN}, {HIDDEN})
            self.fc2 = torch.nn.Linear({HIDDEN}, 1)

        def forward(self, x):
            h = torch.tanh(self.fc1(x))
            return self.fc2(h)

    model = Model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    held_out = torch.randn({BATCH}, {IN}, device="cuda")
    history = []
    for step in range({STEPS}):
        torchalloc.mark(f"step {{step}}")
        x = torch.randn({BATCH}, {IN}, device="cuda")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % {LOG_EVERY} == 0:
            loss = model(held_out).pow(2).mean()  # the logged loss, with its graph (no torch.no_grad())
            history.append(loss)
    torch.cuda.synchronize()
    emit(steps={STEPS}, logged=len(history))
    sys.stdin.readline()  # still running, its log open, until the test has looked at it with top
    """
)
HIDDEN_LINE = SCRIPT.splitlines().index("        h = torch.tanh(self.fc1(x))") + 1


def test_the_logging_step_leak_is_named_with_its_line_by_top_while_running_and_by_report(
        library_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script, log = tmp_path / "script.py", tmp_path / "run.talog"
    script.write_text(SCRIPT)
    site = f"script.py:{HIDDEN_LINE} forward"
    logged = len(range(0, STEPS, LOG_EVERY))
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that no leak line is cut
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stderr:  # a file, not a pipe: a job that writes much to it never blocks on it
        job = subprocess.Popen([sys.executable, str(script), str(log)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=stderr, text=True, env=child_env(library_path))
    try:
        assert job.stdout is not None and job.stdin is not None
        line = job.stdout.readline()
        assert line.startswith(RESULT), f"the job ended early ({job.wait(timeout=TIMEOUT)}): {errors.read_text()}"
        assert json.loads(line[len(RESULT):]) == {"steps": STEPS, "logged": logged}

        status, out, err = cli("top", "--once", str(log))
        assert (status, err) == (0, "")
        assert "writer running" in out, out
        leaks = out[out.index("Leaks (a site whose low point over the step markers rose, never given back):"):]
        first = leaks.splitlines()[1]
        assert f"at {site} since step 0 " in first, out

        job.stdin.write("done\n")
        job.stdin.flush()
        assert job.wait(timeout=TIMEOUT) == 0, errors.read_text()
    finally:
        if job.poll() is None:
            job.kill()

    status, out, _ = cli("report", "--json", str(log))
    assert status == 0
    leak = json.loads(out)["leaks"][0]  # the largest growth per step first: the hidden activations
    assert leak["site"] == site and leak["location"].startswith(f"{script}:{HIDDEN_LINE}")
    assert leak["since"] == "step 0" and leak["last"] == f"step {STEPS - 1}"
    # at the last marker, every logged loss's activation is live (a block may be a little more than asked)
    assert leak["grown"] >= logged * HIDDEN_BYTES and leak["per_step"] == leak["grown"] // (STEPS - 1)
    status, out, _ = cli("report", str(log))
    summary = out.split("== Summary")[1].split("== Timeline")[0]
    assert status == 0 and f"Leak: grows {fmt_bytes(leak['per_step'])} per step at {site} since step 0" in summary

