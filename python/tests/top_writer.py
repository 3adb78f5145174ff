"""A job writing its log on the simulated device, a few steps at a time, for test_top*.py.

    python top_writer.py LOG STEPS_PER_BATCH

Each step allocates activations in phase forward, a gradient in backward,
frees the activations, and marks "step N"; every step's gradient from an odd
step is kept (a site that grows every other step). After each batch of steps
it prints its own figures as one JSON line (allocated, reserved and their
peaks, from torchalloc.stats) and waits for a line on stdin: "more" runs the
next batch, anything else (or end of input) exits normally, closing the log.
The allocations are made from this file's lines, so the log's stacks name
sites here.
"""
from __future__ import annotations

import json
import sys

from torchalloc import _lib, phases, stats

MiB = 1 << 20


def main() -> None:
    path, per_batch = sys.argv[1], int(sys.argv[2])
    _lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,expandable:off,log:{path},stacks:1")
    lib = _lib.lib()
    kept = []
    step = 0
    while True:
        for _ in range(per_batch):
            phases.begin("forward")
            sizes = [(1 + (step + k) % 5) * MiB for k in range(4)]
            activations = [lib.torchalloc_malloc(size, 0, None) for size in sizes]
            phases.end("forward")
            phases.begin("backward")
            grad = lib.torchalloc_malloc(3 * MiB, 0, None)
            for ptr, size in zip(activations, sizes):
                lib.torchalloc_free(ptr, size, 0, None)
            if step % 2:
                kept.append(grad)
            else:
                lib.torchalloc_free(grad, 3 * MiB, 0, None)
            phases.end("backward")
            phases.mark(f"step {step}")
            step += 1
        print(json.dumps({"allocated": stats.memory_allocated(0), "peak_allocated": stats.max_memory_allocated(0),
                          "reserved": stats.memory_reserved(0), "peak_reserved": stats.max_memory_reserved(0),
                          "steps": step}), flush=True)
        if sys.stdin.readline().strip() != "more":
            return


if __name__ == "__main__":
    main()
