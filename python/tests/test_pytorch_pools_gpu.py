"""More of what PyTorch's own allocator tests (test/test_cuda.py) found differing under torchalloc, as scenarios of
this project's own on a real GPU: each runs in a fresh process under PyTorch's allocator and under torchalloc (the
bridge, the default configuration), and both must answer alike.

- torch.cuda.MemPool(allocator=...): a pool with its own allocator is served by that allocator's alloc and free
  (here a small C library of cuMemAllocManaged, as PyTorch's test uses managed memory), packed and cached as
  PyTorch packs them, freed through it once the pool is gone; use_on_oom lends a pool's cached block to a request
  the capped device refuses; no_split gives each block a segment of its own;
- the OOM message keeps PyTorch's first sentence for any size ("Tried to allocate X. GPU N has a total capacity
  of"), and more than 1 EB is refused as PyTorch refuses it;
- the memory history: compile contexts of torch.compile's regions, user metadata, skip_actions, the context of the
  empty_cache call that freed a segment, and no frames when no context was asked for;
- torch.profiler(profile_memory=True) sees the allocations with their Python stacks;
- torch.cuda.caching_allocator_enable(False): raw allocations bypass the allocator's stats.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_child import native_and_torchalloc

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

TIMEOUT = 240

# A user's allocator as PyTorch's test writes one (managed memory), in C against the driver API so that it shares
# the process's one driver; its calls are counted.
MANAGED_ALLOCATOR = r"""
import ctypes, os, subprocess, tempfile
from torch.utils.cpp_extension import CUDA_HOME
SOURCE = '''
#include <cuda.h>
#include <stddef.h>
int allocs, frees;
void *managed_alloc(size_t size, int device, void *stream) {
  (void)device, (void)stream;
  CUdeviceptr p = 0;
  if (cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS) return NULL;
  allocs++;
  return (void *)p;
}
void managed_free(void *p, size_t size, int device, void *stream) {
  (void)size, (void)device, (void)stream;
  frees++;
  cuMemFree((CUdeviceptr)p);
}
'''
build = tempfile.mkdtemp()
with open(os.path.join(build, "managed.c"), "w") as f:
    f.write(SOURCE)
so = os.path.join(build, "libmanaged.so")
subprocess.run(["cc", "-shared", "-fPIC", "-O1", os.path.join(build, "managed.c"), "-o", so,
                "-I" + os.path.join(CUDA_HOME, "include"), "-L" + os.path.join(CUDA_HOME, "lib64", "stubs"), "-lcuda"],
               check=True)
lib = ctypes.CDLL(so)
counts = lambda: [ctypes.c_int.in_dll(lib, "allocs").value, ctypes.c_int.in_dll(lib, "frees").value]
allocator = torch.cuda.memory.CUDAPluggableAllocator(so, "managed_alloc", "managed_free")
"""

POOL_WITH_ALLOCATOR = "import torch\n" + MANAGED_ALLOCATOR + r"""
MiB = 1 << 18  # float32 elements in 1 MiB
pool = torch.cuda.MemPool(allocator.allocator())
with torch.cuda.use_mem_pool(pool):
    a = torch.ones(MiB, device="cuda")
    segments = [len(pool.snapshot())]
    b = torch.ones(MiB, device="cuda")            # packed into the same 2 MiB segment
    segments.append(len(pool.snapshot()))
    c = torch.ones(MiB, device="cuda")            # a second segment
    segments.append(len(pool.snapshot()))
outside = torch.ones(MiB, device="cuda")          # not the pool's: not its allocator's either
total = float((a + b + c).sum().item())
in_use = counts()
del a, b, c
del pool                                          # its destructor empties its cache: back through the allocator
torch.cuda.synchronize()
after_pool = counts()

# the pool goes first, the tensor later: the allocator stays alive until the tensor's memory went back to it
pool = torch.cuda.MemPool(allocator.allocator())
with torch.cuda.use_mem_pool(pool):
    late = torch.ones(4, device="cuda")
del pool, allocator
held = counts()
del late
torch.cuda.empty_cache()
emit(segments=segments, total=total, in_use=in_use, after_pool=after_pool, held=held, at_end=counts())
"""

# PyTorch's test_mempool_limited_memory_with_allocator, in short: a cap 80 MiB above what is reserved, two pools of
# 40 MiB, one of them use_on_oom.
USE_ON_OOM = "import torch\n" + MANAGED_ALLOCATOR + r"""
MiB = 1 << 18
keep = torch.cuda.MemPool(allocator.allocator())
lend = torch.cuda.MemPool(allocator.allocator(), use_on_oom=True)
torch.cuda.empty_cache()
_, total = torch.cuda.mem_get_info()
torch.cuda.set_per_process_memory_fraction((80 * (1 << 20) + torch.cuda.memory_reserved()) / total)
with torch.cuda.use_mem_pool(keep):
    a = torch.empty(40 * MiB, device="cuda")
with torch.cuda.use_mem_pool(lend):
    b = torch.empty(40 * MiB, device="cuda")
b_ptr = b.data_ptr()
refused = []
try:
    torch.empty(40 * MiB, device="cuda")
    refused.append(False)
except torch.OutOfMemoryError:
    refused.append(True)
del a, b
c = torch.empty(30 * MiB, device="cuda")          # the use_on_oom pool's cached block
try:
    torch.empty(30 * MiB, device="cuda")           # not the other pool's
    refused.append(False)
except torch.OutOfMemoryError:
    refused.append(True)
same = c.data_ptr() == b_ptr
del c
torch.cuda.set_per_process_memory_fraction(1.0)
emit(refused=refused, same=same)
"""

NO_SPLIT = r"""
import torch
MiB = 1 << 18
torch.cuda.empty_cache()
split, unsplit = torch.cuda.MemPool(), torch.cuda.MemPool(no_split=True)
keep = []
for _ in range(2):
    for pool in (split, unsplit):
        with torch.cuda.use_mem_pool(pool):
            keep.append(torch.randn(4 * MiB, device="cuda"))
blocks = lambda pool: [len(s["blocks"]) for s in pool.snapshot()]
emit(split=blocks(split), unsplit=blocks(unsplit))
"""

OOM_MESSAGES = r"""
import torch
x = torch.zeros(1024, device="cuda")
messages = []
def attempt(n):
    try:
        torch.empty(n, dtype=torch.int8, device="cuda")
        messages.append(None)
    except RuntimeError as e:  # torch.OutOfMemoryError is one
        messages.append([type(e).__name__, str(e).splitlines()[0][:160]])
attempt(1024 ** 3 * 800000000)
attempt(1024 ** 3 * 8000000000)
torch.cuda.set_per_process_memory_fraction(0.002)  # under 300 MiB on any GPU of 80 GiB or more
attempt(1 << 30)
x.fill_(1)
emit(messages=messages, ok=bool((x == 1).all().item()))
"""

HISTORY = r"""
import json, torch
def collect(**kw):
    torch.cuda.memory._record_memory_history(**kw)
    x = torch.rand(3, 4, device="cuda")
    y = torch.rand(1 << 20, device="cuda")
    del x, y
    torch.cuda.empty_cache()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    return [e for trace in snap["device_traces"] for e in trace], snap
torch.cuda.empty_cache()
torch.cuda.memory._set_memory_metadata("run 7")
events, _ = collect(context="all", skip_actions=["free_requested"])
torch.cuda.memory._set_memory_metadata("")
actions = sorted({e["action"] for e in events})
metadata = sorted({e["user_metadata"] for e in events})
freed_here = [("empty_cache" in json.dumps(e.get("frames", []))) for e in events if e["action"] == "segment_free"]
_, alloc_only = collect(context="alloc")
frees_quiet = "empty_cache" not in json.dumps(alloc_only)
def no_context_here():
    torch.cuda.memory._record_memory_history("all", context=None, stacks="python")
    keep = torch.ones(1 << 16, device="cuda")
    text = json.dumps(torch.cuda.memory._snapshot())
    del keep
    torch.cuda.memory._record_memory_history(None)
    return "no_context_here" in text
emit(actions=actions, metadata=metadata, freed_here=bool(freed_here) and all(freed_here), frees_quiet=frees_quiet,
     frames_without_context=no_context_here())
"""

COMPILE_CONTEXT = r"""
import torch
from torch import nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(10, 10), nn.Linear(10, 10)
    def forward(self, x):
        x = self.a(x)
        x = x + 1 if x.sum() > 0 else x - 1  # a graph break: two compiled regions
        return self.b(x)
model = torch.compile(Model().cuda())
x = torch.randn(1, 10, device="cuda")
torch.cuda.memory._record_memory_history(context="all", compile_context=True)
model(x)
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(None)
sequence = []
for trace in snap["device_traces"]:
    for e in trace:
        c = e["compile_context"]
        if c != "N/A" and (not sequence or sequence[-1] != c):
            sequence.append(c)
emit(sequence=sequence)
"""

PROFILER = r"""
import json, torch
from torch.cuda._memory_viz import _profile_to_snapshot
def profiled_here():
    with torch.profiler.profile(with_stack=True, profile_memory=True, record_shapes=True) as prof:
        x = torch.rand(128, 128, device="cuda")
        x * x + x * x
    return json.dumps(_profile_to_snapshot(prof))
text = profiled_here()
emit(stack="profiled_here" in text, category="category" in text)
"""

CACHING_DISABLED = r"""
import torch
def requested(size):
    stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
    before = torch.cuda.memory_stats()["requested_bytes.all.allocated"]
    p = torch._C._cuda_cudaCachingAllocator_raw_alloc(size, stream)
    after = torch.cuda.memory_stats()["requested_bytes.all.allocated"]
    torch._C._cuda_cudaCachingAllocator_raw_delete(p)
    return after - before
counted = [requested(1 << 20)]
torch.cuda.caching_allocator_enable(False)
counted.append(requested(1 << 20))
t = torch.ones(1 << 20, device="cuda")                 # a tensor made while disabled
allocated_while_off = torch.cuda.memory_allocated()
torch.cuda.caching_allocator_enable(True)
counted.append(requested(1 << 20))
total = float(t.sum().item())
del t                                                  # freed with cudaFree though caching is on again
emit(counted=counted, allocated_while_off=allocated_while_off, total=total)
"""


def both(library_path: Path, scenario: str) -> tuple[dict, dict]:
    return native_and_torchalloc(scenario, library_path, TIMEOUT)


def test_a_mempool_with_its_own_allocator_is_served_by_it(library_path: Path) -> None:
    native, ours = both(library_path, POOL_WITH_ALLOCATOR)
    assert ours["segments"] == native["segments"] == [1, 1, 2]
    assert ours["total"] == native["total"] == 3.0 * (1 << 18)
    assert ours["in_use"] == native["in_use"] == [2, 0]
    assert ours["after_pool"] == native["after_pool"] == [2, 2]
    assert ours["held"] == native["held"] == [3, 2]
    assert ours["at_end"] == native["at_end"] == [3, 3]


def test_a_use_on_oom_pool_lends_its_cached_block(library_path: Path) -> None:
    native, ours = both(library_path, USE_ON_OOM)
    assert ours["refused"] == native["refused"] == [True, True]
    assert ours["same"] and native["same"]


def test_a_no_split_pool_never_splits(library_path: Path) -> None:
    native, ours = both(library_path, NO_SPLIT)
    assert native["unsplit"] == ours["unsplit"] == [1, 1]
    assert sum(ours["split"]) > sum(ours["unsplit"]) and len(ours["split"]) < len(ours["unsplit"])


def test_the_oom_message_opens_as_pytorchs_for_any_size(library_path: Path) -> None:
    native, ours = both(library_path, OOM_MESSAGES)
    for result in (native, ours):
        (_, first), (_, exa), (_, capped) = result["messages"]
        assert first.startswith("CUDA out of memory. Tried to allocate 800000000.00 GiB. GPU 0 has a total capacity of")
        assert "Tried to allocate more than 1EB memory" in exa
        assert capped.startswith("CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of")
        assert result["ok"]
    assert [m[0] for m in ours["messages"]] == [m[0] for m in native["messages"]]


def test_the_memory_history_keeps_metadata_skips_and_free_contexts(library_path: Path) -> None:
    native, ours = both(library_path, HISTORY)
    for result in (native, ours):
        assert "free_requested" not in result["actions"] and "alloc" in result["actions"]
        assert result["metadata"] == ["run 7"]
        assert result["freed_here"]  # a segment freed by empty_cache carries that call's stack
        assert result["frees_quiet"]
        assert not result["frames_without_context"]


def test_compile_contexts_in_the_history(library_path: Path) -> None:
    native, ours = both(library_path, COMPILE_CONTEXT)
    assert ours["sequence"] == native["sequence"]
    assert ours["sequence"][:2] == ["Torch-Compiled Region: 0/0", "Torch-Compiled Region: 1/0"]


def test_the_profiler_sees_allocations_with_their_stacks(library_path: Path) -> None:
    native, ours = both(library_path, PROFILER)
    for result in (native, ours):
        assert result["stack"] and result["category"]


def test_caching_disabled_bypasses_the_allocator(library_path: Path) -> None:
    native, ours = both(library_path, CACHING_DISABLED)
    assert ours["counted"] == native["counted"] == [1 << 20, 0, 1 << 20]
    assert ours["allocated_while_off"] == native["allocated_while_off"] == 0
    assert ours["total"] == native["total"] == float(1 << 20)
