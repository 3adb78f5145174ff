"""One run: a workload trained under one variant, in a process of its own.

PyTorch picks its allocator once per process, before CUDA starts, so the
parent starts `bench/models.py --child ...` for every (round, workload,
variant) with the variant's environment already set, and reads back the one
tagged JSON line this prints.

The step is the same for every variant: forward (with the loss), backward,
optimizer step, zero_grad(set_to_none=True), each inside its torchalloc
phase for torchalloc variants (phase_arena needs them; the others only
account by them) and without phases for native ones; an inference
workload's step is its forward alone, under torch.no_grad(). Time is per
step, between two torch.cuda.synchronize() calls, warm-up steps included
(reported apart).

With --cap F (bench/fit.py) the run is made under
torch.cuda.set_per_process_memory_fraction(F), set before the model is
built; running out of memory is then a result ("oom": true and where),
not a failure.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from torchalloc import _gpu_child as gpu_child

from .variants import Variant, parse_variant
from .workloads import WORKLOADS, Built

RESULT_TAG = "MODELS_RESULT "
CPUS_ENV = "TORCHALLOC_BENCH_CPUS"  # the CPUs the parent gives a run (runner.child_env), comma-separated


def phases(variant: Variant, device_type: str) -> Callable[[str], AbstractContextManager[Any]]:
    """The context for one part of the step: a torchalloc phase, or nothing for native or on the CPU."""
    if variant.native or device_type != "cuda":
        return lambda _name: contextlib.nullcontext()
    from torchalloc import phase

    return phase


def memory(torch: Any, variant: Variant, device: Any) -> dict[str, Any]:
    """Peaks (torch's own counters: the bridge answers them for torchalloc) and device calls: allocations
    (or, expandable, maps), frees (unmaps) and synchronizes. torchalloc counts each from its library;
    PyTorch's caching allocator counts allocations and frees, and its synchronize-and-free-events passes
    as num_sync_all_streams (not the stream synchronizes of its expandable segments' unmapping);
    cudaMallocAsync counts none of them."""
    out: dict[str, Any] = {"peak_allocated": None, "peak_reserved": None, "device_allocs": None,
                           "device_frees": None, "synchronizes": None}
    if device.type != "cuda":
        return out
    index = device.index
    out["peak_allocated"] = torch.cuda.max_memory_allocated(index)
    out["peak_reserved"] = torch.cuda.max_memory_reserved(index)
    if not variant.native:
        counters = gpu_child.counters(index)
        out["device_allocs"] = counters["num_device_alloc"]
        out["device_frees"] = counters["num_device_free"]
        out["synchronizes"] = counters["num_synchronizes"]
        # The library's own peaks, to check the bridge's answers above against.
        out["torchalloc_peak_reserved"], out["torchalloc_peak_allocated"] = gpu_child.peaks(index)
    elif "async" not in variant.modifiers:
        stats = torch.cuda.memory_stats(index)
        out["device_allocs"] = stats.get("num_device_alloc")
        out["device_frees"] = stats.get("num_device_free")
        out["synchronizes"] = stats.get("num_sync_all_streams")
    return out


PROFILE_COUNTERS = ("num_handles_created", "num_handles_moved", "num_handles_released", "num_moves_declined",
                    "host_ns", "timed_calls")


def profile(variant: Variant, device: Any) -> Callable[[], dict[str, int]] | None:
    """torchalloc's cumulative handle counts and host time in malloc/free (time_calls:1), or None (native)."""
    if variant.native or device.type != "cuda":
        return None
    index = device.index
    return lambda: {k: v for k, v in gpu_child.counters(index).items() if k in PROFILE_COUNTERS}


def per_step(before: dict[str, int], after: dict[str, int], steps: int) -> dict[str, float]:
    """What the timed steps added, per step: handles made, moved and released, host ns and calls."""
    return {k: (after[k] - before[k]) / steps for k in PROFILE_COUNTERS} if steps else {}


def train(torch: Any, built: Built, variant: Variant, device: Any, warmup: int, steps: int,
          capped: bool = False) -> dict[str, Any]:
    part = phases(variant, device.type)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def step(inputs: Any) -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        if built.opt is None:  # inference
            with part("forward"), torch.no_grad():
                loss = built.loss(inputs)
        else:
            with part("forward"):
                loss = built.loss(inputs)
            with part("backward"):
                loss.backward()
            with part("optimizer"):
                built.opt.step()
            with part("zero_grad"):
                built.opt.zero_grad(set_to_none=True)
        sync()
        return (time.perf_counter() - t0) * 1e3, float(loss.detach().item())

    done: list[tuple[float, float]] = []  # (ms, loss) of every step so far, warm-up first
    out: dict[str, Any] = {"warmup_ms": [], "step_ms": []}
    counters = profile(variant, device)
    before = counters() if counters and not warmup else None
    try:
        for i in range(warmup + steps):
            done.append(step(built.batch(i < warmup)))
            if counters and i == warmup - 1:  # after the warm-up's synchronize: the timed steps' counts start
                before = counters()
    except torch.OutOfMemoryError as e:  # only reached under --cap: without one, it fails the run
        if not capped:
            raise
        out.update(oom=True, oom_step=len(done), oom_message=" ".join(str(e).split())[:300])
    out["warmup_ms"] = [ms for ms, _ in done[:warmup]]
    out["step_ms"] = [ms for ms, _ in done[warmup:]]
    if counters and before is not None:
        now = counters()
        out["per_step"] = per_step(before, now, len(out["step_ms"]))
        out["moves_declined"] = now["num_moves_declined"]  # the whole run's, warm-up included (move_time)
    losses = [loss for _, loss in done]
    out.update(first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None)
    return out


def pin_cpus() -> None:
    """Keep to the CPUs the parent gave this run (CPUS_ENV: a lane's share of the host), before torch
    starts its thread pools (OMP_NUM_THREADS, set beside it, sizes them)."""
    given = os.environ.get(CPUS_ENV)
    if given:
        os.sched_setaffinity(0, {int(c) for c in given.split(",")})


def child_main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    pin_cpus()
    variant = parse_variant(args.variant)
    spec = WORKLOADS[args.workload]
    import torch

    if args.device == "cuda" and not variant.native:
        # The policy is in $TORCHALLOC_CONF (set by the parent); this checks that the library took it.
        gpu_child.install_library(torch, Path(args.lib), variant.policy, "bridge")
    if variant.history:
        torch.cuda.memory._record_memory_history(stacks="python")
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        torch.cuda.manual_seed_all(args.seed)
        device = torch.device("cuda", torch.cuda.current_device())
        if args.cap:
            torch.cuda.set_per_process_memory_fraction(args.cap, device)
    else:
        device = torch.device("cpu")
    result: dict[str, Any] = {"oom": False, "cap": args.cap or None}
    try:
        built = spec.build(torch, device, args.run_batch, args.seed, args.steps)
    except torch.OutOfMemoryError as e:  # the model and optimizer alone do not fit under the cap
        if not args.cap:
            raise
        built = None
        result.update(oom=True, oom_step=-1, oom_message=" ".join(str(e).split())[:300], warmup_ms=[], step_ms=[],
                      first_loss=None, last_loss=None)
    setup_s = time.perf_counter() - started
    if built is not None:
        result.update(train(torch, built, variant, device, args.warmup, args.steps, capped=bool(args.cap)))
    result.update(memory(torch, variant, device))
    result.update({
        "workload": spec.name, "variant": variant.name, "batch": args.run_batch, "setup_s": setup_s,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "device_total": torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None,
    })
    gpu_child.print_result(RESULT_TAG, result)
    return 0
