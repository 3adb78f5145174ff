#!/usr/bin/env python3
"""A small training run for `torchalloc compare` (or any allocator experiment).

    torchalloc compare -- python3 examples/train_small.py --steps 100

A 4-layer nn.TransformerEncoder (d_model 512) trained with AdamW on random
data, batch and sequence length drawn anew each step (batch 4-16, length
64-1024): the variable shapes that make a caching allocator fragment.
Unmodified PyTorch code: compare installs torchalloc through its start-up
hook. Prints the step time and the peaks torch reports at the end.
Without torch or without a CUDA GPU it prints `SKIP: <reason>` and exits 77,
as the other examples do.
"""
from __future__ import annotations

import argparse
import random
import time

import example_start  # beside this file: which torchalloc, and SKIP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=512)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        example_start.cannot_run(f"torch is not installed ({e})")
    if not torch.cuda.is_available():
        example_start.cannot_run("no CUDA GPU")
    rng = random.Random(0)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(args.d_model, 8, 4 * args.d_model, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, args.layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        x = torch.randn(rng.choice([4, 8, 12, 16]), rng.randint(8, 128) * 8, args.d_model, device="cuda")
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    mib = 1 << 20
    print(f"{ms:.1f} ms/step; peak allocated {torch.cuda.max_memory_allocated() / mib:.0f} MiB, "
          f"peak reserved {torch.cuda.max_memory_reserved() / mib:.0f} MiB")


if __name__ == "__main__":
    main()
