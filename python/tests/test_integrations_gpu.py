"""GPU: the trainer callbacks on real training, the CUDA-first error, and memory_viz reading our export.

Each case runs in its own process (torchalloc.install must precede CUDA
init). Skipped without torch or a CUDA GPU, and each trainer case without
its library.

- examples/lightning_example.py and examples/hf_trainer_example.py train on
  the GPU with the callback: the report files exist, every step part got
  its phase, and the report's peak (from the log) equals PyTorch's own
  torch.cuda.max_memory_allocated() in the same process, byte for byte.
- a script that touches CUDA before creating the callback gets an error
  naming its own file and line.
- memory_viz round trip: a training process takes PyTorch's own snapshot
  (torch.cuda.memory._snapshot(), answered by the bridge) and closes its
  log at that moment; `torchalloc export` of the log then goes through
  torch.cuda._memory_viz (segment_plot, trace_plot, segsum, trace, memory,
  segments) and what it prints (segment totals) equals what it prints for
  PyTorch's snapshot; the peak replayed from the exported trace equals the
  report's and torch.cuda.max_memory_allocated().
"""
from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_child import child_env, gpu_skip_reason

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


_WHY = gpu_skip_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"GPU integrations: {_WHY}")


def _run(args: list[str], library_path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=500,
                          env=child_env(library_path, HF_HUB_OFFLINE="1"))
    print(done.stdout[-3000:], done.stderr[-3000:])
    return done


def _result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    if done.returncode == 77 and done.stdout.startswith("SKIP"):  # examples/example_start.py's CANNOT_RUN
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, f"failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line:\n{done.stdout[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _check_trainer_run(r: dict[str, Any], parts: list[str]) -> None:
    from torchalloc.analysis import analyze

    assert r["route"] == "bridge"
    assert Path(r["report_text"]).is_file() and Path(r["report_html"]).is_file()
    for part in parts:
        assert r["phases"].get(part, 0) > 0, f"no allocation in phase {part!r}: {r['phases']}"
    a = analyze(r["log"])
    assert a.timeline.peak_allocated == r["torch_max_allocated"]
    text = Path(r["report_text"]).read_text()
    for part in parts:
        assert part in text
    labels = [label for _, label, _ in a.timeline.markers]
    assert "step 0" in labels and f"step {r['global_step'] - 1}" in labels


def test_lightning_example(library_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="lightning is not installed")
    done = _run([str(EXAMPLES / "lightning_example.py"), "--log", str(tmp_path / "pl.talog")], library_path, tmp_path)
    r = _result(done)
    assert r["global_step"] == 12  # 2 epochs of 6 batches
    _check_trainer_run(r, ["forward", "backward", "optimizer", "validation"])
    assert "peak allocated" in done.stderr  # the summary the callback prints


def test_huggingface_example(library_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    done = _run([str(EXAMPLES / "hf_trainer_example.py"), "--log", str(tmp_path / "hf.talog"), "--steps", "8"],
                library_path, tmp_path)
    r = _result(done)
    assert r["global_step"] == 8
    _check_trainer_run(r, ["forward", "backward", "optimizer", "evaluation"])


CUDA_FIRST = """\
import sys
sys.path.insert(0, {python!r})
import torch
from torchalloc.integrations.{module} import TorchallocCallback
x = torch.zeros(1, device="cuda")  # CUDA starts here
try:
    TorchallocCallback()
except RuntimeError as e:
    print(str(e))
    sys.exit(3)
"""


@pytest.mark.parametrize("module, needs", [("lightning", "lightning"), ("huggingface", "transformers")])
def test_cuda_first_names_the_line(module: str, needs: str, library_path: Path, tmp_path: Path) -> None:
    pytest.importorskip(needs, reason=f"{needs} is not installed")
    script = tmp_path / "cuda_first.py"
    script.write_text(CUDA_FIRST.format(python=str(REPO / "python"), module=module))
    done = _run([str(script)], library_path, tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "must run before CUDA is initialised" in done.stdout
    assert f"{script}:5 in <module>" in done.stdout  # the line that started CUDA
    assert "Create the callback before anything uses CUDA" in done.stdout


VIZ_CHILD = """\
import json, pickle, sys
sys.path.insert(0, {python!r})
import torch, torchalloc
from torchalloc import _lib
torchalloc.install(policy="caching", expandable="off", log={log!r})  # the segments README.md's figures are of
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    loss = model(torch.randn(512, 1024, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
scratch = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 30)]
del scratch[1]
torch.cuda.synchronize()
snapshot = torch.cuda.memory._snapshot()
_lib.lib().torchalloc_log_close()  # the log ends where the snapshot was taken
with open({native!r}, "wb") as f:
    pickle.dump(snapshot, f)
print("RESULT " + json.dumps({{"max_allocated": torch.cuda.max_memory_allocated(),
                              "allocated": torch.cuda.memory_allocated(),
                              "reserved": torch.cuda.memory_reserved(),
                              "route": torchalloc.installed().route}}))
"""


def _segsum_numbers(text: str) -> tuple[dict[str, str], list[str]]:
    """segsum's totals (segments, total_reserved, total_allocated, total_free) and its per-segment lines, sorted."""
    totals = dict(re.findall(r"^(segments|total_reserved|total_allocated|total_free): *(.*)$", text, re.MULTILINE))
    return totals, sorted(line for line in text.splitlines() if line.startswith("["))


def _trace_peak(snapshot: dict[str, Any]) -> int:
    """The peak of allocated bytes replayed from device_traces as the viewer does (alloc adds, free_completed takes away)."""
    live = peak = 0
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            live += event["size"]
        elif event["action"] == "free_completed":
            live -= event["size"]
        peak = max(peak, live)
    return peak


def test_memory_viz_reads_the_export_and_prints_the_same_numbers(library_path: Path, tmp_path: Path) -> None:
    from torch.cuda import _memory_viz as viz

    from torchalloc.analysis import analyze
    from torchalloc.cli.export import main as export_main

    log, native_path, exported_path = tmp_path / "viz.talog", tmp_path / "native.pickle", tmp_path / "export.pickle"
    script = tmp_path / "viz_child.py"
    script.write_text(VIZ_CHILD.format(python=str(REPO / "python"), log=str(log), native=str(native_path)))
    r = _result(_run([str(script)], library_path, tmp_path))
    assert r["route"] == "bridge"
    assert export_main([str(log), "-o", str(exported_path)]) == 0
    exported = pickle.loads(exported_path.read_bytes())
    native = pickle.loads(native_path.read_bytes())

    for snap in (exported, native):  # PyTorch's own tools load both without error
        assert "<html" in viz.segment_plot(snap).lower()
        assert "<html" in viz.trace_plot(snap).lower()
        for summary in (viz.memory, viz.segments):
            assert summary(snap, format_flamegraph=lambda text: text)
    assert "cudaMalloc" in viz.trace(exported)

    ours, theirs = _segsum_numbers(viz.segsum(exported)), _segsum_numbers(viz.segsum(native))
    print("segsum of the export:", ours[0], "of PyTorch's snapshot:", theirs[0])
    assert len(ours[0]) == 4 and ours == theirs
    assert sum(s["total_size"] for s in exported["segments"]) == r["reserved"]
    assert sum(s["allocated_size"] for s in exported["segments"]) == r["allocated"]
    a = analyze(log)
    end = a.anatomy("end")
    assert end.reserved == r["reserved"] and end.allocated == r["allocated"]
    assert _trace_peak(exported) == a.timeline.peak_allocated == r["max_allocated"]
