#!/usr/bin/env python3
"""Puzzle 6: Adam's first step -- the state that stays and the transients.

The first optimizer.step() allocates exp_avg and exp_avg_sq for every
parameter (2 x the parameters' bytes) and keeps them: persistent optimizer
state. Every step also makes intermediates (foreach sqrt, divisions) that are
freed before it returns: transient. Later steps allocate no new state.

    python3 examples/puzzle_6_adam_first_step.py
"""
from puzzle_common import finish, print_phases, result, start

torch, LOG = start("puzzle6")
import torchalloc  # noqa: E402

nn = torch.nn
with torchalloc.phase("model"):
    model = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2048)).cuda()
with torchalloc.phase("data"):
    x = torch.randn(128, 2048, device="cuda")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
for step in range(3):
    with torchalloc.phase("forward"):
        loss = model(x).square().mean()
    with torchalloc.phase("backward"):
        loss.backward()
    del loss
    with torchalloc.phase("optimizer"):
        opt.step()
    with torchalloc.phase("zero_grad"):
        opt.zero_grad(set_to_none=True)
    torchalloc.mark(f"after step {step + 1}")

a = finish(LOG)
phases = {p.phase: p for p in a.phases()}
o = phases["optimizer"]
print(f"parameters {param_bytes / 2**20:.1f} MiB")
print(o.sentence)
print("\nwhat the optimizer step allocated:")
for r in a.lifetimes():
    if "optimizer" in r.phases:
        print(f"  {r.count} blocks, {r.bytes / 2**20:.1f} MiB at {r.site}: {r.reason} [{r.category}]")
        print(f"      {r.explanation}")
print_phases(a)
print("\n" + a.estimate().sentence)
result(param_bytes=param_bytes, optimizer=o.to_dict(), estimate=a.estimate().to_dict())
