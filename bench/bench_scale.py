"""How the offline tools scale: records/s, wall time and peak RSS of report (text, --json, --html), replay
and export on logs of 10^6, 10^7 and 10^8 records.

    python3 bench/bench_scale.py                          # 10^6 and 10^7 records
    python3 bench/bench_scale.py --records 1e6,1e7,1e8 --tools report,json
    python3 bench/bench_scale.py --log /tmp/big.talog     # an existing log, not generated

Each log is written by bench/make_big_log (the library on the simulated
device, logging on: a training-like pattern with phases, three streams and
markers; no stacks, as no Python runs) into --dir, and deleted afterwards
unless --keep. Every tool runs in its own process (`python -m
torchalloc.cli ...`, output to /dev/null or a file in --dir); its peak RSS
is the child's ru_maxrss (as /usr/bin/time -v reports it). Figures only,
not a test: the machine's load changes the wall times.

A 10^8-record log takes 6.4 GB of disk: check `df -h` of --dir first.
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

REPO = Path(__file__).resolve().parents[1]
TOOLS = {
    "report": ["report", "{log}"],
    "json": ["report", "{log}", "--json"],
    "html": ["report", "{log}", "--html", "{dir}/scale.html"],
    "replay": ["replay", "{log}", "--no-search"],
    "replay-search": ["replay", "{log}"],
    "export": ["export", "{log}", "-o", "{dir}/scale.pickle"],
}
DEFAULT_TOOLS = "report,json,html,replay,export"


def find_generator(given: str | None) -> Path:
    for candidate in ([Path(given)] if given else []) + [REPO / "build" / "bench" / "make_big_log"]:
        if candidate.is_file():
            return candidate
    sys.exit("bench_scale: no make_big_log binary; build it (cmake --build build --target make_big_log) or give "
             "--generator PATH")


def run_measured(argv: list[str], env: dict[str, str]) -> tuple[int, float, int, str]:
    """Run argv; its status, wall seconds, peak RSS in bytes, and the tail of its stderr."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        err.seek(0)
        tail = err.read()[-400:]
    code = os.waitstatus_to_exitcode(status)
    return code, wall, usage.ru_maxrss * 1024, tail


def records_in(log: Path) -> int:
    return max(0, (log.stat().st_size - 128) // 64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", default="1e6,1e7", help="log sizes to generate (default: %(default)s)")
    ap.add_argument("--log", action="append", default=[], help="measure this log instead of generating one")
    ap.add_argument("--tools", default=DEFAULT_TOOLS, help=f"among {', '.join(TOOLS)} (default: %(default)s)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where logs and outputs go (default: %(default)s)")
    ap.add_argument("--generator", help="the make_big_log binary (default: build/bench/make_big_log)")
    ap.add_argument("--keep", action="store_true", help="keep generated logs")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per tool run")
    args = ap.parse_args()
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        sys.exit(f"bench_scale: unknown tools {unknown}; known: {', '.join(TOOLS)}")
    out_dir = Path(args.dir)
    out_dir.mkdir(parents=True, exist_ok=True)  # a --dir that does not exist yet
    env = dict(os.environ, PYTHONPATH=str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    logs: list[tuple[Path, bool]] = [(Path(p), False) for p in args.log]
    if not logs:
        generator = find_generator(args.generator)
        for text in args.records.split(","):
            n = int(float(text))
            need = n * 64 * 1.3
            free = shutil.disk_usage(out_dir).free
            if need > free:
                print(f"skip {n:.0e} records: needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free in {out_dir}")
                continue
            log = out_dir / f"bench_scale_{n}.talog"
            t0 = time.perf_counter()
            subprocess.run([str(generator), str(log), str(n)], check=True, stdout=subprocess.DEVNULL)
            print(f"generated {log}: {records_in(log):,} records, {log.stat().st_size / 1e6:.0f} MB in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            logs.append((log, not args.keep))
    print(f"{'records':>12}  {'tool':<14} {'status':>6} {'wall s':>8} {'records/s':>12} {'peak RSS MB':>12}")
    for log, delete in logs:
        n = records_in(log)
        for tool in tools:
            argv = [sys.executable, "-m", "torchalloc.cli"] + [a.format(log=log, dir=out_dir) for a in TOOLS[tool]]
            code, wall, rss, tail = run_measured(argv, env)
            print(f"{n:>12,}  {tool:<14} {code:>6} {wall:>8.1f} {n / wall:>12,.0f} {rss / 2**20:>12,.0f}", flush=True)
            if code != 0:
                print("    " + tail.strip().replace("\n", "\n    "))
        for leftover in (out_dir / "scale.html", out_dir / "scale.pickle"):
            leftover.unlink(missing_ok=True)
        if delete:
            log.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
