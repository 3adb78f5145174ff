"""A training-shaped run on the simulated device with the event log on, for test_every_log.py.

    python log_child.py LOG POLICY STACKS PHASES STEPS MODE

STACKS 0|1 (stacks:), PHASES 0|1 (forward/backward phases around each
step), MODE exit (return normally, no teardown: the log is left to the
exit path) or kill (print READY, then wait to be SIGKILLed). Each step
allocates four activations of varying sizes in forward, a gradient in
backward (the first step's is kept, as parameters' .grad are), frees the
activations, and marks "step N".
"""
from __future__ import annotations

import sys
import time

from torchalloc import _lib, phases

MiB = 1 << 20


def main() -> None:
    path, policy, stacks, use_phases, steps, mode = sys.argv[1:7]
    # Ordinary segments, as `replay POLICY` replays them, unless `policy` says otherwise ("caching,expandable:2").
    _lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,expandable:off,policy:{policy},log:{path},"
              f"stacks:{stacks}")
    lib = _lib.lib()
    kept = []
    for i in range(int(steps)):
        if use_phases == "1":
            phases.begin("forward")
        sizes = [(1 + (i + k) % 5) * MiB for k in range(4)]
        activations = [lib.torchalloc_malloc(size, 0, None) for size in sizes]
        if use_phases == "1":
            phases.end("forward")
            phases.begin("backward")
        grad = lib.torchalloc_malloc(3 * MiB, 0, None)
        for ptr, size in zip(activations, sizes):
            lib.torchalloc_free(ptr, size, 0, None)
        if i == 0:
            kept.append(grad)
        else:
            lib.torchalloc_free(grad, 3 * MiB, 0, None)
        if use_phases == "1":
            phases.end("backward")
        lib.torchalloc_mark(f"step {i}".encode())
    if mode == "kill":
        print("READY", flush=True)
        time.sleep(120)


if __name__ == "__main__":
    main()
