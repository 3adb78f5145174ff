#!/usr/bin/env python3
"""A short script's wall time from launch to exit, under PyTorch's allocator and under torchalloc.install(),
cut into the phases where each process spends it: interleaved rounds in turned orders (native first in odd
rounds, install() first in even ones), every process timed whole by this parent.

    python3 bench/start_to_exit.py [--rounds 10] [--json FILE]

Phases (wall-clock marks the script prints, bench/short_train.py --marks): `interpreter` launch to the
script's first line; `torch` import torch; `install` torchalloc imported and installed (nothing under
native); `model` the model made on the CPU; `to_gpu` CUDA started, the model, its optimizer and its input on
the GPU; `steps` its 60 training steps; `exit` the last mark to the process's end (the interpreter's
teardown, torchalloc's, the CUDA context's). The goal it reports on: start to exit under install() at most
native's + 2 %, as the median over rounds of each round's ratio. Beside it, what install() adds in the
phases an allocator takes part in (install, to_gpu, steps, exit), as a share of native's start to exit:
the others (the interpreter, import torch, the model made on the CPU) vary by seconds between processes
and would hide it.
Without torch or a CUDA GPU it says SKIP and exits 2.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from suite.table import against  # bench/ is the script's directory, first on sys.path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "short_train.py"
VARIANTS = ("native", "install")
PHASES = ("interpreter", "torch", "install", "model", "to_gpu", "steps", "exit")
MARKS = ("started", "torch", "installed", "made", "built", "trained")
ALLOCATOR_PHASES = ("install", "to_gpu", "steps", "exit")  # where an allocator runs: the rest is the same code
GOAL = 1.02  # install()'s start to exit at most native's + 2 %


def phases_of(marks: dict[str, float], launched: float, ended: float) -> dict[str, float]:
    """Seconds in each phase and in all (`total`), from the script's marks and the parent's launch and end."""
    points = [launched, *(marks[k] for k in MARKS), ended]
    out = {name: points[i + 1] - points[i] for i, name in enumerate(PHASES)}
    out["total"] = ended - launched
    return out


def marks_in(stdout: str) -> dict[str, float] | None:
    """The marks of the script's last JSON line, or None when it printed none (it failed before its end)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                marks = json.loads(line).get("marks")
            except ValueError:
                return None
            if isinstance(marks, dict) and all(isinstance(marks.get(k), (int, float)) for k in MARKS):
                return {k: float(marks[k]) for k in MARKS}
            return None
    return None


def run_once(variant: str, timeout: float) -> dict[str, Any]:
    """One process of `variant`, timed whole: its phases, or why it failed."""
    cmd = [sys.executable, str(SCRIPT), "--marks"] + (["--install"] if variant == "install" else [])
    launched = time.time()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "failed": f"still running after {timeout:.0f} s: killed"}
    ended = time.time()
    marks = marks_in(done.stdout)
    if done.returncode != 0 or marks is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"variant": variant, "failed": f"exit {done.returncode}: " + " | ".join(tail), "rc": done.returncode}
    return {"variant": variant, "phases": phases_of(marks, launched, ended)}


def order_of(round_index: int) -> tuple[str, ...]:
    """Round 0 native first, round 1 install() first, and so on: neither always pays for going first."""
    return VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median, least and most."""
    return statistics.median(values), min(values), max(values)


def summarize(rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant and phase the median (min, max) seconds over the rounds where it ran, and install()'s
    start to exit over native's in each round where both ran."""
    ok = [{r["variant"]: r["phases"] for r in rnd if "phases" in r} for rnd in rounds]
    seconds = {v: {p: spread([rnd[v][p] for rnd in ok if v in rnd]) for p in (*PHASES, "total")}
               for v in VARIANTS if any(v in rnd for rnd in ok)}
    both = [rnd for rnd in ok if len(rnd) == 2]
    ratios = [rnd["install"]["total"] / rnd["native"]["total"] for rnd in both]
    # install()'s extra seconds in the phases an allocator takes part in, over native's start to exit
    shares = [sum(rnd["install"][p] - rnd["native"][p] for p in ALLOCATOR_PHASES) / rnd["native"]["total"]
              for rnd in both]
    return {"seconds": seconds, "ratios": ratios, "ratio": spread(ratios) if ratios else None,
            "allocator_shares": shares, "allocator_share": spread(shares) if shares else None}


def verdict(ratio: tuple[float, float, float] | None) -> str:
    if ratio is None:
        return "no round where both ran: no verdict"
    median, lo, hi = ratio
    said = f"start to exit under install() {median:.3f}x native's, median of the rounds' ratios ({lo:.3f}-{hi:.3f})"
    return f"{said}: {against(median, lo, GOAL)} (target <= {GOAL:.2f}x)"


def allocator_line(share: tuple[float, float, float] | None) -> str:
    if share is None:
        return ""
    median, lo, hi = share
    return (f"install()'s extra time in the phases an allocator takes part in ({', '.join(ALLOCATOR_PHASES)}): "
            f"{100 * median:+.1f} % of native's start to exit, median of the rounds ({100 * lo:+.1f} to {100 * hi:+.1f} %)")


def table(summary: dict[str, Any]) -> str:
    seconds = summary["seconds"]
    head = f"{'phase':12}" + "".join(f"{v + ' s (min-max)':>24}" for v in seconds)
    diff = "native" in seconds and "install" in seconds
    lines = [head + (f"{'install - native':>18}" if diff else "")]
    for p in (*PHASES, "total"):
        row = f"{p:12}" + "".join(f"{'%.3f (%.3f-%.3f)' % seconds[v][p]:>24}" for v in seconds)
        if diff:
            row += f"{seconds['install'][p][0] - seconds['native'][p][0]:>+18.3f}"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds one process may take (default 180)")
    ap.add_argument("--json", metavar="FILE", help="also write every process's phases and the summary here")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.timeout <= 0:
        ap.error("--timeout must be positive")
    rounds: list[list[dict[str, Any]]] = []
    for r in range(args.rounds):
        rnd = []
        for variant in order_of(r):
            got = run_once(variant, args.timeout)
            if got.get("rc") == 2:  # the script's own refusal: no torch, or no GPU
                print(f"SKIP: {got['failed']}")
                return 2
            said = got.get("failed") or f"{got['phases']['total']:.2f} s"
            print(f"round {r + 1}/{args.rounds} {variant}: {said}", flush=True)
            rnd.append(got)
        rounds.append(rnd)
    summary = summarize(rounds)
    print()
    if summary["seconds"]:
        print(table(summary))
    print(verdict(summary["ratio"]))
    if summary["allocator_share"]:
        print(allocator_line(summary["allocator_share"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=1))
    failed = sum("failed" in r for rnd in rounds for r in rnd)
    if failed:
        print(f"{failed} process(es) failed (above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
