"""One run: a workload trained under one variant, in a process of its own.

PyTorch picks its allocator once per process, before CUDA starts, so the
parent starts `bench/models.py --child ...` for every (round, workload,
variant) with the variant's environment already set, and reads back the one
tagged JSON line this prints.

The step is the same for every variant: forward (with the loss), backward,
optimizer step, zero_grad(set_to_none=True), each inside its torchalloc
phase for torchalloc variants (phase_arena needs them; the others only
account by them) and without phases for native ones. Time is per step,
between two torch.cuda.synchronize() calls, after the warm-up steps.
"""
from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from torchalloc import _gpu_child as gpu_child

from .variants import Variant, parse_variant
from .workloads import WORKLOADS, Built

RESULT_TAG = "MODELS_RESULT "


def phases(variant: Variant, device_type: str) -> Callable[[str], AbstractContextManager[Any]]:
    """The context for one part of the step: a torchalloc phase, or nothing for native or on the CPU."""
    if variant.native or device_type != "cuda":
        return lambda _name: contextlib.nullcontext()
    from torchalloc import phase

    return phase


def memory(torch: Any, variant: Variant, device: Any) -> dict[str, Any]:
    """Peaks (torch's own counters: the bridge answers them for torchalloc) and device allocation calls."""
    if device.type != "cuda":
        return {"peak_allocated": None, "peak_reserved": None, "device_allocs": None}
    index = device.index
    out: dict[str, Any] = {"peak_allocated": torch.cuda.max_memory_allocated(index),
                           "peak_reserved": torch.cuda.max_memory_reserved(index), "device_allocs": None}
    if not variant.native:
        counters = gpu_child.counters(index)
        out["device_allocs"] = counters["num_device_alloc"]
        # The library's own peaks, to check the bridge's answers above against.
        out["torchalloc_peak_reserved"], out["torchalloc_peak_allocated"] = gpu_child.peaks(index)
    elif "async" not in variant.modifiers:  # cudaMallocAsync keeps no count of device allocations
        out["device_allocs"] = torch.cuda.memory_stats(index).get("num_device_alloc")
    return out


def train(torch: Any, built: Built, variant: Variant, device: Any, warmup: int, steps: int) -> dict[str, Any]:
    part = phases(variant, device.type)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def step(inputs: Any) -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
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

    warm = [step(built.batch(True)) for _ in range(warmup)]
    timed = [step(built.batch(False)) for _ in range(steps)]
    losses = [loss for _, loss in warm + timed]
    return {"warmup_ms": [ms for ms, _ in warm], "step_ms": [ms for ms, _ in timed],
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}


def child_main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
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
    else:
        device = torch.device("cpu")
    built = spec.build(torch, device, args.run_batch, args.seed, args.steps)
    setup_s = time.perf_counter() - started
    result = train(torch, built, variant, device, args.warmup, args.steps)
    result.update(memory(torch, variant, device))
    result.update({
        "workload": spec.name, "variant": variant.name, "batch": args.run_batch, "setup_s": setup_s,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    })
    gpu_child.print_result(RESULT_TAG, result)
    return 0
