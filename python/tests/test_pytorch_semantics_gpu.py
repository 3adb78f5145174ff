"""What PyTorch's own allocator tests (test/test_cuda.py) found crashing or answered wrongly under torchalloc,
as scenarios of this project's own, on a real GPU, each in a fresh process under PyTorch's allocator and under
torchalloc (the bridge, the default configuration); the answers must match and the process must exit cleanly.

- set_per_process_memory_fraction(0.0) is accepted and reads back (it crashed: the C API refused 0), and
  nothing can be allocated under it;
- torch.accelerator's memory calls answer from the allocator in charge: PyTorch's changeCurrentAllocator
  swaps CUDACachingAllocator::get() only, so c10::GetAllocator(kCUDA) still named the native allocator,
  never initialised (KeyError 'active_bytes.all.current', and crashes elsewhere);
- a CUDA graph with keep_graph=False, captured with capture_error_mode="relaxed": instantiate() raises;
- a graph's result used after the graph is destroyed, then a clean exit (it used to hang at exit);
- optimizers whose capturable param groups step inside a captured graph, replayed.

bench/pytorch_tests.py runs PyTorch's file itself, given a checkout's copy.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_child import native_and_torchalloc

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

TIMEOUT = 120

FRACTION = r"""
import torch
torch.cuda.init()
seen = [torch.cuda.get_per_process_memory_fraction()]
for f in (1.0, 0.0, 0.25, 0.5):
    torch.cuda.set_per_process_memory_fraction(f)
    seen.append(torch.cuda.get_per_process_memory_fraction())
    if f == 0.0:
        try:
            torch.empty(1 << 20, device="cuda")
            refused = False
        except torch.OutOfMemoryError:
            refused = True
torch.cuda.set_per_process_memory_fraction(1.0)
x = torch.ones(1 << 20, device="cuda")
emit(seen=seen, refused=refused, after=float(x.sum().item()))
"""

ACCELERATOR = r"""
import torch
x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
a = torch.accelerator.memory_stats()
c = torch.cuda.memory_stats()
keys = ["active_bytes.all.current", "allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms"]
emit(same=[a[k] == c[k] for k in keys], allocated=torch.accelerator.memory_allocated(),
     cuda_allocated=torch.cuda.memory_allocated(), reserved=torch.accelerator.memory_reserved() > 0)
"""

KEEP_GRAPH_FALSE = r"""
import torch
graph = torch.cuda.CUDAGraph(keep_graph=False)
x = torch.zeros(2000, device="cuda")
y = torch.ones(2000, device="cuda")
with torch.cuda.graph(graph, capture_error_mode="relaxed"):
    z = x + y
raised = []
for call in (graph.instantiate, graph.raw_cuda_graph):
    try:
        call()
        raised.append(None)
    except RuntimeError as e:
        raised.append("keep_graph=true" in str(e))
graph.replay()
emit(raised=raised, z=float(z.sum().item()))
"""

AFTER_DESTROY = r"""
import gc, torch
s = torch.cuda.Stream()
results = []
for numel in (128, 1 << 18, (1 << 18) + 128, (10 << 18) - 128, (10 << 18) + 128):
    a = torch.ones(numel, device="cuda")
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin()
        b = a.clone()
        for _ in range(5):
            b = b.clone() + 1
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    del g                      # the graph goes; its private pool stays while b holds a block of it
    gc.collect()
    held = torch.cuda.memory_allocated()
    c = b + 1                  # the result is still good after the graph is gone
    results.append([float(c.sum().item()), held > 0])
    del a, b, c
    gc.collect()
    torch.cuda.empty_cache()
torch.cuda.synchronize()
emit(results=results, allocated_at_end=torch.cuda.memory_allocated())
"""

OPTIMIZERS = r"""
import torch
torch.manual_seed(0)
losses = {}
for name in ("Adam", "AdamW", "RMSprop"):  # their state lives on the GPU with capturable=True
    w = torch.randn(64, 64, device="cuda", requires_grad=True)
    v = torch.randn(64, device="cuda", requires_grad=True)
    opt = getattr(torch.optim, name)([{"params": [w], "capturable": True}, {"params": [v], "lr": 0.01}],
                                     lr=0.1, capturable=True)
    x = torch.randn(8, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm up: state made outside the capture
            opt.zero_grad(set_to_none=False)
            ((x @ w).square().mean() + v.square().sum()).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(g):
        loss = (x @ w).square().mean() + v.square().sum()
        loss.backward()
        opt.step()
    for _ in range(4):
        g.replay()
    losses[name] = float(loss.item())
emit(losses=losses)
"""


def both(library_path: Path, scenario: str) -> tuple[dict, dict]:
    return native_and_torchalloc(scenario, library_path, TIMEOUT)


def test_memory_fraction_zero_is_accepted_and_reads_back(library_path: Path) -> None:
    native, ours = both(library_path, FRACTION)
    assert ours["seen"] == native["seen"] == [1.0, 1.0, 0.0, 0.25, 0.5]
    assert ours["refused"] and native["refused"]
    assert ours["after"] == native["after"] == float(1 << 20)


def test_torch_accelerator_memory_calls_answer_from_torchalloc(library_path: Path) -> None:
    native, ours = both(library_path, ACCELERATOR)
    assert native["same"] == ours["same"] == [True] * 4
    assert ours["allocated"] == ours["cuda_allocated"] == native["allocated"] == 3 << 20
    assert ours["reserved"]


def test_a_graph_kept_without_its_cuda_graph_refuses_instantiate(library_path: Path) -> None:
    native, ours = both(library_path, KEEP_GRAPH_FALSE)
    assert native["raised"] == ours["raised"] == [True, True]
    assert ours["z"] == native["z"] == 2000.0


def test_a_graph_result_outlives_the_graph_and_the_process_exits(library_path: Path) -> None:
    native, ours = both(library_path, AFTER_DESTROY)  # the child fails on a hang (the timeout) or a crash
    assert ours["results"] == native["results"]
    assert all(held for _, held in ours["results"])
    assert ours["allocated_at_end"] == native["allocated_at_end"]


def test_optimizers_stepped_inside_a_graph(library_path: Path) -> None:
    native, ours = both(library_path, OPTIMIZERS)
    assert ours["losses"] == native["losses"]
