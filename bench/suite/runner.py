"""The parent: which runs, in what order, within what time, and what came back.

Runs are interleaved: round 1 runs every workload's variants one after the
other, then round 2 does the same with the order turned by one, and so on
(A B C, B C A, C A B), so that a drift of the machine's speed, and the place
in a round, hit every variant alike; ratios to native are taken within a
round. Each run is a fresh process (bench/models.py --child) with
a timeout; a run that crashes, hangs or prints no result is recorded as
failed and the suite goes on. Before each run the suite checks that it
still fits in the time budget (from the estimate, or from the same run's
wall time in an earlier round) and stops cleanly when it would not, so a
caller with a hard wall-clock limit gets the rounds that fit. Results are
written to --out after every run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

from torchalloc import _gpu_child as gpu_child
from torchalloc import _lib

from .child import CPUS_ENV, RESULT_TAG
from .variants import EXACT_WORKLOADS, Variant
from .workloads import Spec

# Step time relative to the estimate of a plain run (rough: only for planning).
SLOWER = {"exact": 1.5, "stacks": 1.2, "history": 1.3, "log": 1.05}


@dataclass(frozen=True)
class Run:
    round: int  # 0-based
    spec: Spec
    variant: Variant
    batch: int
    steps: int
    place: int = 0  # 0-based: where in its workload's round it runs (make_plan turns the order every round)

    @property
    def key(self) -> tuple[str, str]:
        return self.spec.name, self.variant.name

    def estimate_s(self, warmup: int) -> float:
        factor = max([SLOWER.get(self.variant.policy, 1.0)] + [SLOWER.get(m, 1.0) for m in self.variant.modifiers])
        return self.spec.startup_s + (warmup + self.steps) * self.spec.step_ms * factor / 1e3


def add_run_options(p: argparse.ArgumentParser, default_lib: Path, budget_of: str) -> None:
    """The options bench/models.py and bench/fit.py share: how each run is made, where the results go.
    `budget_of`: what --budget counts from ("the suite started")."""
    p.add_argument("--batch", action="append", default=[], metavar="NAME=N", help="a workload's batch size")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--extra-conf", default="", help="appended to every torchalloc variant's TORCHALLOC_CONF")
    p.add_argument("--lib", default=os.environ.get("TORCHALLOC_LIB", str(default_lib)),
                   help=f"libtorchalloc.so (default: $TORCHALLOC_LIB, else {default_lib})")
    p.add_argument("--timeout", type=float, default=240, help="seconds allowed per run (default: %(default)s)")
    p.add_argument("--budget", type=float, default=510,
                   help=f"start no run that would end more than this many seconds after {budget_of} "
                   "(default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--markdown", type=Path, default=None, help="write the Markdown table here")


def make_plan(specs: list[Spec], variants: list[Variant], rounds: int, steps: int | None,
              batches: dict[str, int], exact_everywhere: bool) -> list[Run]:
    """Rounds outermost, then workloads, then variants: in the order given in the first round, and in each
    later round the order of the one before turned by one (A B C, B C A, C A B), so that over as many rounds
    as variants each variant runs once in every place of a round. Why: a variant that always ran first after
    another workload's last run (or always last, after its own workload had warmed the card and the host)
    carried that place's effect in every ratio. Unless `exact_everywhere`, `exact` variants run only on
    EXACT_WORKLOADS."""
    runs = []
    for rnd in range(rounds):
        turn = rnd % len(variants) if variants else 0
        for spec in specs:
            place = 0
            for v in variants[turn:] + variants[:turn]:
                if v.policy == "exact" and not exact_everywhere and spec.name not in EXACT_WORKLOADS:
                    continue
                runs.append(Run(rnd, spec, v, batches.get(spec.name, spec.batch), steps or spec.steps, place))
                place += 1
    return runs


def describe_plan(runs: list[Run], warmup: int, extra_conf: str) -> str:
    lines = []
    for spec in dict.fromkeys(r.spec for r in runs):
        first = next(r for r in runs if r.spec == spec)
        lines.append(f"{spec.name}: {spec.title}; batch {first.batch}, {warmup} warm-up + {first.steps} timed steps")
    for v in dict.fromkeys(r.variant for r in runs):
        lines.append(f"  {v.name:<24} {v.describe(extra_conf)}")
    rounds = max(r.round for r in runs) + 1 if runs else 0
    total = sum(r.estimate_s(warmup) for r in runs)
    lines.append(f"{len(runs)} runs in {rounds} interleaved round(s); estimated {total / 60:.1f} min on an H100 "
                 f"(a guess until measured: each run's wall time is in the results)")
    return "\n".join(lines)


def child_env(run: Run, lib: Path, extra_conf: str, log_dir: str, card: str | None = None,
              cpus: list[int] | None = None) -> dict[str, str]:
    """The variant's allocator settings, and nothing inherited that would change them; `card`: the one GPU
    it sees (CUDA_VISIBLE_DEVICES), None to inherit the parent's; `cpus`: the CPUs it keeps to, its thread
    pools that wide (None: the parent's)."""
    env = dict(os.environ)
    if card is not None:
        env["CUDA_VISIBLE_DEVICES"] = card
    if cpus:
        env[CPUS_ENV] = ",".join(map(str, cpus))
        env["OMP_NUM_THREADS"] = str(len(cpus))
    env.pop("TORCHALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)  # newer torch's name for the same setting
    env.setdefault("HF_HUB_OFFLINE", "1")  # random weights: nothing to fetch, and a GPU box may have no network
    if run.variant.native:
        if run.variant.native_conf():
            env["PYTORCH_CUDA_ALLOC_CONF"] = run.variant.native_conf()
    else:
        env["TORCHALLOC_CONF"] = run.variant.torchalloc_conf(extra_conf, log_dir)
        env[_lib.ENV_LIB] = str(lib)
    return env


def library_ready(lib: Path, variants: list[Variant], timeout: float) -> bool:
    """Before the runs: the library at `lib` (False, said on stderr, when missing) and the C++ bridge
    (a warning when it cannot be built: the torchalloc runs will then fail). Native variants need neither."""
    if all(v.native for v in variants):
        return True
    if gpu_child.library_missing(lib):
        return False
    problem = prepare_bridge(lib, timeout)
    if problem:
        print(f"warning: the bridge is not ready, torchalloc runs will fail: {problem}", file=sys.stderr)
    return True


def prepare_bridge(lib: Path, timeout: float) -> str | None:
    """Build (or find) the C++ bridge once, before the timed runs, in a process of its own so that
    this parent never imports torch; None when ready, else why not."""
    code = ("from torchalloc import bridge; b = bridge.find_or_build(); "
            "print('bridge:', b.path, '(built in %.1f s)' % b.build_seconds if b.built_now else '(already built)')")
    env = dict(os.environ, **{_lib.ENV_LIB: str(lib)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2] / "python"),
                                                    env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return f"building the bridge took more than {timeout:.0f} s"
    if done.returncode != 0:
        return gpu_child.tail(done.stderr, 5)
    print(done.stdout.strip(), file=sys.stderr)
    return None


def _log_bytes(log_dir: str) -> int:
    """Size of the logs the last run wrote; they are deleted (a GPT-2 log with stacks is large)."""
    total = 0
    for entry in Path(log_dir).iterdir():
        if entry.is_file():
            total += entry.stat().st_size
            entry.unlink()
        else:
            shutil.rmtree(entry, ignore_errors=True)
    return total


def _short(record: dict[str, Any]) -> str:
    if "error" in record:
        return f"FAILED: {record['error']}"
    median = statistics.median(record["step_ms"]) if record["step_ms"] else float("nan")
    text = f"median {median:.1f} ms"
    alloc, res = record.get("peak_allocated"), record.get("peak_reserved")
    if alloc and res:
        text += f", peak {alloc / 2**20:.0f} allocated / {res / 2**20:.0f} reserved MiB ({res / alloc:.3f})"
    return text + f", loss {record.get('first_loss', float('nan')):.4f} -> {record.get('last_loss', float('nan')):.4f}"


def execute(runs: list[Run], script: Path, child_args: Callable[[Run], list[str]], lib: Path, extra_conf: str,
            warmup: int, timeout: float, budget_s: float, save: Callable[[list[dict[str, Any]], list[str]], None],
            started: float | None = None, card: str | None = None, cpus: list[int] | None = None
            ) -> tuple[list[dict[str, Any]], list[str]]:
    """Run `runs` in order; (one record per run started, notes such as the budget stop).
    The budget counts from `started` (time.monotonic(); default: now). `card`: the GPU every run sees
    (recorded in each record and named in the progress lines); None: the parent's. `cpus`: the CPUs every
    run keeps to (recorded); None: the parent's."""
    where = f"card {card}: " if card is not None else ""
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    walls: dict[tuple[str, str], float] = {}
    log_dir = tempfile.mkdtemp(prefix="torchalloc-bench-")
    start = time.monotonic() if started is None else started
    try:
        for i, run in enumerate(runs):
            elapsed = time.monotonic() - start
            expected = walls.get(run.key, run.estimate_s(warmup))
            if elapsed + expected > budget_s:
                notes.append(f"{where}stopped before run {i + 1}/{len(runs)} (round {run.round + 1}, {run.spec.name}, "
                             f"{run.variant.name}): {elapsed:.0f} s spent + ~{expected:.0f} s would pass the "
                             f"{budget_s:.0f} s budget (--budget)")
                print(notes[-1], file=sys.stderr)
                break
            remaining = sum(walls.get(r.key, r.estimate_s(warmup)) for r in runs[i:])
            print(f"{where}[{i + 1}/{len(runs)} {elapsed / 60:.1f} min, ~{remaining / 60:.1f} min left] "
                  f"round {run.round + 1} {run.spec.name} {run.variant.name} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            result = gpu_child.run_child(script, child_args(run), child_env(run, lib, extra_conf, log_dir, card, cpus),
                                         timeout, RESULT_TAG)
            wall = time.monotonic() - t0
            walls[run.key] = wall
            record = {"round": run.round, "workload": run.spec.name, "variant": run.variant.name,
                      "place": run.place, "batch": run.batch, "steps": run.steps, "wall_s": round(wall, 2),
                      **result}
            if card is not None:
                record["card"] = card
            if cpus:
                record["cpus"] = f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else \
                    ",".join(map(str, cpus))
            if run.variant.logs:
                record["log_bytes"] = _log_bytes(log_dir)
            if "error" in record:  # keep the end of what it said, not all of it
                record["stderr"] = gpu_child.tail(record.get("stderr", ""), 20)
                record.pop("stdout", None)
            records.append(record)
            print(f"    {where}{wall:.1f} s: {_short(record)}", file=sys.stderr, flush=True)
            if "error" in record:
                print(gpu_child.tail(record["stderr"], 8), file=sys.stderr)
            save(records, notes)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    save(records, notes)
    return records, notes


def write_json(path: Path, blob: dict[str, Any]) -> None:
    """Atomically, so a run killed mid-write leaves the previous complete file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(blob, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
