"""How the job tools scale with the number of ranks: wall time and peak RSS of `torchalloc report` (text,
--json, --html) and `torchalloc replay` on N rank logs of a synthetic job, N = 8, 16, 64 by default.

    python3 bench/bench_ranks.py                               # 8, 16 and 64 ranks of 10^5 records each
    python3 bench/bench_ranks.py --ranks 64 --records 1e5 --tools report,replay --keep --dir /tmp/ranks

Each rank's log is written by bench/make_big_log (the library on the simulated device, logging on, the
training-like pattern bench_scale.py uses) with $RANK and $WORLD_SIZE set as torchrun sets them, so the
headers carry the rank. Every tool runs in its own process on the pattern 'DIR/run.*.talog'; its peak RSS
is the child's ru_maxrss. The job is analysed one rank at a time: what is kept per rank is a summary, so
memory should follow one rank's log, not the job's size. Figures only, not a test.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_scale import find_generator, records_in, run_measured

REPO = Path(__file__).resolve().parents[1]
TOOLS = {
    "report": ["report", "{pattern}"],
    "json": ["report", "{pattern}", "--json"],
    "html": ["report", "{pattern}", "--html", "{dir}/ranks.html"],
    "replay": ["replay", "{pattern}", "--no-search"],
}


def make_job(generator: Path, folder: Path, ranks: int, records: int) -> float:
    """Write folder/run.R.talog for R in 0..ranks-1; the seconds it took."""
    t0 = time.perf_counter()
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks))
        subprocess.run([str(generator), str(folder / f"run.{rank}.talog"), str(records)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        print(f"\r  rank {rank + 1}/{ranks} written", end="", flush=True)
    print()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="8,16,64", help="job sizes (default: %(default)s)")
    ap.add_argument("--records", default="1e5", help="records per rank's log (default: %(default)s)")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"among {', '.join(TOOLS)} (default: all)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the jobs go (default: %(default)s)")
    ap.add_argument("--generator", help="the make_big_log binary (default: build/bench/make_big_log)")
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    args = ap.parse_args()
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if any(t not in TOOLS for t in tools):
        sys.exit(f"bench_ranks: unknown tool among {tools}; known: {', '.join(TOOLS)}")
    sizes = [int(r) for r in args.ranks.split(",")]
    records = int(float(args.records))
    generator = find_generator(args.generator)
    env = dict(os.environ, PYTHONPATH=str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    print(f"{'ranks':>6} {'records':>12}  {'tool':<8} {'status':>6} {'wall s':>8} {'peak RSS MB':>12}")
    for ranks in sizes:
        folder = base / f"bench_ranks_{ranks}"
        folder.mkdir(exist_ok=True)
        for old in folder.glob("run.*.talog"):
            old.unlink()
        seconds = make_job(generator, folder, ranks, records)
        total = sum(records_in(p) for p in folder.glob("run.*.talog"))
        print(f"  {ranks} logs, {total:,} records, written in {seconds:.1f} s")
        for tool in tools:
            argv = [sys.executable, "-m", "torchalloc.cli"] + [
                a.format(pattern=str(folder / "run.*.talog"), dir=folder) for a in TOOLS[tool]]
            code, wall, rss, tail = run_measured(argv, env)
            print(f"{ranks:>6} {total:>12,}  {tool:<8} {code:>6} {wall:>8.1f} {rss / 2**20:>12,.0f}", flush=True)
            if code != 0:
                print("    " + tail.strip().replace("\n", "\n    "))
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
