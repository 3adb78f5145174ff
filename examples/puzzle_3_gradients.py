#!/usr/bin/env python3
"""Puzzle 3: forward + backward -- where do the gradients appear?

The .grad tensors are allocated during the first backward (on autograd's
thread), one per parameter, the same size as the parameters, and they stay:
the report shows them as persistent gradients allocated in backward.

    python3 examples/puzzle_3_gradients.py
"""
from puzzle_common import finish, print_phases, result, start

torch, LOG = start("puzzle3")
import torchalloc  # noqa: E402

nn = torch.nn
with torchalloc.phase("model"):
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
with torchalloc.phase("data"):
    x = torch.randn(256, 1024, device="cuda")
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
for step in range(2):
    with torchalloc.phase("forward"):
        loss = model(x).square().mean()
    with torchalloc.phase("backward"):
        loss.backward()
    del loss
    torchalloc.mark(f"after step {step + 1}")

a = finish(LOG)
phases = {p.phase: p for p in a.phases()}
bw = phases["backward"]
est = a.estimate()
print(f"parameters: {param_bytes / 2**20:.2f} MiB; gradients measured: {est.gradients / 2**20:.2f} MiB")
print("\nwhere the gradients come from:")
for r in a.lifetimes():
    if r.category == "gradients":
        print(f"  {r.count} blocks, {r.bytes / 2**20:.2f} MiB at {r.site} [{', '.join(r.phases)}]: {r.explanation}")
print_phases(a)
result(param_bytes=param_bytes, gradients=est.gradients, parameters=est.parameters,
       backward_persistent=bw.persistent_by_category, backward_sentence=bw.sentence)
