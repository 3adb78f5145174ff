#!/usr/bin/env python3
"""The smallest memory cap under which each allocator completes each workload.

    python3 bench/fit.py [--workloads llama,moe,...] [--variants native,native+expandable,...]
        [--precision 0.005] [--steps N] [--parallel N] [--out fit.json] [--markdown fit.md] [--budget 510]
        [--dry-run]

For every (workload, variant) of bench/models.py: one run without a cap
(its peaks), then runs under torch.cuda.set_per_process_memory_fraction,
the cap found by bisection to `--precision` (0.5 %) of the peak allocated
(bench/suite/fit_search.py says how). Each run is a fresh process
(bench/models.py --child --cap F), the same seeded steps as the suite's;
running out of memory ends a run as "did not fit", not as a failure.
Default workloads: the transformer ones (the Llama-style decoder, the
mixture-of-experts decoder, GPT-2) and the inference one (generate() with
a growing KV cache). Default variants: native, native+expandable (PyTorch's
best option under a cap), torchalloc (install()'s default) and
caching+compact (`expandable:2`).

The table gives, per workload and variant, the peaks without a cap, the
smallest cap that completed and its ratio to the peak allocated, and the
runs it took; below it, the goal (torchalloc's cap <= 1.01 x its peak
allocated) with PyTorch's best option beside it, reported, never asserted.
A search takes about 8-9 runs. --parallel N runs N searches at once, each
in its own processes (the cap is a fraction of the device, so runs side by
side do not change each other's cap; give N so that N runs fit the device
together); --budget stops cleanly before a run that would pass it.

Without torch or a CUDA GPU it prints `SKIP: <reason>` and exits 0;
--dry-run prints the plan anywhere. Exit status: 0 every search ended with
a figure, 1 some did not (a run failed, or the budget ran out), 2 bad
arguments.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "python"), str(BENCH)]  # run from a checkout without installing

from suite import fit_search, runner  # noqa: E402
from suite.child import RESULT_TAG  # noqa: E402
from suite.variants import Variant, parse_variants  # noqa: E402
from suite.workloads import WORKLOADS, Spec, parse_batches, parse_workloads  # noqa: E402
from torchalloc import _gpu_child as gpu_child  # noqa: E402

MODELS = BENCH / "models.py"  # the child: bench/models.py --child ... --cap F
DEFAULT_VARIANTS = ("native", "native+expandable", "torchalloc", "caching+compact")
DEFAULT_WORKLOADS = ("llama", "moe", "gpt2", "llama_generate")
STARTED = time.monotonic()


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class OutOfBudget(Exception):
    pass


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="bench/fit.py", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help=f"comma-separated, of {', '.join(WORKLOADS)} (default: %(default)s)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma-separated (default: %(default)s)")
    p.add_argument("--precision", type=float, default=fit_search.PRECISION,
                   help="stop when the cap is known to this fraction of the peak allocated (default: %(default)s)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default: the workload's)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--parallel", type=int, default=1, help="searches at once (default: %(default)s)")
    runner.add_run_options(p, REPO / "build" / "libtorchalloc.so", "the start")
    p.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    args = p.parse_args(argv)
    if not 0.001 <= args.precision <= 0.5:
        p.error("--precision must be between 0.001 and 0.5")
    if (args.steps is not None and args.steps < 1) or args.warmup < 0:
        p.error("--steps must be at least 1, --warmup at least 0")
    if not 1 <= args.parallel <= 16:
        p.error("--parallel must be between 1 and 16")
    try:
        args.specs = parse_workloads(args.workloads)
        args.variant_list = parse_variants(args.variants)
        args.batches = parse_batches(args.batch)
    except ValueError as e:
        p.error(str(e))
    return args


def run_of(args: argparse.Namespace, spec: Spec, variant: Variant) -> runner.Run:
    return runner.Run(0, spec, variant, args.batches.get(spec.name, spec.batch), args.steps or spec.steps)


def describe(args: argparse.Namespace) -> str:
    lines, total = [], 0.0
    for spec in args.specs:
        first = run_of(args, spec, args.variant_list[0])
        lines.append(f"{spec.name}: {spec.title}; batch {first.batch}, {args.warmup} warm-up + {first.steps} steps "
                     "per run")
    for v in args.variant_list:
        lines.append(f"  {v.name:<20} {v.describe(args.extra_conf)}")
    runs = fit_search.estimated_probes(precision=args.precision)
    for spec in args.specs:
        for v in args.variant_list:
            total += runs * run_of(args, spec, v).estimate_s(args.warmup)
    lines.append(f"{len(args.specs) * len(args.variant_list)} searches of ~{runs} runs each (one without a cap, then "
                 f"bisection to {args.precision * 100:g} % of the peak allocated); estimated {total / 60:.1f} min on "
                 "an H100 (a guess)")
    return "\n".join(lines)


def child_args(args: argparse.Namespace, run: runner.Run, cap: float) -> list[str]:
    return ["--workload", run.spec.name, "--variant", run.variant.name, "--steps", str(run.steps), "--warmup",
            str(args.warmup), "--run-batch", str(run.batch), "--seed", str(args.seed), "--device", "cuda", "--lib",
            str(Path(args.lib).resolve()), "--cap", repr(cap)]


def search(args: argparse.Namespace, run: runner.Run, lib: Path, log_dir: str) -> fit_search.Fit:
    fit = fit_search.Fit(run.spec.name, run.variant.name)
    expected = [run.estimate_s(args.warmup)]

    def launch(cap_fraction: float) -> dict[str, Any]:
        elapsed = time.monotonic() - STARTED
        if elapsed + expected[0] > args.budget:
            raise OutOfBudget(f"the budget ran out ({elapsed:.0f} s spent, --budget {args.budget:.0f} s)")
        print(f"  [{elapsed / 60:.1f} min] {run.spec.name} {run.variant.name} "
              + (f"cap {cap_fraction * 100:.2f} % ..." if cap_fraction else "without a cap ..."),
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        result = gpu_child.run_child(MODELS, child_args(args, run, cap_fraction),
                                     runner.child_env(run, lib, args.extra_conf, log_dir), args.timeout, RESULT_TAG)
        expected[0] = time.monotonic() - t0
        return result

    try:
        first = launch(0.0)
        if "error" in first:
            fit.error = first["error"]
            print(gpu_child.tail(first.get("stderr", ""), 8), file=sys.stderr)
            return fit
        fit.peak_allocated, fit.peak_reserved = first["peak_allocated"], first["peak_reserved"]
        total = first["device_total"]

        def probe(cap: int) -> bool:
            if cap >= total:
                return True  # no cap at all: the run above completed
            result = launch(cap / total)
            if "error" in result:
                raise RuntimeError(result["error"])
            done = not result["oom"]
            print(f"    {'completed' if done else 'out of memory at step ' + str(result.get('oom_step'))} under "
                  f"{cap / fit_search.MiB:.0f} MiB", file=sys.stderr, flush=True)
            return done

        fit.cap, fit.probes = fit_search.smallest_cap(probe, fit.peak_allocated, fit.peak_reserved, args.precision)
        if fit.cap is None:
            fit.error = "did not complete even under the raised first cap"
    except (OutOfBudget, RuntimeError) as e:
        fit.error = str(e)
    return fit


def parent_main(args: argparse.Namespace) -> int:
    print(describe(args), file=sys.stderr)
    if args.dry_run:
        for spec in args.specs:
            for v in args.variant_list:
                print(f"{spec.name} {v.name}")
        return 0
    reason = gpu_child.skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        return 0
    lib = Path(args.lib).resolve()
    if not runner.library_ready(lib, args.variant_list, args.timeout):
        return 1
    import tempfile

    from concurrent.futures import ThreadPoolExecutor

    plan = [run_of(args, spec, v) for spec in args.specs for v in args.variant_list]
    done: dict[int, fit_search.Fit] = {}
    with tempfile.TemporaryDirectory(prefix="torchalloc-fit-") as log_dir, \
            ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = [pool.submit(search, args, run, lib, log_dir) for run in plan]
        for i, future in enumerate(futures):  # in the plan's order; each written as soon as it and those before are
            done[i] = future.result()
            if args.out:
                runner.write_json(args.out, {"command": sys.argv, "precision": args.precision,
                                             "fits": [done[k].as_dict() for k in sorted(done)]})
    fits = [done[k] for k in sorted(done)]
    print()
    print(fit_search.text(fits))
    for line in fit_search.targets(fits):
        print(line)
    if args.markdown:
        args.markdown.write_text(fit_search.markdown(fits), encoding="utf-8")
    print("\n" + json.dumps({"fits": [f.as_dict() for f in fits]}))
    return 1 if any(f.error for f in fits) else 0


def main(argv: list[str] | None = None) -> int:
    return parent_main(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
