"""One rank of a synthetic distributed job on the simulated device, with the event log on, for test_job.py.

    RANK=1 WORLD_SIZE=2 python rank_child.py DIR [STEPS]

Writes DIR/run.%r.talog as a rank under torchrun would (the library expands
%r from $RANK and records $RANK and $WORLD_SIZE in the header). With
$OOM_RANK set, that rank ends by asking for more than its device has (its
OOM report goes beside its log, DIR/run.R.talog.oom-cuda0.txt). Every rank
makes the same parameters; its optimizer-state shard is larger on rank 0
(an uneven split); its forward keeps 3 + 4 * rank activations (uneven
batches), so the highest rank peaks highest, in backward, held by forward().
"""
from __future__ import annotations

import os
import sys
from typing import Any

from torchalloc import _lib, phases

MiB = 1 << 20


# Loops, not comprehensions: a comprehension's frame is named <listcomp> before Python 3.12.
def make_parameters(lib: Any) -> list[int]:
    params = []
    for _ in range(4):
        params.append(lib.torchalloc_malloc(4 * MiB, 0, None))
    return params


def make_optimizer_shard(lib: Any, rank: int) -> list[int]:
    shard = []
    for _ in range(2):
        shard.append(lib.torchalloc_malloc((8 if rank == 0 else 6) * MiB, 0, None))
    return shard


def forward(lib: Any, rank: int) -> list[int]:
    activations = []
    for _ in range(3 + 4 * rank):
        activations.append(lib.torchalloc_malloc(2 * MiB, 0, None))
    return activations


def backward(lib: Any) -> int:
    return lib.torchalloc_malloc(4 * MiB, 0, None)


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    rank = int(os.environ.get("RANK", "0"))
    report = "on" if os.environ.get("OOM_RANK") == str(rank) else "off"
    _lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,oom_report:{report},log:{out}/run.%r.talog,stacks:1")
    lib = _lib.lib()
    phases.begin("setup")
    make_parameters(lib)
    shard = make_optimizer_shard(lib, rank)
    phases.end("setup")
    for i in range(steps):
        phases.begin("forward")
        acts = forward(lib, rank)
        phases.end("forward")
        phases.begin("backward")
        grad = backward(lib)
        for p in acts:
            lib.torchalloc_free(p, 2 * MiB, 0, None)
        phases.end("backward")
        lib.torchalloc_free(grad, 4 * MiB, 0, None)
        lib.torchalloc_mark(f"step {i}".encode())
    if report == "on":
        lib.torchalloc_malloc(2 << 30, 0, None)  # NULL: more than the device's 1 GiB
    del shard  # kept live to the end, as optimizer state is


if __name__ == "__main__":
    main()
