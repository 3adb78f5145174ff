"""torchalloc with several streams, devices and processes on real GPUs.

Skipped without torch or a CUDA GPU; the two-device tests skip on one GPU
with the reason. Each scenario runs in fresh processes (the allocator is
chosen before CUDA starts).

- A side stream (as NCCL's, DDP's and FSDP's communication and prefetch
  streams do) writes into a block long after the compute stream freed it
  with record_stream: no new allocation may get that memory before the side
  stream is done, under every policy and route. The side stream sleeps
  first (torch.cuda._sleep), so an early reuse shows as the new tensor's
  data overwritten by the late write.
- One process, two GPUs: tensors on cuda:0 and cuda:1, copies both ways, a
  model split across them; per-device allocated/peak equal to native's.
- Two processes on one GPU over gloo, DDP and FSDP, and on two GPUs over
  NCCL: examples/ddp_example.py, losses bit for bit against native.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_child import child_env, run_child

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():  # asks the driver; does not initialise CUDA here
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
POLICIES = ("caching", "exact", "phase_arena")
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason=f"needs 2 GPUs, found {torch.cuda.device_count()}")

SIDE_STREAM = r"""
import sys, torch, torchalloc
policy, route = sys.argv[1], sys.argv[2]
if policy != "native":
    name, _, grow = policy.partition("+")  # "caching+expandable": expandable segments on
    torchalloc.install(policy=name, bridge=route == "bridge", **({"expandable": 1} if grow else {}))
n = 8 << 20  # 32 MiB of float32: a large-pool block every policy may hand back at once
compute = torch.cuda.current_stream()
side = torch.cuda.Stream()
x = torch.zeros(n, device="cuda")
addr = x.data_ptr()
side.wait_stream(compute)
with torch.cuda.stream(side):
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time before the write: the free below comes first
    x.fill_(1.0)  # the side stream's late write
x.record_stream(side)
del x  # freed on the compute stream while the side stream still holds it
overlapped = []
for k in range(4):  # same size and smaller: every chance to reuse the block
    y = torch.empty(n >> k, device="cuda")
    y.fill_(2.0)
    overlapped.append(y.data_ptr() < addr + 4 * n and addr < y.data_ptr() + 4 * (n >> k))
    if k == 0:
        kept = y  # the same size as x: checked after the side stream's write
side_busy = not side.query()
torch.cuda.synchronize()
emit(side_busy=side_busy, overlapped=overlapped, intact=bool((kept == 2.0).all().item()),
     route=(torchalloc.installed().route if policy != "native" else "native"))
"""


@pytest.mark.parametrize("route", ["plain", "bridge"])
@pytest.mark.parametrize("policy", (*POLICIES, "caching+expandable"))
def test_a_block_is_not_reused_before_its_side_stream_is_done(library_path: Path, policy: str, route: str) -> None:
    env = child_env(library_path)
    done = subprocess.run([sys.executable, "-c", "import json\ndef emit(**kw): print('RESULT ' + json.dumps(kw))\n"
                           + SIDE_STREAM, policy, route], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads([line for line in done.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    assert r["route"] == route
    if policy != "exact":  # exact's cudaFree of the loop's tensors synchronizes: the side stream is done by then
        assert r["side_busy"], "the side stream finished before the allocations: the test proved nothing"
    assert not any(r["overlapped"]), f"{policy}/{route}: the block was handed out while the side stream used it"
    assert r["intact"], f"{policy}/{route}: the side stream's late write landed in a new tensor"


TWO_DEVICES = r"""
import torch, torchalloc
if POLICY != "native":
    torchalloc.install(policy=POLICY, patch_torch=True)  # torch.cuda's stats answer on either route
def levels():
    return [[torch.cuda.memory_allocated(d), torch.cuda.max_memory_allocated(d)] for d in (0, 1)]
seen = []
a = torch.ones(1 << 20, device="cuda:0")           # 4 MiB on cuda:0
b = torch.full((3 << 20,), 2.0, device="cuda:1")   # 12 MiB on cuda:1
seen.append(levels())
a1 = a.to("cuda:1"); b0 = b.to("cuda:0")           # copies both ways
seen.append(levels())
torch.manual_seed(0)
first = torch.nn.Linear(256, 512).to("cuda:0")
second = torch.nn.Linear(512, 64).to("cuda:1")     # a model split across the two
x = torch.randn(128, 256, device="cuda:0")
loss = second(torch.relu(first(x)).to("cuda:1")).square().mean()
loss.backward()
seen.append(levels())
del a1, b0, x
seen.append(levels())
ours = None
if POLICY != "native":  # torchalloc's own per-device numbers, not through torch
    ours = [[torchalloc.memory_allocated(d), torchalloc.max_memory_allocated(d)] for d in (0, 1)]
emit(seen=seen, loss=loss.item(), sums=[a.sum().item(), b.sum().item()], ours=ours)
"""


@TWO_GPUS
@pytest.mark.parametrize("policy", POLICIES)
def test_one_process_two_gpus_per_device_stats_exact(library_path: Path, policy: str) -> None:
    native = run_child(f"POLICY = 'native'\n{TWO_DEVICES}", library_path)
    ours = run_child(f"POLICY = {policy!r}\n{TWO_DEVICES}", library_path)
    assert ours["seen"] == native["seen"], "per-device allocated / peak differ from PyTorch's"
    assert ours["seen"][0] == [[4 << 20, 4 << 20], [12 << 20, 12 << 20]]
    assert ours["loss"] == native["loss"] and ours["sums"] == native["sums"] == [float(1 << 20), float(6 << 20)]
    assert ours["ours"] == ours["seen"][-1], "torchalloc's own per-device stats differ from what torch reports"


def run_example(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = child_env(Path(os.environ["TORCHALLOC_LIB"]))  # conftest.py's choice, as the other GPU tests use
    return subprocess.run([sys.executable, str(REPO / "examples" / "ddp_example.py"), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_on_one_gpu_over_gloo(library_path: Path, tmp_path: Path, mode: str) -> None:
    done = run_example("--nproc", "2", "--mode", mode, "--backend", "gloo", "--same-device", "--lib",
                       str(library_path), "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"OK {mode}:" in done.stdout and "2 rank logs" in done.stdout, done.stdout
    assert sorted(p.name for p in (tmp_path / mode).glob("run.*.talog")) == ["run.0.talog", "run.1.talog"]


@TWO_GPUS
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_on_two_gpus_over_nccl(library_path: Path, tmp_path: Path, mode: str) -> None:
    done = run_example("--nproc", "2", "--mode", mode, "--backend", "nccl", "--lib", str(library_path),
                       "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"OK {mode}:" in done.stdout, done.stdout
