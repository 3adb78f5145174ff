#!/usr/bin/env python3
"""Puzzle 1: why does the first forward leave more memory allocated than the later ones?

Three identical no_grad forwards of an MLP; memory_allocated() after each is
measured from the log at the markers. The first one leaves an extra block
that the report classifies: persistent, a library workspace -- cuBLAS's
workspace, allocated by torch at the first matmul of a thread (per stream)
and never freed (32 MiB on Hopper).

    python3 examples/puzzle_1_first_forward.py        # needs a CUDA GPU; prints SKIP otherwise
"""
from puzzle_common import finish, here, print_phases, result, start

torch, LOG = start("puzzle1")
import torchalloc  # noqa: E402

nn = torch.nn
with torchalloc.phase("model"):
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
with torchalloc.phase("data"):
    x = torch.randn(256, 1024, device="cuda")
FORWARD_LINE = None
for i in range(3):
    torchalloc.mark(f"before forward {i + 1}")
    with torchalloc.phase("forward"), torch.no_grad():
        FORWARD_LINE = here() + 1
        y = model(x)
        del y
    torchalloc.mark(f"after forward {i + 1}")

a = finish(LOG)
after = [a.anatomy(f"after forward {i + 1}").allocated - a.anatomy(f"before forward {i + 1}").allocated for i in range(3)]
extra = after[0] - after[1]
print(f"allocated after minus before each forward: {[f'{v / 2**20:.1f} MiB' for v in after]}; "
      f"the first left {extra / 2**20:.1f} MiB more")
rows = [r for r in a.anatomy("after forward 1").rows if r.phase == "forward"]
print("\nwhat the first forward left behind (live after it, allocated in forward):")
for r in rows:
    print(f"  {r.bytes / 2**20:.1f} MiB in {r.count} block(s) at {r.site}: {r.reason}, {r.category}")
print("\nwhy:")
for r in a.lifetimes():
    if r.reason == "persistent" and "forward" in r.phases:
        print(f"  {r.explanation}")
print_phases(a)
result(after=after, extra=extra, left_behind=[r.to_dict() for r in rows], forward_line=FORWARD_LINE)
