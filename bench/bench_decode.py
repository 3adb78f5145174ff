"""Decode speed of torchalloc.log.read_log on a synthetic log.

    python3 bench/bench_decode.py [--records 5000000] [--repeat 5] [--keep PATH]

Writes a log of alloc/free pairs (with the metadata a stacks:1 run would
interleave: a string, frame and stack every 1000 records) following
docs/LOG_FORMAT.md, then times read_log on it (the file is in the page cache
after the first read; the best of --repeat runs is reported). The target is
at least 5 M records/s.
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from torchalloc.log import reader as talog  # noqa: E402

META_EVERY = 1000


def synthesize(path: Path, n: int) -> None:
    r = np.zeros(n, dtype=talog.RECORD_DTYPE)
    idx = np.arange(n, dtype=np.uint64)
    r["seq"] = idx
    r["time_ns"] = 10**9 + idx * 250
    r["tid"] = 4242
    r["device"] = 0
    r["pool"] = 1
    r["kind"] = np.where(idx % 2 == 0, talog.ALLOC, talog.FREE)
    r["addr"] = 0x7F0000000000 + (idx // 2 % 4096) * 512
    r["size"] = 500 + (idx // 2 % 7) * 512
    r["block_size"] = 512 + (idx // 2 % 7) * 512
    r["stream"] = 0
    # Metadata triples: string (id a), frame (id a+1), stack (id a+2), then events reference the stack.
    meta = np.arange(0, n - 3, META_EVERY)
    ids = 1 + 3 * np.arange(len(meta), dtype=np.uint32)
    raw = r.view(np.uint8).reshape(n, 64)
    r["kind"][meta], r["kind"][meta + 1], r["kind"][meta + 2] = talog.STRING, talog.FRAME, talog.STACK
    text = np.frombuffer(b"/some/site-packages/torch/nn/modules/linear.py"[:47].ljust(47, b"\0"), np.uint8)
    for base in (meta, meta + 1, meta + 2):
        raw[base, 0:8] = 0
        raw[base, 16:63] = 0
    raw[meta, 0:4] = ids.view(np.uint8).reshape(-1, 4)
    raw[meta, 4:6] = np.frombuffer(struct.pack("<H", 47), np.uint8)
    raw[meta, 16:63] = text
    raw[meta + 1, 0:4] = (ids + 1).view(np.uint8).reshape(-1, 4)
    raw[meta + 1, 4:8] = np.frombuffer(struct.pack("<I", 123), np.uint8)
    raw[meta + 1, 16:20] = ids.view(np.uint8).reshape(-1, 4)
    raw[meta + 1, 20:24] = ids.view(np.uint8).reshape(-1, 4)
    raw[meta + 2, 0:4] = (ids + 2).view(np.uint8).reshape(-1, 4)
    raw[meta + 2, 4:6] = np.frombuffer(struct.pack("<H", 1), np.uint8)
    raw[meta + 2, 16:20] = (ids + 1).view(np.uint8).reshape(-1, 4)
    r["seq"][meta], r["seq"][meta + 1], r["seq"][meta + 2] = meta, meta + 1, meta + 2
    r["kind"][-1] = talog.END
    end = 128 + 64 * n
    header = struct.pack("<8sIIIIQQIiQIIQ16s", talog.MAGIC, 1, 128, 64, 0x01020304, 0, 0, os.getpid(), -1, 0, 1, 0,
                         end, b"torchalloc").ljust(128, b"\0")
    with open(path, "wb") as f:
        f.write(header)
        f.write(r.tobytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="write the synthetic log here and keep it")
    args = ap.parse_args()
    path = args.keep or Path(tempfile.mkdtemp()) / "bench.talog"
    synthesize(path, args.records)
    size = path.stat().st_size
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        log = talog.read_log(path)
        best = min(best, time.perf_counter() - start)
    assert not log.warnings and log.complete, log.warnings
    slots = args.records
    print(f"decoded {slots:,} slots ({len(log.records):,} event records, {len(log.stacks):,} stacks, "
          f"{size / 2**20:.0f} MiB) in {best * 1e3:.0f} ms: {slots / best / 1e6:.1f} M records/s")
    if not args.keep:
        path.unlink()
        path.parent.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
