"""Expandable segments on a real GPU: the CUDA driver's virtual memory API
reached through cudart's driver entry points (the sim models it in
tests/test_expandable.c; this checks the real thing). Skipped without torch
or a CUDA GPU. Each scenario runs in a fresh process."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_child import gpu_skip_reason, run_child

pytestmark = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")

MiB = 1 << 20

HOLES = """
import torch, torchalloc
torchalloc.install(policy=POLICY, expandable=2, bridge=BRIDGE, handle="2MiB")  # 2 MiB handles: the sums are exact
M = 1 << 20
def full(mib, v):
    return torch.full((mib * M // 4,), v, device="cuda")
a = full(300, 1.0)
b = full(300, 2.0)
r0 = torch.cuda.memory_reserved()
del a                       # a 300 MiB hole below b
c = full(400, 3.0)          # fits no hole: compact unmaps a's memory, the range grows by 400 MiB
r1 = torch.cuda.memory_reserved()
d = full(100, 4.0)          # into a's addresses: mapped again as it is handed out
r2 = torch.cuda.memory_reserved()
ok = [bool((b == 2.0).all()), bool((c == 3.0).all()), bool((d == 4.0).all())]
del b
torch.cuda.empty_cache()    # b's granules and the free end go back; c and d stay
r3 = torch.cuda.memory_reserved()
ok.append(bool((c == 3.0).all()) and bool((d == 4.0).all()))
e = (c[: 4096 * 4096].view(4096, 4096) @ d[: 4096 * 4096].view(4096, 4096)).sum().item()  # after r3: cuBLAS keeps a workspace
ok.append(abs(e / (3.0 * 4.0 * 4096 ** 3) - 1) < 1e-3)
# a CUDA graph with expandable segments on (its private pool uses ordinary segments)
w = torch.randn(512, 512, device="cuda"); x = torch.randn(64, 512, device="cuda")
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    y = x @ w
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x @ w
x.copy_(torch.randn(64, 512, device="cuda")); g.replay(); torch.cuda.synchronize()
ok.append(bool(torch.allclose(y, x @ w)))
emit(r=[r0, r1, r2, r3], ok=ok, route=torchalloc.installed().route)
"""


@pytest.mark.parametrize("policy", ["caching", "phase_arena"])
def test_holes_are_unmapped_and_mapped_again_with_the_data_intact(library_path: Path, policy: str) -> None:
    r = run_child(f"POLICY = {policy!r}\nBRIDGE = True\n" + HOLES, library_path)
    assert r["route"] == "bridge"
    assert all(r["ok"]), r["ok"]
    r0, r1, r2, r3 = r["r"]
    assert r0 == 600 * MiB  # granules of 2 MiB: exactly what was asked
    assert r1 == 700 * MiB  # b + c: a's 300 MiB went back before the range grew (caching would hold 1000)
    assert r2 == 800 * MiB
    assert r3 == 500 * MiB  # c + d after empty_cache


SPLIT = """
import torch, torchalloc
torchalloc.install(handle="8MiB")  # the default (caching, reclaim) with 8 MiB handles even under the fraction
M = 1 << 20
total = torch.cuda.mem_get_info()[1]
torch.cuda.set_per_process_memory_fraction(2048 * M / total)  # a 2 GiB device, in effect
held = []
try:
    while True:
        held.append(torch.full((6 * M // 4,), float(len(held)), device="cuda"))
except torch.OutOfMemoryError:
    pass
n = len(held)
for i in range(1, n, 2):  # every other one: 6 MiB holes, none holding a whole 8 MiB handle
    held[i] = None
torch.cuda.synchronize()
before = torch.cuda.memory_stats()
big = torch.full((256 * M // 4,), -1.0, device="cuda")  # what PyTorch's 2 MiB pages would serve
after = torch.cuda.memory_stats()
intact = all(bool((held[i] == float(i)).all()) for i in range(0, n, 2)) and bool((big == -1.0).all())
emit(n=n, intact=intact, reserved=torch.cuda.memory_reserved(), retries=after["num_alloc_retries"] -
     before["num_alloc_retries"], route=torchalloc.installed().route)
"""


def test_an_8mib_handle_holding_free_granules_is_replaced_with_the_data_intact(library_path: Path) -> None:
    """Under the cap every 8 MiB handle holds live bytes; the out-of-memory path replaces those holding free 2 MiB
    granules (the live bytes copied into 2 MiB handles) and serves 256 MiB; every tensor keeps its values."""
    r = run_child(SPLIT, library_path)
    assert r["route"] == "bridge" and r["n"] > 200, r
    assert r["retries"] == 1 and r["intact"] is True, r
    assert r["reserved"] <= 2048 * MiB, r
