"""What recording Python stacks costs per allocation, without a GPU.

Drives the library on the simulated device from Python, holding the GIL
through each call as PyTorch does (ctypes.PyDLL), from inside a recursion of
DEPTH frames, and prints ns per malloc+free pair for:

  nolog      no log at all
  log        log:FILE, stacks:0
  stacks     log:FILE, stacks:1 (a capture at every malloc and every free)

Two call patterns: `same` allocates from one line (the best case for any
cache), `lines` cycles through 8 allocation sites, each its own line.
Rounds of the configurations are interleaved; medians and spreads are
printed. The stack's own cost per pair is `stacks - log`.

    python3 bench/bench_stacks.py [--lib build/libtorchalloc.so] [--depths 1,8,32] [--pairs 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(path: str) -> ctypes.PyDLL:
    lib = ctypes.PyDLL(path)  # PyDLL: the GIL stays held through the call, as under torch.empty
    lib.torchalloc_init.argtypes = [ctypes.c_char_p]
    lib.torchalloc_init.restype = ctypes.c_int
    lib.torchalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.torchalloc_malloc.restype = ctypes.c_void_p
    lib.torchalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.torchalloc_free.restype = None
    lib.torchalloc_teardown.restype = None
    lib.torchalloc_last_error.restype = ctypes.c_char_p
    return lib


def same_site(lib: ctypes.PyDLL, pairs: int) -> float:
    malloc, free = lib.torchalloc_malloc, lib.torchalloc_free
    t0 = time.perf_counter_ns()
    for _ in range(pairs):
        p = malloc(4096, 0, None)
        free(p, 4096, 0, None)
    return (time.perf_counter_ns() - t0) / pairs


def eight_sites(lib: ctypes.PyDLL, pairs: int) -> float:
    malloc, free = lib.torchalloc_malloc, lib.torchalloc_free
    t0 = time.perf_counter_ns()
    for _ in range(pairs // 8):
        a = malloc(512, 0, None)
        b = malloc(1024, 0, None)
        c = malloc(2048, 0, None)
        d = malloc(4096, 0, None)
        free(a, 512, 0, None)
        free(b, 1024, 0, None)
        e = malloc(8192, 0, None)
        f = malloc(16384, 0, None)
        free(c, 2048, 0, None)
        free(d, 4096, 0, None)
        g = malloc(32768, 0, None)
        h = malloc(65536, 0, None)
        free(e, 8192, 0, None)
        free(f, 16384, 0, None)
        free(g, 32768, 0, None)
        free(h, 65536, 0, None)
    return (time.perf_counter_ns() - t0) / (pairs // 8 * 8)


def at_depth(depth: int, fn, *args) -> float:
    if depth <= 1:
        return fn(*args)
    return at_depth(depth - 1, fn, *args)


def measure(lib: ctypes.PyDLL, conf: str, pattern: str, depth: int, pairs: int) -> float:
    lib.torchalloc_teardown()
    if lib.torchalloc_init(conf.encode()) != 0:
        sys.exit(f"bench_stacks: {lib.torchalloc_last_error().decode()}")
    fn = same_site if pattern == "same" else eight_sites
    at_depth(depth, fn, lib, pairs // 10)  # warm-up: stacks interned, caches filled
    ns = at_depth(depth, fn, lib, pairs)
    lib.torchalloc_teardown()
    return ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=str(ROOT / "build" / "libtorchalloc.so"))
    ap.add_argument("--depths", default="1,8,32", help="Python frames below the allocating one (default 1,8,32)")
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stack-depth", type=int, default=16, help="stack_depth: frames kept per stack (default 16)")
    args = ap.parse_args()
    lib = load(args.lib)
    log = os.path.join(tempfile.mkdtemp(prefix="bench_stacks"), "bench.talog")
    base = "backend:sim,sim_capacity:1TiB,oom:null"
    confs = {
        "nolog": base,
        "log": f"{base},log:{log}",
        "stacks": f"{base},log:{log},stacks:1,stack_depth:{args.stack_depth}",
    }
    print(f"{args.lib}: ns per malloc+free pair from Python (GIL held), median [min-max] of {args.rounds} rounds")
    print(f"{'pattern':8} {'depth':>5} " + " ".join(f"{k:>22}" for k in confs) + f" {'stacks - log':>14}")
    for pattern in ("same", "lines"):
        for depth in (int(d) for d in args.depths.split(",")):
            runs: dict[str, list[float]] = {k: [] for k in confs}
            for _ in range(args.rounds):
                for name, conf in confs.items():
                    runs[name].append(measure(lib, conf, pattern, depth, args.pairs))
            med = {k: statistics.median(v) for k, v in runs.items()}
            cells = " ".join(f"{med[k]:8.0f} [{min(v):5.0f}-{max(v):5.0f}]" for k, v in runs.items())
            print(f"{pattern:8} {depth:5d} {cells} {med['stacks'] - med['log']:11.0f} ns")


if __name__ == "__main__":
    main()
