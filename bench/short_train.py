#!/usr/bin/env python3
"""A short training script, as a user would time start to exit: eight Linear(4096, 4096) layers with ReLU,
Adam, 60 steps of batch 256, synchronized at the end.

    python3 bench/short_train.py              # PyTorch's allocator
    python3 bench/short_train.py --install    # torchalloc.install() first (the default configuration)
    python3 bench/short_train.py --marks      # and a last line of wall-clock marks (bench/start_to_exit.py)
    torchalloc compare --policies native,caching --rounds 3 -- python3 bench/short_train.py

Prints the seconds of its 60 steps; the caller times the whole process. Without torch or a CUDA GPU it
says so and exits 2.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

STARTED = time.time()  # the script's first line: what came before is the interpreter's start


def main(argv: list[str]) -> int:
    try:
        import torch
    except ImportError:
        print("short_train.py: needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():  # asks the driver; starts neither CUDA's context nor an allocator
        print("short_train.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    marks = {"started": STARTED, "torch": time.time()}
    if "--install" in argv:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
        import torchalloc

        torchalloc.install()
    marks["installed"] = time.time()
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    marks["made"] = time.time()  # the model made on the CPU: no allocator has run yet
    model = model.cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(256, 4096, device="cuda")
    torch.cuda.synchronize()
    marks["built"] = time.time()  # CUDA started, the model on the GPU
    t0 = time.perf_counter()
    for _ in range(60):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    print(f"60 steps: {time.perf_counter() - t0:.3f} s")
    marks["trained"] = time.time()
    if "--marks" in argv:  # wall-clock seconds since the epoch; the caller adds the process's launch and end
        print(json.dumps({"marks": marks}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
