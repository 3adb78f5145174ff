#!/usr/bin/env python3
"""Bit-for-bit training parity: torchalloc against PyTorch's native allocator.

    python3 examples/train_parity.py [--lib build/libtorchalloc.so]
        [--policies caching,caching+off,exact,phase_arena] [--steps 5]

A policy alone runs as configured by default (caching and phase_arena:
expandable:reclaim where the driver has virtual memory management);
POLICY+MODE sets TORCHALLOC_CONF expandable:MODE too (off, on, compact,
reclaim): caching+off is PyTorch's allocator byte for byte.

Trains three small models (MLP + SGD, MLP + AdamW, one TransformerEncoderLayer
+ AdamW) with deterministic algorithms and a fixed seed, once under the native
allocator and once under torchalloc per policy, each run in a fresh Python
process: `change_current_allocator` works only before CUDA is initialised.
An allocator must not change the numbers, so every torchalloc run's losses
must equal the native run's bit for bit. Prints a table of losses-equal, peak
memory and step time; exits 1 on any mismatch or failed child.

Without a CUDA GPU (or without torch) it prints `SKIP: <reason>` and exits 77.
Build the library first:
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF && cmake --build build -j
"""
from __future__ import annotations

import argparse
import gc
import os
import struct
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one

from torchalloc import _gpu_child as child  # noqa: E402
from torchalloc.units import MiB  # noqa: E402

DEFAULT_LIB = example_start.default_library()
RESULT_TAG = "TRAIN_PARITY_RESULT "
MODELS = ("mlp_sgd", "mlp_adamw", "transformer_adamw")
SEED = 1234


# ---------------------------------------------------------------------------
# Child: one allocator, three models
# ---------------------------------------------------------------------------


class MemoryMeter:
    """Peak reserved/allocated bytes from whichever allocator is in charge."""

    def __init__(self, torch: Any, torchalloc: bool, device: int) -> None:
        self.torch, self.torchalloc, self.device = torch, torchalloc, device

    def reset(self) -> None:
        gc.collect()
        self.torch.cuda.synchronize()
        if not self.torchalloc:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats(self.device)
        else:
            child.empty_cache(self.device)
            child.reset_peaks(self.device)

    def peaks(self) -> tuple[int, int]:
        """(peak reserved bytes, peak allocated bytes) since reset()."""
        if not self.torchalloc:
            return (self.torch.cuda.max_memory_reserved(self.device),
                    self.torch.cuda.max_memory_allocated(self.device))
        return child.peaks(self.device)


def float_bits(x: float) -> str:
    """The exact float32 bits of a loss, as hex."""
    return struct.pack("<f", x).hex()


def set_determinism(torch: Any) -> None:
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    with warnings.catch_warnings():
        # The legacy flags still work in torch 2.11 and keep the old and new
        # TF32 settings consistent; only a deprecation warning is silenced.
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def seed_all(torch: Any, seed: int) -> None:
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def make_mlp(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024),
    )


def make_transformer(torch: Any) -> Any:
    return torch.nn.TransformerEncoderLayer(
        d_model=1024, nhead=8, dim_feedforward=4096, batch_first=True, dropout=0.0)


def build(torch: Any, name: str, device: Any) -> tuple[Any, Any, tuple[int, ...]]:
    """(model, optimizer, input shape) for one of MODELS, seeded."""
    seed_all(torch, SEED)
    if name == "mlp_sgd":
        model = make_mlp(torch).to(device)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), (512, 1024)
    if name == "mlp_adamw":
        model = make_mlp(torch).to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3), (512, 1024)
    if name == "transformer_adamw":
        model = make_transformer(torch).to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4), (8, 256, 1024)
    raise ValueError(f"unknown model {name!r}")


def make_batches(torch: Any, shape: tuple[int, ...], steps: int, device: Any) -> list[tuple[Any, Any]]:
    """Inputs and targets drawn on the CPU from a seeded generator, then moved."""
    gen = torch.Generator().manual_seed(SEED + 1)
    batches = []
    for _ in range(steps):
        x = torch.randn(shape, generator=gen)
        y = torch.randn(shape, generator=gen)
        batches.append((x.to(device), y.to(device)))
    return batches


def train(torch: Any, name: str, steps: int, device: Any, meter: MemoryMeter) -> dict[str, Any]:
    meter.reset()
    model, opt, shape = build(torch, name, device)
    batches = make_batches(torch, shape, steps, device)
    loss_fn = torch.nn.MSELoss()
    model.train()
    losses: list[float] = []
    times_ms: list[float] = []
    for x, y in batches:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    peak_reserved, peak_allocated = meter.peaks()
    timed = times_ms[1:] or times_ms
    del model, opt, batches, loss
    return {
        "losses": losses,
        "loss_bits": [float_bits(v) for v in losses],
        "step_ms": sum(timed) / len(timed),
        "peak_reserved": peak_reserved,
        "peak_allocated": peak_allocated,
    }


def child_main(args: argparse.Namespace) -> int:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    import torch

    if args.policy:
        child.install_library(torch, Path(args.lib), args.policy, args.route)
    set_determinism(torch)
    device = torch.device("cuda", torch.cuda.current_device())
    meter = MemoryMeter(torch, bool(args.policy), device.index)
    results = {name: train(torch, name, args.steps, device, meter) for name in MODELS}
    out = {
        "allocator": f"torchalloc:{args.policy}" if args.policy else "native",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device),
        "models": results,
    }
    if args.policy:
        out["counters"] = child.counters(device.index)
    child.print_result(RESULT_TAG, out)
    return 0


# ---------------------------------------------------------------------------
# Parent: run the children, compare, report
# ---------------------------------------------------------------------------


def run_child(lib: Path, policy: str | None, steps: int, timeout: float, route: str) -> dict[str, Any]:
    """One training run in a fresh interpreter; returns its result or {"error": ...}.
    `policy`: POLICY or POLICY+MODE (TORCHALLOC_CONF expandable:MODE)."""
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    env.pop("TORCHALLOC_CONF", None)
    args = ["--lib", str(lib), "--steps", str(steps), "--route", route]
    if policy:
        name, _, mode = policy.partition("+")
        env["TORCHALLOC_CONF"] = f"policy:{name}" + (f",expandable:{mode}" if mode else "")
        args += ["--policy", name]
    return child.run_child(__file__, args, env, timeout, RESULT_TAG)


def first_difference(ref: dict[str, Any], got: dict[str, Any]) -> str | None:
    """None when the two loss sequences are bit-identical, else where they part."""
    a, b = ref["loss_bits"], got["loss_bits"]
    if len(a) != len(b):
        return f"{len(b)} losses, expected {len(a)}"
    for step, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return (f"step {step}: native {ref['losses'][step]!r} (0x{x}), "
                    f"torchalloc {got['losses'][step]!r} (0x{y})")
    return None


def print_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Print one row per (allocator, model); return the mismatch messages."""
    native = runs["native"]["models"]
    header = f"{'allocator':<22} {'model':<18} {'losses equal':>12} {'peak res MiB':>13} {'peak alloc MiB':>15} {'ms/step':>9}"
    print(header)
    print("-" * len(header))
    problems: list[str] = []
    for alloc, run in runs.items():
        for model, r in run["models"].items():
            if alloc == "native":
                equal = "reference"
            else:
                diff = first_difference(native[model], r)
                equal = "yes" if diff is None else "NO"
                if diff is not None:
                    problems.append(f"{alloc} / {model}: losses differ at {diff}")
            print(f"{alloc:<22} {model:<18} {equal:>12} {r['peak_reserved'] / MiB:>13.1f} "
                  f"{r['peak_allocated'] / MiB:>15.1f} {r['step_ms']:>9.2f}")
    return problems


def parent_main(args: argparse.Namespace) -> int:
    reason = child.skip_reason()
    if reason:
        example_start.cannot_run(reason)
    lib = Path(args.lib).resolve()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if policies and child.library_missing(lib):
        return 1
    runs: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for policy in [None, *policies]:
        name = f"torchalloc:{policy}" if policy else "native"
        print(f"running {name} ({args.steps} steps per model) ...", flush=True)
        result = run_child(lib, policy, args.steps, args.timeout, args.route)
        if "error" in result:
            failures.append(f"{name}: {result['error']}\n--- stderr (tail) ---\n{child.tail(result.get('stderr', ''))}")
            if policy is None:
                break  # nothing to compare against
        else:
            runs[name] = result
    if "native" in runs:
        first = runs["native"]
        print(f"\ntorch {first['torch']} on {first['gpu']}, {args.steps} steps, seed {SEED}\n")
        failures += print_table(runs)
    if failures:
        print("\nFAIL:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    print(f"\nOK: all {len(runs) - 1} torchalloc runs match the native allocator bit for bit")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=str(DEFAULT_LIB), help="path to libtorchalloc.so (default: %(default)s)")
    p.add_argument("--policies", default="caching,caching+off,exact,phase_arena",
                   help="comma-separated torchalloc policies to compare, each POLICY (its default segments) or "
                   "POLICY+MODE (expandable:MODE) (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="training steps per model (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per child (default: %(default)s)")
    p.add_argument("--route", default="plain", choices=child.ROUTES,
                   help="plain: the bare CUDAPluggableAllocator; bridge: torchalloc.install() through the C++ bridge "
                        "(default: %(default)s)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--policy", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    return child_main(args) if args.child else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
