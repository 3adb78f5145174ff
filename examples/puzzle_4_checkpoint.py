#!/usr/bin/env python3
"""Puzzle 4: activation checkpointing keeps only a sub-module's output.

Two blocks; the plain forward saves every block's activations for backward.
With torch.utils.checkpoint around block 1, its inner activations are freed
at once (temporary) and recomputed in backward; only its output stays,
saved by block 2. The report's "saved for backward" bytes per forward show
the difference.

    python3 examples/puzzle_4_checkpoint.py
"""
from puzzle_common import explain_line, finish, here, print_phases, result, start

torch, LOG = start("puzzle4")
import torchalloc  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

nn = torch.nn
B, D, HIDDEN = 512, 1024, 4096
with torchalloc.phase("model"):
    block1 = nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D)).cuda()
    block2 = nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D)).cuda()
    x = torch.randn(B, D, device="cuda", requires_grad=True)
with torchalloc.phase("warmup"):
    block2(block1(x)).sum().backward()  # cuBLAS workspaces, gradients: out of the comparison

with torchalloc.phase("forward plain"):
    PLAIN_LINE = here() + 1
    h = block1(x)
    out = block2(h)
with torchalloc.phase("backward plain"):
    out.sum().backward()
del h, out

with torchalloc.phase("forward checkpoint"):
    CKPT_LINE = here() + 1
    h = checkpoint(block1, x, use_reentrant=False)
    out = block2(h)
with torchalloc.phase("backward checkpoint"):
    out.sum().backward()
del h, out

a = finish(LOG)
phases = {p.phase: p for p in a.phases()}
plain, ckpt = phases["forward plain"], phases["forward checkpoint"]
print(f"saved for backward: plain forward {plain.handed_on / 2**20:.1f} MiB, "
      f"checkpointed forward {ckpt.handed_on / 2**20:.1f} MiB")
explain_line(a, __file__, PLAIN_LINE, "block 1 without checkpointing: h = block1(x)")
explain_line(a, __file__, CKPT_LINE, "block 1 under checkpoint: h = checkpoint(block1, x)")
print_phases(a)
output_bytes = B * D * 4
result(saved_plain=plain.handed_on, saved_checkpoint=ckpt.handed_on, transient_checkpoint=ckpt.transient,
       output_bytes=output_bytes, hidden_bytes=B * HIDDEN * 4,
       recompute=phases["backward checkpoint"].allocated - phases["backward plain"].allocated,
       ckpt_line=[r.to_dict() for r in a.lifetimes() if r.site.startswith(f"puzzle_4_checkpoint.py:{CKPT_LINE} ")],
       plain_line=[r.to_dict() for r in a.lifetimes() if r.site.startswith(f"puzzle_4_checkpoint.py:{PLAIN_LINE} ")])
