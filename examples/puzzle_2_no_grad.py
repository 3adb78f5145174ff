#!/usr/bin/env python3
"""Puzzle 2: the same forward with and without torch.no_grad().

Under no_grad the activations are freed as soon as the next layer has used
them: the report calls them temporary (made and freed on the model(x)
line). With grad enabled autograd keeps them for backward: "saved for
backward", freed during the backward pass.

    python3 examples/puzzle_2_no_grad.py
"""
from puzzle_common import explain_line, finish, here, print_phases, reasons_at, result, start

torch, LOG = start("puzzle2")
import torchalloc  # noqa: E402

nn = torch.nn
with torchalloc.phase("model"):
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
with torchalloc.phase("data"):
    x = torch.randn(512, 1024, device="cuda")
with torchalloc.phase("warmup"), torch.no_grad():
    model(x)  # the first matmul allocates cuBLAS's workspace: keep it out of the comparison

with torchalloc.phase("forward (no_grad)"), torch.no_grad():
    NO_GRAD_LINE = here() + 1
    y = model(x)
del y
torchalloc.mark("after no_grad forward")

with torchalloc.phase("forward"):
    GRAD_LINE = here() + 1
    y = model(x)
torchalloc.mark("after forward")
with torchalloc.phase("backward"):
    y.sum().backward()
del y

a = finish(LOG)
explain_line(a, __file__, NO_GRAD_LINE, "forward under torch.no_grad(): y = model(x)")
explain_line(a, __file__, GRAD_LINE, "forward with grad: y = model(x)")
print_phases(a)
result(no_grad=reasons_at(a, __file__, NO_GRAD_LINE), grad=reasons_at(a, __file__, GRAD_LINE))
