#!/usr/bin/env python3
"""`torch.empty` + `del` on a GPU: ns per pair under PyTorch's allocator and torchalloc's.

    python3 bench/pair_gpu.py [--variants native,caching,caching+off] [--rounds 3] [--pairs 200000]

A variant is native, a policy (as install() sets it up: caching and
phase_arena with expandable:reclaim where the driver has virtual memory
management), or POLICY+MODE with MODE one of off, on (or expandable),
compact, reclaim.

Each (round, variant) runs in a fresh process (the allocator is chosen
before CUDA starts), rounds interleaved; sizes 512 B, 1 MiB and 64 MiB,
the block cached after a warm-up, so this times the allocator's hot path
plus PyTorch's tensor creation (the same in every variant). Prints the
median ns per pair and the difference to native (target: at most +100 ns).
Without torch or a GPU: `SKIP: <reason>`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = (512, 1 << 20, 64 << 20)
CHILD = r"""
import json, sys, time, torch
variant, pairs = sys.argv[1], int(sys.argv[2])
if variant != "native":
    import torchalloc
    name, _, mode = variant.partition("+")  # POLICY (its default segments: reclaim) or POLICY+off|on|expandable|...
    torchalloc.install(policy=name, **({"expandable": {"expandable": "on"}.get(mode, mode)} if mode else {}))
torch.empty(1, device="cuda")
out = {}
for size in (512, 1 << 20, 64 << 20):
    for _ in range(1000):  # warm: the block is cached
        x = torch.empty(size, dtype=torch.uint8, device="cuda"); del x
    t0 = time.perf_counter_ns()
    for _ in range(pairs):
        x = torch.empty(size, dtype=torch.uint8, device="cuda"); del x
    out[size] = (time.perf_counter_ns() - t0) / pairs
print("PAIR " + json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="native,caching,caching+off,caching+expandable")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=200000)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "python"))
    from torchalloc._gpu_child import skip_reason

    reason = skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        return 0
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            done = subprocess.run([sys.executable, "-c", CHILD, v, str(args.pairs)], capture_output=True, text=True,
                                  env=env, timeout=300)
            line = [x for x in done.stdout.splitlines() if x.startswith("PAIR ")]
            if done.returncode or not line:
                print(f"{v} round {r}: FAILED\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            runs[v].append({int(k): t for k, t in json.loads(line[-1][5:]).items()})
    print(f"torch.empty + del, ns per pair, median of {args.rounds} interleaved rounds (min-max)")
    print(f"{'variant':<20}" + "".join(f"{s:>28}" for s in ("512 B", "1 MiB", "64 MiB")))
    base = {s: statistics.median(x[s] for x in runs["native"]) for s in SIZES} if runs.get("native") else None
    for v in variants:
        if not runs[v]:
            continue
        cells = []
        for s in SIZES:
            vals = [x[s] for x in runs[v]]
            med = statistics.median(vals)
            delta = f" {med - base[s]:+.0f}" if base else ""
            cells.append(f"{med:7.0f} ({min(vals):.0f}-{max(vals):.0f}){delta:>7}")
        print(f"{v:<20}" + "".join(f"{c:>28}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
