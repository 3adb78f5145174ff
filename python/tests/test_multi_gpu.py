"""torchalloc with several streams and devices in one process, on real GPUs.

Skipped without torch or a CUDA GPU; the two-device tests skip on one GPU
with the reason. Each scenario runs in a fresh process (the allocator is
chosen before CUDA starts), with its own timeout: a child still running 10 s
before it prints every thread's stack and exits (gpu_child.prelude).

- A side stream (as NCCL's, DDP's and FSDP's communication and prefetch
  streams do) writes into a block long after the compute stream freed it
  with record_stream: no new allocation may get that memory before the side
  stream is done, under every policy and route. The side stream sleeps
  first (torch.cuda._sleep), so an early reuse shows as the new tensor's
  data overwritten by the late write.
- One process, two GPUs, every policy and the default, both routes: tensors
  on cuda:0 and cuda:1, copies both ways, a model split across them
  (per-device allocated/peak equal to native's), torch.cuda.comm.broadcast,
  and on the bridge route a CUDA graph captured on each device. Memory
  mapped with the driver's virtual memory calls is reachable only from the
  devices its mapping names: before peer access (TORCHALLOC_CONF peers) the
  default failed here at the first .to("cuda:1").
- A process that uses one GPU of two makes no CUDA context on the other
  (nvidia-smi lists it on one GPU only, as under PyTorch's allocator).

The jobs of several processes (DDP, FSDP, NCCL's collectives) are in
test_multi_rank_gpu.py; CUDA IPC in test_ipc_gpu.py.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpu_child import run_child, run_python

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():  # asks the driver; does not initialise CUDA here
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

# (policy, expandable): the default is caching with expandable:reclaim; off is PyTorch's segments.
VARIANTS = [("caching", None), ("caching", "off"), ("exact", None), ("phase_arena", None)]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason=f"needs 2 GPUs, found {torch.cuda.device_count()}")
TIMEOUT = 180


def install_line(policy: str, expandable: str | None, route: str, **extra: object) -> str:
    args = [f"policy={policy!r}", f"bridge={route == 'bridge'}"]
    args += [f"expandable={expandable!r}"] if expandable else []
    args += [f"{k}={v!r}" for k, v in extra.items()]
    return f"import torchalloc\ntorchalloc.install({', '.join(args)})\n"


SIDE_STREAM = r"""
import torch
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
import torchalloc
emit(side_busy=side_busy, overlapped=overlapped, intact=bool((kept == 2.0).all().item()),
     route=(torchalloc.installed().route if torchalloc.installed() else "native"))
"""


@pytest.mark.parametrize("route", ["plain", "bridge"])
@pytest.mark.parametrize("policy", ("caching", "exact", "phase_arena", "caching+expandable"))
def test_a_block_is_not_reused_before_its_side_stream_is_done(library_path: Path, policy: str, route: str) -> None:
    name, _, grow = policy.partition("+")  # "caching+expandable": expandable:on
    r = run_child(install_line(name, "on" if grow else None, route) + SIDE_STREAM, library_path, timeout=TIMEOUT)
    assert r["route"] == route
    if policy != "exact":  # exact's cudaFree of the loop's tensors synchronizes: the side stream is done by then
        assert r["side_busy"], "the side stream finished before the allocations: the test proved nothing"
    assert not any(r["overlapped"]), f"{policy}/{route}: the block was handed out while the side stream used it"
    assert r["intact"], f"{policy}/{route}: the side stream's late write landed in a new tensor"


TWO_DEVICES = r"""
import torch, torch.cuda.comm, torchalloc
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
copies = [a1.sum().item(), b0.sum().item(), first.weight.grad.to("cuda:1").abs().sum().item()]
del a1, b0, x
seen.append(levels())
ours = None
if torchalloc.installed():  # torchalloc's own per-device numbers, not through torch
    ours = [[torchalloc.memory_allocated(d), torchalloc.max_memory_allocated(d)] for d in (0, 1)]
# Beyond the numbers: a broadcast (one source, copies to every device) and a fresh large tensor, mapped
# after the first copies, moved across; then, where graphs work, a graph captured on each device.
big = torch.arange(48 << 20, device="cuda:1")  # int64: every value exact
back = big.to("cuda:0")
bcast = torch.cuda.comm.broadcast(torch.arange(5 << 20, device="cuda:0"), devices=[0, 1])
moved = [back[-1].item(), bcast[1][-1].item(), bcast[1].device.index]
graphs = []
if GRAPHS:
    for d in (0, 1):
        with torch.cuda.device(d):
            s = torch.cuda.Stream()
            static = torch.ones(1 << 20, device=f"cuda:{d}")
            g = torch.cuda.CUDAGraph()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                out = static * 3 + 1                    # warm up outside the capture
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                out = static * 3 + 1
            static.fill_(2.0)
            g.replay()
            other = out.to(f"cuda:{1 - d}")             # the graph pool's memory read from the other GPU
            graphs.append([out.sum().item(), other.sum().item()])
peers = None
if torchalloc.installed():
    lib = torchalloc._lib.lib()
    peers = [lib.torchalloc_peer_access(0, 1), lib.torchalloc_peer_access(1, 0)]
torch.cuda.synchronize(0); torch.cuda.synchronize(1)
emit(seen=seen, loss=loss.item(), sums=[a.sum().item(), b.sum().item()], copies=copies, ours=ours,
     moved=moved, graphs=graphs, peers=peers)
"""


@functools.cache
def native_two_devices(library_path: Path, graphs: bool) -> dict[str, Any]:
    """PyTorch's own allocator on the scenario: run once, compared with every variant."""
    return run_child(f"GRAPHS = {graphs}\n" + TWO_DEVICES, library_path, timeout=TIMEOUT)


@TWO_GPUS
@pytest.mark.parametrize("route", ["plain", "bridge"])
@pytest.mark.parametrize("policy,expandable", VARIANTS)
def test_one_process_two_gpus(library_path: Path, policy: str, expandable: str | None, route: str) -> None:
    graphs = route == "bridge"  # CUDA graphs need the bridge (README: the plain route's limits)
    native = native_two_devices(library_path, graphs)
    ours = run_child(f"GRAPHS = {graphs}\n" + install_line(policy, expandable, route, patch_torch=True)
                     + TWO_DEVICES, library_path, timeout=TIMEOUT)
    assert ours["seen"] == native["seen"], "per-device allocated / peak differ from PyTorch's"
    assert ours["seen"][0] == [[4 << 20, 4 << 20], [12 << 20, 12 << 20]]
    assert ours["loss"] == native["loss"] and ours["sums"] == native["sums"] == [float(1 << 20), float(6 << 20)]
    assert ours["copies"] == native["copies"]
    assert ours["ours"] == ours["seen"][-1], "torchalloc's own per-device stats differ from what torch reports"
    assert ours["moved"] == native["moved"] == [(48 << 20) - 1, (5 << 20) - 1, 1]
    assert ours["graphs"] == native["graphs"]
    if graphs:  # the first device's replay with its input changed; both devices' results read from the other GPU
        assert ours["graphs"][0] == [float(7 << 20), float(7 << 20)]
        assert [a == b for a, b in ours["graphs"]] == [True, True]
    # The bridge grants what PyTorch asks for (both directions were copied); the plain route grants every peer.
    assert ours["peers"] == [1, 1]


CONTEXTS = r"""
import os, subprocess, torch
x = torch.randn(4096, 4096, device="cuda:0")
y = (x @ x).sum().item()
big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")  # mapped memory, large pool
torch.cuda.synchronize()
def smi(query):
    return subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader"], capture_output=True,
                          text=True, check=True).stdout.splitlines()
index = {line.split(",")[1].strip(): int(line.split(",")[0]) for line in smi("gpu=index,uuid")}
mine = sorted({index[line.split(",")[1].strip()] for line in smi("compute-apps=pid,gpu_uuid")
               if int(line.split(",")[0]) == os.getpid()})
emit(gpus=mine)
"""


@TWO_GPUS
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi to list the GPUs a process uses")
@pytest.mark.parametrize("route", ["plain", "bridge"])
def test_a_process_on_one_gpu_makes_no_context_on_another(library_path: Path, route: str) -> None:
    native = run_child(CONTEXTS, library_path, timeout=TIMEOUT)
    if not native["gpus"]:
        pytest.skip("nvidia-smi lists no process of this machine's children (a container hides them)")
    ours = run_child(install_line("caching", None, route) + CONTEXTS, library_path, timeout=TIMEOUT)
    assert native["gpus"] == [0]
    assert ours["gpus"] == [0], f"torchalloc ({route}) made a CUDA context on GPUs {ours['gpus']}"


def test_a_child_that_hangs_says_where(library_path: Path) -> None:
    """The harness itself: a child past its time prints its stack instead of a bare timeout."""
    done = run_python("import time\ndef stuck():\n    time.sleep(60)\nstuck()\n", library_path, timeout=12)
    assert done.returncode != 0
    assert "in stuck" in done.stderr and "Timeout" in done.stderr, done.stderr


def test_nvidia_smi_query_format() -> None:
    """CONTEXTS parses nvidia-smi's csv lines: keep its assumptions honest where nvidia-smi runs."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi")
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out and all(line.split(",")[0].strip().isdigit() for line in out)
