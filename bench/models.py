#!/usr/bin/env python3
"""Memory and step time of real training workloads under every allocator variant, in one interleaved run.

    python3 bench/models.py [--workloads convnet,encoder,resnet50,vit_b16,gpt2,llama,moe,detection,seq2seq,
        llama_generate]
        [--variants ...] [--rounds 3] [--steps N] [--out results.json] [--markdown table.md] [--quick] [--dry-run]
    python3 bench/models.py --stacks ...          # deliverable 4: the cost of logging, on GPT-2
    python3 bench/models.py --merge A.json B.json [--markdown table.md]   # one table from several runs

Workloads (random weights, nothing downloaded; see bench/suite/workloads.py):
convnet, encoder (bench/step_time.py's), resnet50 (torchvision, bf16
autocast), vit_b16 (timm), gpt2 (transformers, 12 layers), llama (a
Llama-style decoder, sequence lengths drawn from 256-2048 per step), moe
(a Mixtral-style mixture-of-experts decoder, the same lengths), detection
(torchvision's Mask R-CNN, image sizes and box counts drawn per step:
thousands of allocations a step), seq2seq (a T5-small-sized
encoder-decoder, source and target lengths drawn per step); all AdamW; and
llama_generate
(generate() with a growing KV cache, prompt and output lengths drawn per
step).
Variants (bench/suite/variants.py): native, native+expandable,
native+async, native+history, torchalloc (install() with nothing set: the
default, caching with expandable:reclaim), and torchalloc
POLICY[+expandable|+compact|+reclaim][+log][+stacks] through the C++ bridge
(a policy alone: ordinary segments). By default: native, native+expandable,
native+async, torchalloc, caching+expandable and caching, 3 rounds. `exact`
runs only on convnet and encoder unless --exact-everywhere (one device
allocation per request is slow on big models).

Every (round, workload, variant) is a fresh process; rounds interleave the
variants. Per variant the table gives the median step time and the mean
over all steps (warm-up included), each with its ratio to native (median
and min-max over rounds), the first 10 steps' time, peak allocated and
reserved (torch.cuda.max_memory_*), their ratio, device allocation (or
map), free (or unmap) and synchronize calls, and the first and last loss
(a checksum of the tokens for llama_generate). For torchalloc variants,
per step after the warm-up: the host time spent inside torchalloc's
malloc and free (TORCHALLOC_CONF time_calls:1, added unless
--no-host-time: two clock reads a call, no synchronize), and the handles
of expandable segments made, moved to a new address and released. Progress goes to stderr;
the table, the targets of the issue (reported, never asserted) and a JSON
line to stdout; --out gets the raw records after every run, --markdown
the table for BENCHMARKS.md. The whole default plan takes far longer than
one call's budget: run it a few workloads at a time, each with --out, and
--merge the files (BENCHMARKS.md gives the commands), or on a host of
several GPUs with --gpus N: the workloads are spread over N of them (each
workload's runs on one GPU, the longest estimates first to the least loaded
card), and the lanes run side by side.

Without torch or a CUDA GPU it prints `SKIP: <reason>` and exits 0;
--dry-run prints the plan and its estimated time anywhere; --device cpu
runs native variants on the CPU (a smoke test of the workloads' code).
Exit status: 0 all runs succeeded, 1 some failed, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "python"), str(BENCH)]  # run from a checkout without installing

from suite import lanes, runner, table  # noqa: E402
from suite.child import child_main  # noqa: E402
from suite.variants import DEFAULT_VARIANTS, STACKS_VARIANTS, parse_variants  # noqa: E402
from suite.workloads import WORKLOADS, parse_batches, parse_workloads  # noqa: E402
from torchalloc import _gpu_child as gpu_child  # noqa: E402

QUICK_STEPS, QUICK_WARMUP = 5, 2
STARTED = time.monotonic()  # --budget counts from here: preparing the bridge is part of the wall-clock limit


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, not argparse's usage block: the reason is what a reader needs."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="bench/models.py", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=None, help=f"comma-separated, of: {', '.join(WORKLOADS)} (default: all)")
    p.add_argument("--variants", default=None, help=f"comma-separated (default: {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--stacks", action="store_true",
                   help=f"the logging comparison: gpt2 with {','.join(STACKS_VARIANTS)} (unless given), 3 rounds")
    p.add_argument("--exact-everywhere", action="store_true", help="run `exact` on every workload")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default: per workload, 15-40)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps before timing (default 3)")
    runner.add_run_options(p, REPO / "build" / "libtorchalloc.so", "the suite started")
    p.add_argument("--no-host-time", action="store_true",
                   help="do not count torchalloc's host time in malloc/free (time_calls:1, two clock reads a call)")
    p.add_argument("--quick", action="store_true", help=f"1 round of {QUICK_STEPS} steps: a check, not a figure")
    p.add_argument("--gpus", type=int, default=1,
                   help="spread the workloads over this many GPUs of the host, side by side: each workload's runs "
                   "on one GPU, so its ratios to native stay on one card (default: 1)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and estimated time; run nothing")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--merge", type=Path, nargs="+", default=None, help="tabulate earlier --out files instead")
    # The child's own arguments (bench/models.py --child ...).
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", default="", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    p.add_argument("--run-batch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cap", type=float, default=0.0, help=argparse.SUPPRESS)  # bench/fit.py: a memory fraction
    args = p.parse_args(argv)
    if args.child:
        return args
    quick_or = (lambda quick, normal: quick if args.quick else normal)
    args.rounds = args.rounds if args.rounds is not None else quick_or(1, 3)
    args.warmup = args.warmup if args.warmup is not None else quick_or(QUICK_WARMUP, 3)
    args.steps = args.steps if args.steps is not None else quick_or(QUICK_STEPS, None)
    if not args.no_host_time:  # the allocator's host time per step (deliverable 1 of issue 32)
        args.extra_conf = ",".join(c for c in (args.extra_conf.strip(" ,"), "time_calls:1") if c)
    if args.rounds < 1 or (args.steps is not None and args.steps < 1) or args.warmup < 0:
        p.error("--rounds and --steps must be at least 1, --warmup at least 0")
    if args.gpus < 1:
        p.error(f"--gpus must be at least 1, not {args.gpus}")
    try:
        args.specs = parse_workloads(args.workloads or ("gpt2" if args.stacks else ",".join(WORKLOADS)))
        args.variant_list = parse_variants(args.variants or ",".join(STACKS_VARIANTS if args.stacks
                                                                     else DEFAULT_VARIANTS))
        args.batches = parse_batches(args.batch)
    except ValueError as e:
        p.error(str(e))
    if args.device == "cpu" and any(not v.native or v.modifiers for v in args.variant_list):
        p.error("--device cpu runs only the `native` variant (a smoke test of the workloads' code)")
    return args


def child_args(args: argparse.Namespace, run: runner.Run) -> list[str]:
    return ["--workload", run.spec.name, "--variant", run.variant.name, "--steps", str(run.steps),
            "--warmup", str(args.warmup), "--run-batch", str(run.batch), "--seed", str(args.seed),
            "--device", args.device, "--lib", str(Path(args.lib).resolve())]


def report(records: list[dict[str, Any]], notes: list[str], args: argparse.Namespace) -> int:
    rows = table.rows(records)
    first = next((r for r in records if "error" not in r), {})
    print(f"\ntorch {first.get('torch', '?')} on {first.get('gpu', '?')}; median ms: of the timed steps; mean ms: "
          f"over all steps, warm-up included; x native: median (min-max) over rounds of the round's figure / "
          f"native's; first 10 ms: the first 10 steps together; allocs/maps, frees/unmaps, syncs: device calls "
          f"(n/a: not counted by that allocator)\n")
    print(table.text(rows))
    for line in table.targets(rows) + notes:
        print(line)
    if args.markdown:
        args.markdown.write_text(table.markdown(rows), encoding="utf-8")
        print(f"\nMarkdown table written to {args.markdown}", file=sys.stderr)
    print("\n" + json.dumps({"rows": rows, "notes": notes}))
    failed = sorted({f"{r['workload']} {r['variant']}" for r in rows if r["failed"]})
    if failed:
        print(f"\nFAIL: runs failed for {', '.join(failed)} (see above)", file=sys.stderr)
    return 1 if failed else 0


def merge_main(args: argparse.Namespace) -> int:
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    for path in args.merge:
        try:
            blob = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"bench/models.py: error: cannot read {path}: {e}", file=sys.stderr)
            return 2
        # Each file's rounds get their own numbers: ratios stay within the call that measured them.
        offset = 1 + max((r["round"] for r in records), default=-1)
        records += [dict(r, round=r["round"] + offset) for r in blob.get("records", [])]
        notes += blob.get("notes", [])
    return report(records, notes, args)


def parent_main(args: argparse.Namespace) -> int:
    runs = runner.make_plan(args.specs, args.variant_list, args.rounds, args.steps, args.batches,
                            args.exact_everywhere)
    print(runner.describe_plan(runs, args.warmup, args.extra_conf), file=sys.stderr)
    plan_lanes = lanes.split(runs, args.gpus, args.warmup) if args.gpus > 1 else [runs]
    if args.dry_run:
        cards = [str(i) for i in range(len(plan_lanes))]
        for lane, card in zip(plan_lanes, cards):
            for run in lane:
                print(f"{f'card {card}, ' if len(plan_lanes) > 1 else ''}round {run.round + 1}: {run.spec.name} "
                      f"{run.variant.name}")
        if len(plan_lanes) > 1:
            print("\n".join(lanes.describe(plan_lanes, cards, args.warmup)), file=sys.stderr)
        return 0
    reason = gpu_child.skip_reason() if args.device == "cuda" else None
    if args.device == "cpu":
        try:
            import torch  # noqa: F401
        except ImportError as e:
            reason = f"torch is not installed ({e})"
    if reason:
        print(f"SKIP: {reason}")
        return 0
    cards = lanes.visible_cards() if args.gpus > 1 else []
    if args.gpus > 1 and len(cards) < args.gpus:
        print(f"bench/models.py: error: --gpus {args.gpus}, but this host shows {len(cards)} GPU(s) "
              f"({'CUDA_VISIBLE_DEVICES' if 'CUDA_VISIBLE_DEVICES' in os.environ else 'nvidia-smi -L'})",
              file=sys.stderr)
        return 2
    lib = Path(args.lib).resolve()
    if not runner.library_ready(lib, args.variant_list, args.timeout):
        return 1
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    meta = {"command": sys.argv, "started": started, "rounds": args.rounds, "warmup": args.warmup,
            "seed": args.seed, "extra_conf": args.extra_conf, "gpus": args.gpus}

    def save(records: list[dict[str, Any]], notes: list[str]) -> None:
        if args.out:
            runner.write_json(args.out, {**meta, "records": records, "notes": notes})

    if len(plan_lanes) > 1:
        placed = lanes.describe(plan_lanes, cards, args.warmup)
        print("\n".join(placed), file=sys.stderr)
        run_lane = lanes.run_lane_with(Path(__file__), lambda run: child_args(args, run), lib, args.extra_conf,
                                       args.warmup, args.timeout, args.budget, STARTED)
        records, notes = lanes.execute(plan_lanes, cards, run_lane, save)
        return report(records, placed + notes, args)
    records, notes = runner.execute(runs, Path(__file__), lambda run: child_args(args, run), lib, args.extra_conf,
                                    args.warmup, args.timeout, args.budget, save, STARTED)
    return report(records, notes, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.merge:
        return merge_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
