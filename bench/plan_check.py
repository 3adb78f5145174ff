#!/usr/bin/env python3
"""`torchalloc plan` against real runs, beside PyTorch's MemTracker (issue 49, deliverable 3).

    python3 bench/plan_check.py [--workloads gpt2,resnet50,detection,llama_prompt] [--multiples 2,4]
        [--steps N] [--no-bisect] [--no-memtracker] [--two-logs] [--out plan_check.json] [--logs DIR] [--budget 560]
        [--lib build/libtorchalloc.so] [--dry-run]

The children (each run on the GPU, and MemTracker's) are bench/plan_check_child.py's.

Per workload (bench/suite/workloads.py's, random weights, nothing downloaded):

1. record: one run at the recorded size B under torchalloc's default with a
   log (stacks:1; the step's phases as bench/models.py's child gives them);
2. predict, on the CPU of this process: `torchalloc plan`'s model of that
   log at each multiple (2x, 4x), the default's (caching+reclaim) and
   PyTorch's allocator's (`caching`: its segments byte for byte) peak
   allocated and reserved, and how long the prediction took;
3. real: the workload run at 2B and 4B under torchalloc's default and under
   PyTorch's allocator (native), their torch.cuda.max_memory_* peaks;
4. MemTracker: torch.distributed._tools.mem_tracker.MemTracker under
   FakeTensorMode at 2B and 4B (two tracked steps, as TorchTitan's
   estimator does), its peak estimate and the seconds it took, or why it
   could not (a model whose shapes hang on the data cannot run on fake
   tensors);
5. bisect: under a cap halfway between the default's real peak reserved at
   2B and at 4B (torch.cuda.set_per_process_memory_fraction), the largest
   batch that completes, by bisection of real runs between 2B and 4B,
   against plan's bisection of its model under the same cap. The real
   search starts at plan's answer and widens its steps until the answer
   is bracketed, then bisects (the bisection's answer, in 2-3 runs when
   plan is right instead of log2 of the range).

A workload's runs go in that order of importance: the real runs, then
MemTracker's, then the bisection's, so a workload that runs out of its
time loses the least.

Workloads: gpt2 (batch 4, length 1024), resnet50 (batch 32, bf16
autocast), detection (Mask R-CNN, batch 2, image sizes and box counts
drawn per step: the prediction repeats the recorded draws), and
llama_prompt: generate() on the Llama config with sequence length as the
knob (prompt 256 tokens, batch 4, 32 new tokens): recorded at 256 and 512,
so plan measures each allocation's law from the two logs (attention and
the KV cache), predicting 2x from one log and 4x from both; its bisection
is left out (the knob is not a batch).

Prints a table (predicted against real, the error in percent, MemTracker's
estimate and time) and the bisections, then the results as one JSON line;
--out writes them after every run. Without torch or a CUDA GPU it prints
`SKIP: <reason>` and exits 0; --dry-run prints the runs anywhere. Each run
is a fresh process with a timeout. --budget counts from the script's start
(the bridge's build included): each workload gets an equal share of what
is left when it starts, a run that would end past its share is not
started, and a run is killed at the end of the budget whatever its
--timeout (the default keeps one call under ten minutes: run one or two
workloads per call, each with --out). Exit status: 0 every run gave a
figure, 1 some did not, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, NoReturn

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "python"), str(BENCH)]  # run from a checkout without installing

from plan_check_child import MEMTRACKER_TAG  # noqa: E402
from suite.child import RESULT_TAG  # noqa: E402
from suite.variants import parse_variant  # noqa: E402
from torchalloc import _gpu_child as gpu_child  # noqa: E402

DATA_DEPENDENT = "data-dependent shapes: FakeTensorMode cannot run the model"
DEFAULT_MULTIPLES = (2, 4)
RECORD = "torchalloc+stacks"  # the recording run: install()'s default, logged with stacks
DEFAULT, NATIVE = "torchalloc", "native"


@dataclass(frozen=True)
class Check:
    """One workload as this script checks it: the knob, its recorded value, the steps a run makes."""

    name: str
    workload: str  # its bench/suite/workloads.py name (llama_prompt: defined here, on the Llama config)
    knob: str  # what the multiple multiplies: "batch" or "prompt length"
    base: int
    steps: int
    bisect: bool  # search the largest batch under a cap
    two_logs: bool = False  # record at base and 2 x base: plan measures each allocation's law
    startup_s: float = 12.0  # a guess per run, for the budget and the plan (measured runs replace it)


CHECKS: dict[str, Check] = {c.name: c for c in (
    Check("gpt2", "gpt2", "batch", 4, 3, True),
    Check("resnet50", "resnet50", "batch", 32, 3, True),
    Check("detection", "detection", "batch", 2, 6, True),
    Check("llama_prompt", "llama_prompt", "prompt length", 256, 2, False, two_logs=True),
)}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="bench/plan_check.py", description=(__doc__ or "").split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(CHECKS), help="comma-separated, of %(default)s")
    p.add_argument("--multiples", default=",".join(map(str, DEFAULT_MULTIPLES)),
                   help="the sizes to predict and run, as multiples of the recorded one (default: %(default)s)")
    p.add_argument("--steps", type=int, default=None, help="steps per run after one warm-up (default: per workload)")
    p.add_argument("--no-bisect", action="store_true", help="skip the search for the largest batch under a cap")
    p.add_argument("--no-memtracker", action="store_true", help="skip MemTracker under FakeTensorMode")
    p.add_argument("--two-logs", action="store_true",
                   help="record every workload at its base and twice it, and predict 4x from both as well")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lib", default=os.environ.get("TORCHALLOC_LIB", str(REPO / "build" / "libtorchalloc.so")),
                   help="libtorchalloc.so (default: $TORCHALLOC_LIB, else build/libtorchalloc.so)")
    p.add_argument("--timeout", type=float, default=240, help="seconds allowed per run (default: %(default)s)")
    p.add_argument("--budget", type=float, default=560,
                   help="seconds from the script's start: each workload gets an equal share of what is left when "
                   "it starts, no run is started that would end past its share, and a run still going at the end "
                   "is killed (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here, after every run")
    p.add_argument("--logs", type=Path, default=None, help="keep the recorded logs in this folder")
    p.add_argument("--dry-run", action="store_true", help="print the runs; run nothing")
    # The children's own arguments: suite/child.py's (bench/models.py --child ...), and --memtracker.
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--memtracker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", default="", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    p.add_argument("--run-batch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--cap", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return args
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        p.error(f"unknown workload(s) {', '.join(unknown) or '(none given)'}: known are {', '.join(CHECKS)}")
    args.checks = [replace(CHECKS[n], two_logs=True) if args.two_logs else CHECKS[n] for n in dict.fromkeys(names)]
    try:
        args.multiple_list = sorted({int(m) for m in args.multiples.split(",") if m.strip()})
    except ValueError:
        p.error(f"--multiples {args.multiples!r}: whole multiples such as 2,4")
    if not args.multiple_list or args.multiple_list[0] < 2:
        p.error(f"--multiples {args.multiples!r}: whole multiples of at least 2")
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be at least 1")
    if args.out is not None and not args.out.parent.is_dir():
        p.error(f"--out {args.out}: no folder {args.out.parent}")
    if args.budget <= 0 or args.timeout <= 0:
        p.error("--budget and --timeout must be positive")
    return args


# ---------------------------------------------------------------------------
# The runs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One child process: a workload at a knob value under a variant (a cap, or MemTracker instead)."""

    check: Check
    what: str  # "record", "real", "memtracker", "bisect"
    variant: str
    knob: int
    cap: int = 0  # bytes (bisect)

    def label(self) -> str:
        cap = f" under {self.cap / 2**30:.2f} GiB" if self.cap else ""
        return f"{self.check.name} {self.what} {self.variant} {self.check.knob} {self.knob}{cap}"


def plan_runs(checks: list[Check], multiples: list[int], memtracker: bool) -> list[Run]:
    """The runs known before any has run (the bisection's depend on the real runs' peaks)."""
    runs = []
    for c in checks:
        runs.append(Run(c, "record", RECORD, c.base))
        if c.two_logs:
            runs.append(Run(c, "record", RECORD, 2 * c.base))
        for m in multiples:
            runs += [Run(c, "real", DEFAULT, m * c.base), Run(c, "real", NATIVE, m * c.base)]
        if memtracker:
            runs += [Run(c, "memtracker", NATIVE, m * c.base) for m in multiples]
    return runs


def bisect_largest(lo: int, hi: int, fits: Callable[[int], bool | None], start: int | None = None
                   ) -> tuple[int | None, list[tuple[int, bool]]]:
    """The largest value in [lo, hi] that fits (lo is tried first: None when it does not fit); `fits` may answer
    None (the run failed): the search stops there, with what it had. Without `start`, bisection (hi tried next);
    with it, the search goes out from `start` (clamped into the range) by steps that double until the answer is
    bracketed, then bisects: the bisection's answer where fitting is monotone, in two or three probes when
    `start` is it. Returns it and the probes in order."""
    probes: list[tuple[int, bool]] = []

    def probe(n: int) -> bool | None:
        got = fits(n)
        if got is not None:
            probes.append((n, got))
        return got

    if not probe(lo):
        return None, probes
    good, bad = lo, hi + 1
    n = hi if start is None else min(max(start, lo), hi)
    gap = 1
    while good < n < bad:  # out from n until good and bad are neighbours or bracket the answer
        got = probe(n)
        if got is None:
            return good, probes
        if got:
            good, n = n, min(n + gap, bad - 1)
        else:
            bad, n = n, max(n - gap, good + 1)
        gap *= 2
        if start is None:
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        got = probe(mid)
        if got is None:
            break
        good, bad = (mid, bad) if got else (good, mid)
    return good, probes


@dataclass
class Results:
    """Everything measured so far (written to --out after every run)."""

    machine: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    bisections: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "runs": self.runs, "predictions": self.predictions,
                "bisections": self.bisections, "notes": self.notes}

    def run(self, check: str, what: str, variant: str, knob: int) -> dict[str, Any] | None:
        return next((r for r in self.runs if (r["check"], r["what"], r["variant"], r["knob"]) ==
                     (check, what, variant, knob) and "error" not in r), None)


# ---------------------------------------------------------------------------
# The prediction (this process, no GPU)
# ---------------------------------------------------------------------------


def predict(check: Check, logs: list[Path], multiples: list[int], capacity: int | None) -> list[dict[str, Any]]:
    """plan's peaks at each multiple under the default and PyTorch's allocator (caching), from the one log (and,
    for a check with two logs, from both at the multiples past the second), each with the seconds it took."""
    from torchalloc.plan import fit_pair, make_plan, one_run, read_run
    from torchalloc.replay.engine import INSTALL_DEFAULT

    t0 = time.perf_counter()
    first = read_run(logs[0])
    read_s = time.perf_counter() - t0
    models = [("one log", one_run(first))]
    if len(logs) > 1:
        t1 = time.perf_counter()
        models.append(("two logs", fit_pair(first, read_run(logs[1]), 2.0)))
        read_s += time.perf_counter() - t1
    out = []
    for source, model in models:
        for m in multiples:
            if source == "two logs" and m <= 2:
                continue  # the second log is the run at 2x itself
            t2 = time.perf_counter()
            plan = make_plan(model, float(m), capacity, policies=[INSTALL_DEFAULT, "caching"], search=False)
            seconds = time.perf_counter() - t2 + read_s
            for p in plan.policies:  # too large (an allocation past any device at m): no figure, said so
                out.append({"check": check.name, "multiple": m, "from": source, "policy": p.policy,
                            "peak_allocated": None if p.too_large else p.peak_allocated,
                            "peak_reserved": None if p.too_large else p.peak_reserved,
                            "high_peak_reserved": None if p.too_large else p.high_peak_reserved,
                            "too_large": p.too_large, "seconds": round(seconds, 3)})
    return out


def predicted_largest(log: Path, base: int, cap: int) -> int | None:
    """plan's largest batch under `cap` (the default, whole batches)."""
    from torchalloc.plan import make_plan, one_run, read_run
    from torchalloc.replay.engine import INSTALL_DEFAULT

    plan = make_plan(one_run(read_run(log)), 1.0, cap, recorded=base, policies=[INSTALL_DEFAULT])
    d = plan.default
    return plan.batch_of(d.largest) if d is not None else None


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


def error_pct(predicted: float | None, real: float | None) -> float | None:
    if predicted is None or not real:
        return None
    return 100.0 * (predicted - real) / real


def rows(results: Results, checks: list[Check], multiples: list[int]) -> list[dict[str, Any]]:
    """One row per (workload, multiple, allocator): predicted against real, MemTracker beside."""
    from torchalloc.replay.engine import INSTALL_DEFAULT

    out = []
    for c in checks:
        for m in multiples:
            knob = m * c.base
            tracker = results.run(c.name, "memtracker", NATIVE, knob)
            for variant, policy in ((DEFAULT, INSTALL_DEFAULT), (NATIVE, "caching")):
                real = results.run(c.name, "real", variant, knob) or {}
                for p in (x for x in results.predictions if (x["check"], x["multiple"], x["policy"]) ==
                          (c.name, m, policy)):
                    row = {"workload": c.name, "knob": c.knob, "at": knob, "multiple": m, "from": p["from"],
                           "allocator": "torchalloc (default)" if variant == DEFAULT else "PyTorch's (native)",
                           "predicted_allocated": p["peak_allocated"], "real_allocated": real.get("peak_allocated"),
                           "predicted_reserved": p["peak_reserved"], "real_reserved": real.get("peak_reserved"),
                           "plan_s": p["seconds"],
                           "memtracker_allocated": (tracker or {}).get("estimate"),
                           "memtracker_s": (tracker or {}).get("seconds"),
                           "memtracker_error": _memtracker_error(results, c.name, knob)}
                    row["error_allocated_pct"] = error_pct(row["predicted_allocated"], row["real_allocated"])
                    row["error_reserved_pct"] = error_pct(row["predicted_reserved"], row["real_reserved"])
                    row["memtracker_error_pct"] = error_pct(row["memtracker_allocated"], row["real_allocated"])
                    out.append(row)
    return out


def _memtracker_error(results: Results, check: str, knob: int) -> str | None:
    """Why MemTracker gave no estimate: "data-dependent" when the model's shapes depend on values, which fake
    tensors do not hold (detection's boxes, generate()'s tokens), else the child's error."""
    failed = next((r for r in results.runs if (r["check"], r["what"], r["knob"]) == (check, "memtracker", knob)
                   and "error" in r), None)
    if not failed:
        return None
    return DATA_DEPENDENT if "DataDependentOutputException" in failed.get("stderr", "") else failed["error"]


def _memtracker_cell(row: dict[str, Any]) -> str:
    error = row["memtracker_error"]
    return _mib(row["memtracker_allocated"]) if not error else "data-dep." if error == DATA_DEPENDENT else "failed"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def table(table_rows: list[dict[str, Any]], bisections: list[dict[str, Any]]) -> str:
    """The rows as text (MiB), then the bisections."""
    head = ["workload", "at", "from", "allocator", "alloc pred", "alloc real", "err", "res pred", "res real", "err",
            "MemTracker", "err", "MT s", "plan s"]
    body = [[r["workload"], f"{r['knob']} {r['at']} ({r['multiple']}x)", r["from"], r["allocator"],
             _mib(r["predicted_allocated"]), _mib(r["real_allocated"]), _pct(r["error_allocated_pct"]),
             _mib(r["predicted_reserved"]), _mib(r["real_reserved"]), _pct(r["error_reserved_pct"]),
             _memtracker_cell(r), _pct(r["memtracker_error_pct"]),
             "-" if r["memtracker_s"] is None else f"{r['memtracker_s']:.1f}", f"{r['plan_s']:.1f}"]
            for r in table_rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) if k < 4 else str(x).rjust(w) for k, (x, w) in enumerate(zip(line, widths)))
             for line in [head, ["-" * w for w in widths], *body]]
    lines.append("(MiB; err: (predicted - real) / real; MemTracker: its peak allocated under FakeTensorMode "
                 "(data-dep.: none, the model's shapes depend on values fake tensors do not hold), MT s its seconds; "
                 "plan s: reading the log and replaying both allocators)")
    for b in bisections:
        said = (f"{b['workload']}: under {b['cap'] / 2**30:.2f} GiB the largest batch by bisection of real runs "
                f"{b['real']}, predicted {b['predicted']}")
        if b["real"] is not None and b["predicted"] is not None:
            said += f" ({'within one step' if abs(b['real'] - b['predicted']) <= 1 else 'more than one step apart'})"
        lines.append(said + f"; probes {b['probes']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------


def child_env(variant: str, lib: Path, log_dir: str) -> dict[str, str]:
    """A run's environment: the variant's allocator settings and nothing inherited that would change them."""
    from suite.runner import Run as SuiteRun
    from suite.runner import child_env as suite_env
    from suite.workloads import WORKLOADS

    # suite's child_env reads only the run's variant; any workload stands for llama_prompt's
    return suite_env(SuiteRun(0, WORKLOADS["gpt2"], parse_variant(variant), 1, 1), lib, "", log_dir)


class Parent:
    def __init__(self, args: argparse.Namespace, started: float | None = None) -> None:
        self.args = args
        self.results = Results()
        self.started = time.monotonic() if started is None else started  # what --budget counts from
        self.deadline = self.started + args.budget  # the current workload's share ends here (check())
        self.walls: dict[str, float] = {}
        self.failed = False
        self.log_dir = tempfile.mkdtemp(prefix="torchalloc-plan-check-")
        self.kept = args.logs

    def save(self) -> None:
        if self.args.out:
            tmp = self.args.out.with_name(self.args.out.name + ".tmp")
            tmp.write_text(json.dumps(self.results.as_dict(), indent=1) + "\n", encoding="utf-8")
            tmp.replace(self.args.out)

    def child(self, run: Run, steps: int) -> dict[str, Any] | None:
        """Run one child; its record (also kept in the results), None when the budget stops it: a run that would
        end past the workload's share is not started, and one still running at the end of the budget is killed."""
        now = time.monotonic()
        elapsed = now - self.started
        expected = self.walls.get(run.check.name, run.check.startup_s + 10)
        if now + expected > self.deadline:
            note = (f"stopped before {run.label()}: {elapsed:.0f} s spent + ~{expected:.0f} s would pass "
                    f"{run.check.name}'s share of --budget")
            if note not in self.results.notes:
                self.results.notes.append(note)
                print(note, file=sys.stderr)
            return None
        timeout = min(self.args.timeout, self.started + self.args.budget - now)
        print(f"[{elapsed / 60:.1f} min] {run.label()} ...", file=sys.stderr, flush=True)
        lib = Path(self.args.lib).resolve()
        env = child_env(run.variant, lib, self.log_dir)
        cap_fraction = 0.0
        if run.cap:
            total = self.results.machine.get("device_total")
            cap_fraction = run.cap / total if total else 0.0
        argv = ["--workload", run.check.workload, "--variant", run.variant, "--steps", str(steps), "--warmup", "1",
                "--run-batch", str(run.knob), "--seed", str(self.args.seed), "--lib", str(lib),
                "--cap", f"{cap_fraction:.6f}"]
        t0 = time.monotonic()
        if run.what == "memtracker":
            result = gpu_child.run_child(Path(__file__), ["--memtracker", *argv], env, timeout, MEMTRACKER_TAG)
        else:
            result = gpu_child.run_child(Path(__file__), argv, env, timeout, RESULT_TAG)
        wall = time.monotonic() - t0
        self.walls[run.check.name] = max(wall, self.walls.get(run.check.name, 0.0))
        record = {"check": run.check.name, "what": run.what, "variant": run.variant, "knob": run.knob,
                  "cap": run.cap or None, "wall_s": round(wall, 1), **result}
        if "error" in record:
            record["stderr"] = gpu_child.tail(record.get("stderr", ""), 15)
            record.pop("stdout", None)
            print(f"    failed: {record['error']}\n{gpu_child.tail(record['stderr'], 6)}", file=sys.stderr)
            if run.what != "memtracker":  # MemTracker failing on a model is a finding, not a failure
                self.failed = True
        else:
            for key in ("gpu", "torch", "device_total"):
                if record.get(key) is not None:
                    self.results.machine.setdefault(key, record[key])
            print(f"    {wall:.1f} s: allocated {_mib(record.get('peak_allocated') or record.get('estimate'))} MiB, "
                  f"reserved {_mib(record.get('peak_reserved'))} MiB{', OOM' if record.get('oom') else ''}",
                  file=sys.stderr)
        self.results.runs.append(record)
        self.save()
        return record

    def recorded_log(self, check: Check, knob: int) -> Path | None:
        """The log the last recording run wrote, moved out of the shared folder (kept under --logs)."""
        logs = sorted(Path(self.log_dir).glob("*.talog"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return None
        folder = self.kept or Path(self.log_dir) / "kept"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{check.name}_{knob}.talog"
        shutil.move(str(logs[-1]), target)
        return target

    def check(self, c: Check, multiples: list[int], share: float) -> None:
        """One workload, within `share` seconds from now (module docstring: the order of its runs)."""
        self.deadline = min(time.monotonic() + share, self.started + self.args.budget)
        steps = self.args.steps or c.steps
        logs = []
        for knob in ([c.base, 2 * c.base] if c.two_logs else [c.base]):
            record = self.child(Run(c, "record", RECORD, knob), steps)
            log = self.recorded_log(c, knob) if record and "error" not in record else None
            if log is None:
                self.results.notes.append(f"{c.name}: no log recorded at {c.knob} {knob}: nothing to predict from")
                return
            logs.append(log)
        os.environ["TORCHALLOC_LIB"] = str(Path(self.args.lib).resolve())  # plan replays with this library
        try:
            self.results.predictions += predict(c, logs, multiples, self.results.machine.get("device_total"))
        except Exception as e:  # noqa: BLE001 -- a log plan refuses is a finding; the other workloads go on
            self.failed = True
            self.results.notes.append(f"{c.name}: plan could not predict: {type(e).__name__}: {e}")
            print(self.results.notes[-1], file=sys.stderr)
        self.save()
        for m in multiples:
            for variant in (DEFAULT, NATIVE):
                self.child(Run(c, "real", variant, m * c.base), steps)
        if not self.args.no_memtracker:
            for m in multiples:
                self.child(Run(c, "memtracker", NATIVE, m * c.base), steps)
        if c.bisect and not self.args.no_bisect:
            self.bisect(c, logs[0], steps)

    def bisect(self, c: Check, log: Path, steps: int) -> None:
        lo_run, hi_run = self.results.run(c.name, "real", DEFAULT, 2 * c.base), \
            self.results.run(c.name, "real", DEFAULT, 4 * c.base)
        if not lo_run or not hi_run or not self.results.machine.get("device_total"):
            self.results.notes.append(f"{c.name}: no bisection (the real runs at 2x and 4x under the default are "
                                      "needed for its cap)")
            return
        cap = (lo_run["peak_reserved"] + hi_run["peak_reserved"]) // 2
        try:
            predicted = predicted_largest(log, c.base, cap)
        except Exception as e:  # noqa: BLE001 -- as in check(): said, and the real bisection still runs
            self.failed = True
            predicted = None
            self.results.notes.append(f"{c.name}: plan could not search the largest batch: {type(e).__name__}: {e}")

        def fits(knob: int) -> bool | None:
            record = self.child(Run(c, "bisect", DEFAULT, knob, cap), steps)
            if record is None or "error" in record:
                return None
            return not record.get("oom")

        real, probes = bisect_largest(2 * c.base, 4 * c.base, fits, start=predicted)
        self.results.bisections.append({"workload": c.name, "cap": cap, "real": real, "predicted": predicted,
                                        "probes": probes})
        self.save()

    def main(self) -> int:
        try:
            for k, c in enumerate(self.args.checks):
                left = self.started + self.args.budget - time.monotonic()
                self.check(c, self.args.multiple_list, left / (len(self.args.checks) - k))
        finally:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        table_rows = rows(self.results, self.args.checks, self.args.multiple_list)
        m = self.results.machine
        print(f"\ntorch {m.get('torch', '?')} on {m.get('gpu', '?')} ({_mib(m.get('device_total'))} MiB), "
              f"{time.strftime('%Y-%m-%d')}\n")
        print(table(table_rows, self.results.bisections))
        for note in self.results.notes:
            print(note)
        print("\n" + json.dumps({**self.results.as_dict(), "rows": table_rows}))
        return 1 if self.failed else 0


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # --budget counts from here: the bridge's build is inside it
    args = parse_args(argv)
    if args.child:
        from plan_check_child import child_main, memtracker_main

        return memtracker_main(args) if args.memtracker else child_main(args)
    runs = plan_runs(args.checks, args.multiple_list, not args.no_memtracker)
    for c in args.checks:
        print(f"{c.name}: {c.knob} {c.base} recorded, predicted and run at "
              f"{', '.join(f'{m}x' for m in args.multiple_list)}, {args.steps or c.steps} steps a run"
              + ("; two logs (the law measured)" if c.two_logs else "")
              + ("; the largest batch under a cap bisected" if c.bisect and not args.no_bisect else ""),
              file=sys.stderr)
    if args.dry_run:
        for run in runs:
            print(run.label())
        return 0
    reason = gpu_child.skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        return 0
    if gpu_child.library_missing(Path(args.lib)):
        return 1
    from suite.runner import prepare_bridge

    problem = prepare_bridge(Path(args.lib), args.timeout)
    if problem:
        print(f"warning: the bridge is not ready, torchalloc runs will fail: {problem}", file=sys.stderr)
    return Parent(args, started).main()


if __name__ == "__main__":
    sys.exit(main())
