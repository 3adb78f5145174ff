#!/usr/bin/env python3
"""Step time and peak memory of a transformer training loop, per allocator.

    python3 bench/step_time.py [--lib build/libtorchalloc.so]
        [--variants native,caching,exact,phase_arena] [--steps 30] [--rounds 2]
        [--extra-conf ""]

The workload: a 6-layer d_model 1024 nn.TransformerEncoder
(16 heads, feed-forward 4096, dropout 0.1) trained with AdamW; warm-up at
batch 8 x length 512, then --steps steps of a random batch in {2, 4, 8} x a
random length in [128, 768], the same seeded sequence for every variant.

Each (round, variant) runs in a fresh Python process, rounds interleaved
(A B C A B C), because absolute times drift; compare the ratios.

A variant is `native` (optionally `native+expandable` or `native+async`, for
PYTORCH_CUDA_ALLOC_CONF expandable_segments:True / backend:cudaMallocAsync),
or `POLICY[+log][+stacks]` for torchalloc:
    caching          TORCHALLOC_CONF=policy:caching
    caching+log      policy:caching,log:/tmp/step_time_%p.log
    caching+stacks   policy:caching,log:/tmp/step_time_%p.log,stacks:1
--extra-conf is appended (after a comma) to every torchalloc variant's conf.

Without a CUDA GPU (or without torch) it prints `SKIP: <reason>` and exits 0.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))  # run from a checkout without installing

from torchalloc import _gpu_child as child  # noqa: E402
from torchalloc.units import MiB  # noqa: E402

DEFAULT_LIB = REPO / "build" / "libtorchalloc.so"
RESULT_TAG = "STEP_TIME_RESULT "
LOG_PATH = "/tmp/step_time_%p.log"
NATIVE_MODIFIERS = {"expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}
TORCHALLOC_MODIFIERS = ("log", "stacks", "bridge")

# The workload (the module docstring).
D_MODEL, NHEAD, D_FF, LAYERS, DROPOUT = 1024, 16, 4096, 6, 0.1
WARMUP_SHAPE = (8, 512)
BATCHES = (2, 4, 8)
LENGTHS = (128, 768)


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    native: bool
    conf: str  # TORCHALLOC_CONF, or PYTORCH_CUDA_ALLOC_CONF for native ("" = unset)
    policy: str = ""
    route: str = "plain"  # torchalloc: "plain" (CUDAPluggableAllocator) or "bridge" (torchalloc.install)


def parse_variant(text: str, extra_conf: str) -> Variant:
    """`native[+expandable|+async]` or `POLICY[+log][+stacks][+bridge]`."""
    base, *mods = [part.strip() for part in text.split("+")]
    if not base:
        raise ValueError(f"variant {text!r}: empty name")
    if base == "native":
        unknown = [m for m in mods if m not in NATIVE_MODIFIERS]
        if unknown or len(mods) > 1:
            raise ValueError(f"variant {text!r}: native takes at most one of +{' +'.join(NATIVE_MODIFIERS)}")
        return Variant(text, True, NATIVE_MODIFIERS[mods[0]] if mods else "")
    unknown = [m for m in mods if m not in TORCHALLOC_MODIFIERS]
    if unknown:
        raise ValueError(f"variant {text!r}: unknown modifier(s) {unknown} (known: {', '.join(TORCHALLOC_MODIFIERS)})")
    conf = [f"policy:{base}"]
    if "log" in mods or "stacks" in mods:
        conf.append(f"log:{LOG_PATH}")
    if "stacks" in mods:
        conf.append("stacks:1")
    if extra_conf.strip():
        conf.append(extra_conf.strip().strip(","))
    return Variant(text, False, ",".join(conf), policy=base, route="bridge" if "bridge" in mods else "plain")


# ---------------------------------------------------------------------------
# Child: one variant, one round
# ---------------------------------------------------------------------------


def step_shapes(seed: int, steps: int) -> list[tuple[int, int]]:
    """The (batch, length) sequence, identical for every variant and round."""
    rng = random.Random(seed)
    return [(rng.choice(BATCHES), rng.randint(*LENGTHS)) for _ in range(steps)]


def build_model(torch: Any, device: Any) -> tuple[Any, Any]:
    nn = torch.nn
    layer = nn.TransformerEncoderLayer(D_MODEL, NHEAD, D_FF, dropout=DROPOUT, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=LAYERS, enable_nested_tensor=False).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def timed_step(torch: Any, model: Any, opt: Any, x: Any) -> tuple[float, float]:
    """One training step; (milliseconds, loss)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, loss.item()


def native_memory(torch: Any, device: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
        out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
        s = torch.cuda.memory_stats(device)
        out["counters"] = {k: s[k] for k in ("num_alloc_retries", "num_ooms", "num_device_alloc",
                                              "num_device_free") if k in s}
    except RuntimeError as e:  # some backends do not keep every stat
        out.setdefault("peak_reserved", None)
        out.setdefault("peak_allocated", None)
        out["stats_error"] = str(e)
    return out


def torchalloc_memory(device: int) -> dict[str, Any]:
    peak_reserved, peak_allocated = child.peaks(device)
    return {"peak_reserved": peak_reserved, "peak_allocated": peak_allocated, "counters": child.counters(device)}


def child_main(args: argparse.Namespace) -> int:
    import torch

    if args.policy:
        child.install_library(torch, Path(args.lib), args.policy, args.route)
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    device = torch.device("cuda", torch.cuda.current_device())
    model, opt = build_model(torch, device)
    model.train()
    gen = torch.Generator().manual_seed(args.seed + 1)

    def batch(b: int, n: int) -> Any:
        return torch.randn(b, n, D_MODEL, generator=gen).to(device)

    warmup_ms = [timed_step(torch, model, opt, batch(*WARMUP_SHAPE))[0] for _ in range(args.warmup)]
    step_ms: list[float] = []
    losses: list[float] = []
    for b, n in step_shapes(args.seed, args.steps):
        ms, loss = timed_step(torch, model, opt, batch(b, n))
        step_ms.append(ms)
        losses.append(loss)
    gc.collect()
    memory = torchalloc_memory(device.index) if args.policy else native_memory(torch, device.index)
    result = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device),
        "warmup_ms": warmup_ms,
        "step_ms": step_ms,
        "last_loss": losses[-1] if losses else None,
        **memory,
    }
    child.print_result(RESULT_TAG, result)
    return 0


# ---------------------------------------------------------------------------
# Parent: rounds x variants, then the table
# ---------------------------------------------------------------------------


def child_env(v: Variant) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TORCHALLOC_CONF", None)
    if v.native:
        if v.conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = v.conf
    else:
        env["TORCHALLOC_CONF"] = v.conf
    return env


def run_child(v: Variant, args: argparse.Namespace, lib: Path) -> dict[str, Any]:
    child_args = ["--lib", str(lib), "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    if not v.native:
        child_args += ["--policy", v.policy, "--route", v.route]
    return child.run_child(__file__, child_args, child_env(v), args.timeout, RESULT_TAG)


@dataclass
class Summary:
    variant: Variant
    rounds: list[dict[str, Any]] = field(default_factory=list)  # successful child results, in order
    errors: list[str] = field(default_factory=list)

    def steps(self) -> list[float]:
        return [ms for r in self.rounds for ms in r["step_ms"]]

    def round_medians(self) -> list[float]:
        return [statistics.median(r["step_ms"]) for r in self.rounds]

    def peak(self, key: str) -> int | None:
        values = [r[key] for r in self.rounds if r.get(key) is not None]
        return max(values) if values else None


def time_ratio(s: Summary, native: Summary | None) -> float | None:
    """Median over rounds of (this round's median / native's median in the same round)."""
    if native is None or not s.rounds:
        return None
    base = {r["round"]: statistics.median(r["step_ms"]) for r in native.rounds}
    ratios = [statistics.median(r["step_ms"]) / base[r["round"]] for r in s.rounds if r["round"] in base]
    return statistics.median(ratios) if ratios else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(summaries: list[Summary], native: Summary | None) -> list[dict[str, Any]]:
    header = (f"{'variant':<22} {'median ms':>10} {'mean ms':>9} {'x native':>9} "
              f"{'peak res MiB':>13} {'peak alloc MiB':>15} {'res/alloc':>10}")
    print(header)
    print("-" * len(header))
    rows = []
    for s in summaries:
        steps = s.steps()
        res, alloc = s.peak("peak_reserved"), s.peak("peak_allocated")
        row = {
            "variant": s.variant.name,
            "native": s.variant.native,
            "conf": s.variant.conf,
            "rounds_ok": len(s.rounds),
            "median_ms": statistics.median(steps) if steps else None,
            "mean_ms": statistics.fmean(steps) if steps else None,
            "round_median_ms": s.round_medians(),
            "time_vs_native": time_ratio(s, native),
            "peak_reserved": res,
            "peak_allocated": alloc,
            "reserved_over_allocated": res / alloc if res and alloc else None,
            "counters": s.rounds[-1].get("counters") if s.rounds else None,
            "last_loss": [r.get("last_loss") for r in s.rounds],
            "errors": s.errors,
        }
        rows.append(row)
        print(f"{s.variant.name:<22} {fmt(row['median_ms'], '.2f'):>10} {fmt(row['mean_ms'], '.2f'):>9} "
              f"{fmt(row['time_vs_native'], '.3f'):>9} {fmt(res and res / MiB, '.0f'):>13} "
              f"{fmt(alloc and alloc / MiB, '.0f'):>15} {fmt(row['reserved_over_allocated'], '.3f'):>10}"
              + ("   FAILED" if s.errors else ""))
    return rows


def parent_main(args: argparse.Namespace) -> int:
    try:
        variants = [parse_variant(t, args.extra_conf) for t in args.variants.split(",") if t.strip()]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reason = child.skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        return 0
    lib = Path(args.lib).resolve()
    if any(not v.native for v in variants) and child.library_missing(lib):
        return 1
    summaries = [Summary(v) for v in variants]
    for rnd in range(args.rounds):
        for s in summaries:
            print(f"round {rnd + 1}/{args.rounds}: {s.variant.name} "
                  f"({s.variant.conf or 'default conf'}) ...", flush=True)
            result = run_child(s.variant, args, lib)
            if "error" in result:
                s.errors.append(f"round {rnd + 1}: {result['error']}")
                print(f"  FAILED: {result['error']}\n{child.tail(result.get('stderr', ''))}", file=sys.stderr)
            else:
                s.rounds.append(dict(result, round=rnd))
    native = next((s for s in summaries if s.variant.name == "native"), None)
    first = next((r for s in summaries for r in s.rounds), {})
    print(f"\ntorch {first.get('torch', '?')} on {first.get('gpu', '?')}; {args.rounds} rounds x "
          f"{args.steps} steps (warm-up {args.warmup} x batch {WARMUP_SHAPE[0]} x {WARMUP_SHAPE[1]}), seed {args.seed}\n")
    rows = print_table(summaries, native)
    blob = {"workload": {"d_model": D_MODEL, "nhead": NHEAD, "dim_feedforward": D_FF, "layers": LAYERS,
                         "dropout": DROPOUT, "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds,
                         "seed": args.seed},
            "torch": first.get("torch"), "gpu": first.get("gpu"), "variants": rows}
    print("\n" + json.dumps(blob))
    failed = [s.variant.name for s in summaries if s.errors]
    if failed:
        print(f"\nFAIL: {', '.join(failed)} had failed runs (see above)", file=sys.stderr)
        return 1
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=str(DEFAULT_LIB), help="path to libtorchalloc.so (default: %(default)s)")
    p.add_argument("--variants", default="native,caching,exact,phase_arena",
                   help="comma-separated: native[+expandable|+async] or POLICY[+log][+stacks] (default: %(default)s)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per run (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps at batch 8 x 512 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1234, help="seed of weights, data and shapes (default: %(default)s)")
    p.add_argument("--extra-conf", default="", help="appended to TORCHALLOC_CONF of torchalloc variants")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per child (default: %(default)s)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="", help=argparse.SUPPRESS)
    p.add_argument("--route", default="plain", choices=child.ROUTES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        p.error("--steps and --rounds must be at least 1, --warmup at least 0")
    return args


def main() -> int:
    args = parse_args()
    return child_main(args) if args.child else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
