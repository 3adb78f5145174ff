"""A job writing its log on the simulated device, a few steps at a time, for test_top*.py.

    python top_writer.py LOG STEPS_PER_BATCH [KEEP_EVERY]

Each step allocates activations in phase forward, a gradient in backward,
frees the activations, and marks "step N"; the gradient of every
KEEP_EVERY-th step (default 2: the odd steps) is kept: a site that grows
every other step, or at every step (a leak) with 1. Activations are made
in module "model.encoder", gradients in "model.head"; a kept gradient is
tagged as the encoder's (module_tag, role gradient). After each batch of steps
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
    keep_every = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    _lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,expandable:off,log:{path},stacks:1")
    lib = _lib.lib()
    # two modules, as torchalloc.track() names them: activations are made in the encoder, gradients in the head
    lib.torchalloc_module_name(1, b"model.encoder")
    lib.torchalloc_module_name(2, b"model.head")
    kept = []
    step = 0
    while True:
        for _ in range(per_batch):
            phases.begin("forward")
            lib.torchalloc_module_set(1)
            sizes = [(1 + (step + k) % 5) * MiB for k in range(4)]
            activations = [lib.torchalloc_malloc(size, 0, None) for size in sizes]
            phases.end("forward")
            phases.begin("backward")
            lib.torchalloc_module_set(2)
            grad = lib.torchalloc_malloc(3 * MiB, 0, None)
            lib.torchalloc_module_set(0)
            for ptr, size in zip(activations, sizes):
                lib.torchalloc_free(ptr, size, 0, None)
            if step % keep_every == keep_every - 1:
                kept.append(grad)
                lib.torchalloc_module_tag(grad, 1, 2)  # kept as the encoder's gradient: the tag beats "model.head"
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
