"""What a refresh of `torchalloc top` costs on a log growing at 10^5 records per second, and how much memory the
viewer holds after 10^7 appended records (issue 37 item 2).

    python3 bench/bench_top.py                        # 10^7 records at 10^5/s: about 100 s
    python3 bench/bench_top.py --records 2e6 --rate 2e5
    python3 bench/bench_top.py --source /tmp/big.talog  # records from an existing log

A source log is written by bench/make_big_log (the library on the simulated
device: a training-like pattern with phases, three streams, markers; no
stacks) unless --source gives one. A feeder process then copies its records
into a new file at --rate records per second, in bursts every 10 ms, holding
the file's lock as a writer does (the viewer sees it running) and closing
the header at the end. This process is the viewer: every --interval it
refreshes a LiveState (top_state.py: reading the records appended since the
last refresh) and renders the frame, timing both, and reads its own
resident memory (VmRSS) after each. Figures only, not a test: the
machine's load changes the times.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from torchalloc.cli.top_frame import frame  # noqa: E402
from torchalloc.cli.top_reader import LiveReader  # noqa: E402
from torchalloc.cli.top_state import LiveState  # noqa: E402

HEADER, SLOT = 128, 64
BURST_S = 0.01


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _header(head: bytes, status: int, end: int) -> bytes:
    """The source's header with this status and end offset, its checksum redone (version 2: bytes XOR to 0)."""
    h = bytearray(head)
    struct.pack_into("<I", h, 56, status)
    struct.pack_into("<Q", h, 64, end)
    h[60] = 0
    x = 0
    for b in h:
        x ^= b
    h[60] = x
    return bytes(h)


def feed(source: str, target: str, records: int, rate: float) -> None:
    """Copy `records` slots of `source` into `target` at `rate` per second; the header says open until the end."""
    with open(source, "rb") as src, open(target, "r+b") as out:
        fcntl.flock(out.fileno(), fcntl.LOCK_EX)  # a running writer holds it
        head = src.read(HEADER)
        start = time.monotonic()
        done = 0
        while done < records:
            due = min(records, int((time.monotonic() - start) * rate) + 1)
            if due > done:
                out.seek(HEADER + done * SLOT)
                out.write(src.read((due - done) * SLOT))
                out.flush()
                done = due
            time.sleep(BURST_S)
        out.seek(0)
        out.write(_header(head, 1, HEADER + done * SLOT))  # closed: the viewer stops
        out.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=float, default=1e7, help="records appended in all (default 1e7)")
    ap.add_argument("--rate", type=float, default=1e5, help="records appended per second (default 1e5)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    ap.add_argument("--source", help="a plain (uncompressed) log to take the records from")
    ap.add_argument("--generator", default=str(REPO / "build" / "bench" / "make_big_log"),
                    help="the make_big_log binary (default: build/bench/make_big_log)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the logs go (default: the temp folder)")
    ap.add_argument("--feed", nargs=2, metavar=("SOURCE", "TARGET"), help=argparse.SUPPRESS)  # the feeder process
    args = ap.parse_args()
    records = int(args.records)
    if args.feed:
        feed(args.feed[0], args.feed[1], records, args.rate)
        return 0
    made = None
    source = args.source
    if source is None:
        if not Path(args.generator).is_file():
            sys.exit(f"bench_top: no make_big_log at {args.generator}; build it (cmake --build build --target "
                     "make_big_log) or give --generator PATH or --source LOG")
        made = source = os.path.join(args.dir, f"bench_top_source_{os.getpid()}.talog")
        print(f"writing a source log of {records:.3g} records with {args.generator} ...", flush=True)
        subprocess.run([args.generator, source, str(records)], check=True, stdout=subprocess.DEVNULL)
    available = (os.path.getsize(source) - HEADER) // SLOT
    records = min(records, available)
    target = os.path.join(args.dir, f"bench_top_growing_{os.getpid()}.talog")
    with open(source, "rb") as f:
        Path(target).write_bytes(_header(f.read(HEADER), 0, 0))
    feeder = subprocess.Popen([sys.executable, __file__, "--feed", source, target, "--records", str(records),
                               "--rate", str(args.rate)])
    try:
        while os.path.getsize(target) == HEADER and feeder.poll() is None:
            time.sleep(BURST_S)  # the first records
        state = LiveState(LiveReader(target))
        rss0 = _rss()
        refresh_ms: list[float] = []
        render_ms: list[float] = []
        cpu_ms: list[float] = []
        rows: list[tuple[int, float, float, int]] = []
        print(f"{'records':>12} {'refresh ms':>11} {'render ms':>10} {'RSS MiB':>8}")
        while True:
            t0, c0 = time.perf_counter(), time.process_time()
            state.refresh()
            t1 = time.perf_counter()
            frame([state], 100)
            t2 = time.perf_counter()
            cpu_ms.append((time.process_time() - c0) * 1e3)
            refresh_ms.append((t1 - t0) * 1e3)
            render_ms.append((t2 - t1) * 1e3)
            rows.append((state.reader.next_slot, refresh_ms[-1], render_ms[-1], _rss()))
            if len(rows) % 10 == 1 or state.writer != "running":
                n, a, b, r = rows[-1]
                print(f"{n:>12,} {a:>11.1f} {b:>10.1f} {r / 2**20:>8.1f}", flush=True)
            if state.writer != "running":
                break
            time.sleep(max(args.interval - (time.perf_counter() - t0), 0))
        feeder.wait()
    finally:
        if feeder.poll() is None:
            feeder.kill()
        os.unlink(target)
        if made:
            os.unlink(made)
    # the first and last refreshes read a backlog (what came before the viewer started, the feeder's last burst)
    steady = [a + b for _, a, b, _ in rows[1:-1]] or [rows[0][1] + rows[0][2]]
    cpu = cpu_ms[1:-1] or cpu_ms

    def spread(ms: list[float]) -> str:
        ms = sorted(ms)
        return f"median {ms[len(ms) // 2]:.1f} ms, 95th percentile {ms[int(len(ms) * 0.95)]:.1f} ms, max {ms[-1]:.1f} ms"

    print(f"\n{state.reader.next_slot:,} records appended at {args.rate:.3g}/s, refreshed every {args.interval:g} s "
          f"({len(rows)} refreshes)")
    print(f"a refresh (read + fold in + render), wall: {spread(steady)}; over 50 ms: "
          f"{sum(ms > 50 for ms in steady)} of {len(steady)}")
    print(f"                                     CPU:  {spread(cpu)}")
    print(f"viewer RSS: {rss0 / 2**20:.1f} MiB before the first refresh, {rows[len(rows) // 10][3] / 2**20:.1f} MiB "
          f"at a tenth, {max(r for *_, r in rows) / 2**20:.1f} MiB at most, {rows[-1][3] / 2**20:.1f} MiB at the end; "
          f"live blocks held: {len(state.carry):,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
