#!/usr/bin/env python3
"""GPU acceptance: torch.cuda.memory_allocated() deltas under torchalloc equal the native ones.

    python3 examples/allocated_deltas.py [--lib build/libtorchalloc.so] [--json out.json]

Runs the same workloads twice, each in a fresh Python process (the allocator
can be chosen only before CUDA is initialised):

  native      PyTorch's caching allocator
  torchalloc  torchalloc.install(policy="caching", expandable="off", patch_torch=True) (PyTorch's segments and
              block sizes, byte for byte; the default's expandable segments split large blocks more finely), so that
              the unchanged torch.cuda.memory_allocated() answers from torchalloc

and records torch.cuda.memory_allocated() after every step. Workloads: a
3-layer 1024x1024 MLP (parameters, data, forward with and without no_grad,
forward+backward), nn.MultiheadAttention(1024, 1) and
nn.TransformerEncoderLayer(1024, 1, 4096) forward, and torch.utils.checkpoint
around a sub-module. Prints the deltas side by side and exits 1 if any delta
differs (or a child fails). The peak within each step is shown too, for
information: it does not decide the outcome.

Without torch or without a CUDA GPU it prints `SKIP: <reason>` and exits 77.
Build the library first, in the same command on a GPU machine:
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF && cmake --build build -j
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import example_start  # beside this file: which torchalloc, and SKIP

REPO = Path(__file__).resolve().parent.parent
RESULT_TAG = "ALLOCATED_DELTAS_RESULT "
VARIANTS = ("native", "torchalloc")


# ---------------------------------------------------------------------------
# Child: run the workloads, record memory_allocated() after each step
# ---------------------------------------------------------------------------


class Recorder:
    """Runs named steps and records memory_allocated() and the step's own peak."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.rows: list[dict[str, Any]] = []

    def step(self, name: str, fn: Callable[[], None]) -> None:
        cuda = self.torch.cuda
        before = cuda.memory_allocated()
        cuda.reset_peak_memory_stats()
        fn()
        self.rows.append(
            {"step": name, "allocated": cuda.memory_allocated(), "peak_over_start": cuda.max_memory_allocated() - before}
        )


def mlp(rec: Recorder, torch: Any) -> None:
    nn, s = torch.nn, {}
    rec.step("mlp: parameters", lambda: s.update(model=nn.Sequential(
        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()))
    rec.step("mlp: data", lambda: s.update(x=torch.randn(64, 1024, device="cuda")))

    def forward_no_grad() -> None:
        with torch.no_grad():
            s["y"] = s["model"](s["x"])

    rec.step("mlp: forward (no_grad)", forward_no_grad)
    rec.step("mlp: drop output", lambda: s.pop("y"))
    rec.step("mlp: forward", lambda: s.update(y=s["model"](s["x"])))
    rec.step("mlp: backward", lambda: s.pop("y").sum().backward())
    rec.step("mlp: forward+backward", lambda: s["model"](s["x"]).sum().backward())
    rec.step("mlp: zero_grad", lambda: s["model"].zero_grad(set_to_none=True))
    rec.step("mlp: free all", s.clear)


def attention(rec: Recorder, torch: Any) -> None:
    nn, s = torch.nn, {}
    rec.step("mha: parameters", lambda: s.update(m=nn.MultiheadAttention(1024, 1).cuda()))
    rec.step("mha: data", lambda: s.update(x=torch.randn(128, 8, 1024, device="cuda")))
    rec.step("mha: forward", lambda: s.update(y=s["m"](s["x"], s["x"], s["x"])))
    rec.step("mha: drop output", lambda: s.pop("y"))

    def forward_no_grad() -> None:
        with torch.no_grad():
            s["y"] = s["m"](s["x"], s["x"], s["x"])

    rec.step("mha: forward (no_grad)", forward_no_grad)
    rec.step("mha: free all", s.clear)


def encoder(rec: Recorder, torch: Any) -> None:
    nn, s = torch.nn, {}
    rec.step("encoder: parameters", lambda: s.update(m=nn.TransformerEncoderLayer(1024, 1, 4096).cuda()))
    rec.step("encoder: data", lambda: s.update(x=torch.randn(128, 8, 1024, device="cuda")))
    rec.step("encoder: forward", lambda: s.update(y=s["m"](s["x"])))
    rec.step("encoder: drop output", lambda: s.pop("y"))

    def forward_no_grad() -> None:
        with torch.no_grad():
            s["y"] = s["m"](s["x"])

    rec.step("encoder: forward (no_grad)", forward_no_grad)
    rec.step("encoder: drop output 2", lambda: s.pop("y"))

    def eval_fast_path() -> None:  # eval + no_grad takes the fused "fast path"
        s["m"].eval()
        with torch.no_grad():
            s["y"] = s["m"](s["x"])

    rec.step("encoder: eval forward (no_grad)", eval_fast_path)
    rec.step("encoder: free all", s.clear)


def checkpointed(rec: Recorder, torch: Any) -> None:
    nn, s = torch.nn, {}
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(1024, 1024)
            self.block = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
            self.post = nn.Linear(1024, 1024)

        def forward(self, x: Any) -> Any:
            h = self.pre(x)
            h = checkpoint(self.block, h, use_reentrant=False)
            return self.post(h)

    rec.step("checkpoint: parameters", lambda: s.update(m=Net().cuda()))
    rec.step("checkpoint: data", lambda: s.update(x=torch.randn(256, 1024, device="cuda")))
    rec.step("checkpoint: forward", lambda: s.update(y=s["m"](s["x"])))
    rec.step("checkpoint: backward", lambda: s.pop("y").sum().backward())
    rec.step("checkpoint: free all", s.clear)


WORKLOADS = (mlp, attention, encoder, checkpointed)


def child(variant: str) -> None:
    if variant == "torchalloc":
        example_start.choose_torchalloc()
        import torchalloc

        torchalloc.install(policy="caching", expandable="off", patch_torch=True)  # before anything touches CUDA
    import torch

    torch.manual_seed(0)
    rec = Recorder(torch)
    for workload in WORKLOADS:
        workload(rec, torch)
    print(RESULT_TAG + json.dumps({"variant": variant, "torch": torch.__version__, "rows": rec.rows}), flush=True)


# ---------------------------------------------------------------------------
# Parent: run both variants, compare, print the table
# ---------------------------------------------------------------------------


def run_variant(variant: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", variant], capture_output=True, text=True, env=env, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{variant} run failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def deltas(rows: list[dict[str, Any]]) -> list[int]:
    previous, out = 0, []
    for row in rows:
        out.append(row["allocated"] - previous)
        previous = row["allocated"]
    return out


def format_table(native: dict[str, Any], ours: dict[str, Any]) -> tuple[str, int, int]:
    """The side-by-side table, the number of delta mismatches and of (informative) peak mismatches."""
    header = f"{'step':<34} {'native Δ':>14} {'torchalloc Δ':>14}  {'':2} {'native peak':>13} {'ta peak':>13}"
    lines = [header, "-" * len(header)]
    bad = bad_peaks = 0
    names = [r["step"] for r in native["rows"]]
    if names != [r["step"] for r in ours["rows"]]:
        raise RuntimeError("the two runs recorded different steps")
    for name, dn, dt, rn, rt in zip(names, deltas(native["rows"]), deltas(ours["rows"]), native["rows"], ours["rows"]):
        ok = dn == dt
        bad += not ok
        peak_mark = "" if rn["peak_over_start"] == rt["peak_over_start"] else " *"
        bad_peaks += bool(peak_mark)
        lines.append(
            f"{name:<34} {dn:>14,} {dt:>14,}  {'ok' if ok else '!!':2} "
            f"{rn['peak_over_start']:>13,} {rt['peak_over_start']:>13,}{peak_mark}"
        )
    return "\n".join(lines), bad, bad_peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--lib", type=Path, help="libtorchalloc.so to use (default: $TORCHALLOC_LIB, then the usual places)")
    parser.add_argument("--json", type=Path, help="also write both runs' raw numbers here")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    example_start.choose_torchalloc()
    from torchalloc._gpu_child import skip_reason

    reason = skip_reason()
    if reason:
        example_start.cannot_run(reason)
    env = dict(os.environ)
    env.pop("TORCHALLOC_CONF", None)
    if args.lib:
        env["TORCHALLOC_LIB"] = str(args.lib.resolve())
    try:
        runs = {variant: run_variant(variant, env) for variant in VARIANTS}
    except RuntimeError as e:
        print(f"FAIL: {e}")
        return 1
    table, bad, bad_peaks = format_table(runs["native"], runs["torchalloc"])
    print(f"torch {runs['native']['torch']}: torch.cuda.memory_allocated() after each step, as deltas (bytes)\n")
    print(table)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    print()
    if bad_peaks:
        print(f"note: {bad_peaks} step peak(s) differ (marked *); peaks are informative only")
    if bad:
        print(f"FAIL: {bad} delta(s) differ from the native allocator's")
        return 1
    print(f"PASS: all {len(runs['native']['rows'])} deltas equal the native allocator's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
