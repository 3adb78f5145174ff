#!/usr/bin/env python3
"""A mutation fuzzer of replay's snapshot reader (torchalloc.log.trace.load_trace
on a PyTorch memory snapshot: the restricted unpickler and from_snapshot), in
plain Python like fuzz_log_decode.py beside it.

The seeds are made at start, small, and need no corpus kept in step with a
format: python/tests/data/small_snapshot.pickle; a snapshot sharing what
PyTorch itself shares (one frames list, and its frame dicts, for every entry
of the same traceback; repeated file names); and the shapes of issue 36 that
PyTorch never writes: one blocks list named by many segments, one segment
named many times (16 KB of such a pickle was once 16 million blocks, 3.8 GB).
Each is pickled with protocols 2 and 4; some are also xz-compressed and
mutated compressed (then read as the file's content is inflated). Mutations:
bit flips, bytes set to interesting values, truncation, ranges deleted or
duplicated, splicing two seeds, and a memo reference (BINGET, LONG_BINGET)
pointed at another memoized object, which makes new shared references.

Every input must give a Trace or be refused with TraceError (one clear
line). Anything else, or an input taking more than --per-input seconds (how
an expansion shows), is a failure: the input is saved, the traceback
printed, and the exit status is 1.

    python3 tests/fuzz/fuzz_snapshot.py [--seconds 60] [--seed N] [--per-input 2] [--save DIR]
"""
from __future__ import annotations

import argparse
import lzma
import pickle
import pickletools
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(HERE))  # fuzz_loop, beside this file

from fuzz_loop import Campaign  # noqa: E402
from torchalloc.log.trace import TraceError, load_trace  # noqa: E402

SMALL_SNAPSHOT = REPO / "python" / "tests" / "data" / "small_snapshot.pickle"
INTERESTING_BYTES = (0, 1, 0x7F, 0x80, 0xFF, ord("h"), ord("j"), ord("]"), ord("}"), ord("."))
MEMO_GETS = {"BINGET", "LONG_BINGET"}  # what protocols 2 and 4 write


def _entry(action: str, addr: int, size: int, frames: list[Any]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": addr, "frames": frames}


def snapshots() -> dict[str, Any]:
    """The seed snapshots, as objects: what each shares is what it tests."""
    frames = [{"filename": "/home/u/train.py", "line": 10, "name": "step"},
              {"filename": "/home/u/train.py", "line": 3, "name": "main"}]
    entries = []
    for i in range(12):  # every entry names the one frames list, as PyTorch's py_symbolize makes it
        entries.append(_entry("alloc", 0x1000 * i, 512 + i, frames))
        entries.append(_entry("free_completed", 0x1000 * i, 512 + i, frames))
    entries.append(_entry("segment_alloc", 1 << 30, 2 << 20, frames))
    blocks = [{"address": (1 << 30) + 512 * b, "size": 512, "requested_size": 500, "state": "active_allocated",
               "frames": frames} for b in range(4)]
    pytorch_like = {"device_traces": [entries], "segments": [
        {"device": 0, "address": 1 << 30, "total_size": 2048, "stream": 0, "blocks": blocks, "frames": []}]}
    shared_list = [{"size": 512, "state": "active_allocated"} for _ in range(20)]
    shared_blocks = {"device_traces": [entries[:4]], "segments": [
        {"device": 0, "address": s << 32, "total_size": 512 * 20, "blocks": shared_list} for s in range(30)]}
    segment = {"device": 0, "address": 0, "total_size": 512, "blocks": [{"size": 512, "state": "active_allocated"}]}
    shared_segment = {"device_traces": [entries[:4]], "segments": [segment] * 30}
    return {"small": pickle.loads(SMALL_SNAPSHOT.read_bytes()), "pytorch-like": pytorch_like,
            "shared-blocks": shared_blocks, "shared-segment": shared_segment}


def seeds() -> dict[str, bytes]:
    out = {}
    for name, snapshot in snapshots().items():
        for protocol in (2, 4):
            out[f"{name}-p{protocol}"] = pickle.dumps(snapshot, protocol=protocol)
    for name in ("pytorch-like-p4", "shared-blocks-p2"):
        out[f"{name}.xz"] = lzma.compress(out[name], preset=0)
    return out


def memo_gets(data: bytes) -> tuple[list[tuple[int, str]], int]:
    """(offset, opcode name) of each memo reference in `data`, and how many objects it memoizes."""
    gets, memoized = [], 0
    try:
        for op, _, pos in pickletools.genops(data):
            if op.name in MEMO_GETS:
                gets.append((pos, op.name))
            elif op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                memoized += 1
    except Exception:  # noqa: BLE001 -- a compressed seed is no pickle: it has none to point elsewhere
        return [], 0
    return gets, memoized


def mutate(rng: random.Random, data: bytearray, other: bytes, gets: list[tuple[int, str]], memoized: int) -> str:
    """One mutation of `data` in place; returns its name (for the statistics)."""
    m = rng.randrange(8)
    if m == 0 and gets and memoized:
        pos, name = rng.choice(gets)
        target = rng.randrange(memoized)
        # (an earlier mutation of this input may have moved or cut the opcode: then nothing changes)
        if name == "BINGET" and target < 256 and data[pos:pos + 1] == b"h" and pos + 1 < len(data):
            data[pos + 1] = target
        elif name == "LONG_BINGET" and data[pos:pos + 1] == b"j" and pos + 5 <= len(data):
            data[pos + 1:pos + 5] = target.to_bytes(4, "little")
        return "memo reference retargeted"
    if m == 1:
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return "bit flips"
    if m == 2 and data:
        data[rng.randrange(len(data))] = rng.choice(INTERESTING_BYTES)
        return "interesting byte"
    if m == 3:
        del data[rng.randrange(len(data) + 1):]
        return "truncation"
    if m == 4:
        at = rng.randrange(len(data) + 1)
        del data[at:at + rng.randint(1, 16)]
        return "range deleted"
    if m == 5:
        at = rng.randrange(len(data) + 1)
        data[at:at] = data[at:at + rng.randint(1, 16)] * rng.randint(1, 4)
        return "range duplicated"
    if m == 6:
        cut = rng.randrange(len(data) + 1)
        data[cut:] = other[rng.randrange(len(other) + 1):]
        return "splice"
    data += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
    return "garbage appended"


def exercise(path: Path) -> str:
    """Load the snapshot at `path` as replay does; the outcome's name."""
    try:
        trace = load_trace(path)
    except TraceError as e:
        return "refused: shared reference" if "shared reference" in str(e) else "refused"
    _ = trace.peak_requested, len(trace.events), trace.notes
    return "loaded"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--per-input", type=float, default=2.0, help="time bound of one input (seconds)")
    ap.add_argument("--save", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()

    inputs = seeds()
    names = sorted(inputs)
    memo = {name: memo_gets(data) for name, data in inputs.items()}
    scratch = Path(tempfile.mkdtemp(prefix="fuzz_snapshot-"))
    source = scratch / "input"
    rng = random.Random(args.seed)
    campaign = Campaign("fuzz_snapshot", args.seed, args.per_input, args.save)
    print(f"fuzz_snapshot: {len(inputs)} seeds, seed {args.seed}, {args.seconds:.0f} s, "
          f"{args.per_input:g} s per input")
    try:
        for name in names:  # the seeds themselves: the shared shapes refused, the rest loaded
            source.write_bytes(inputs[name])
            want = "refused: shared reference" if name.startswith("shared-") else "loaded"
            assert exercise(source) == want, f"seed {name} is not {want}"
        start = time.monotonic()
        while time.monotonic() - start < args.seconds:
            name = rng.choice(names)
            data = bytearray(inputs[name])
            applied = [mutate(rng, data, inputs[rng.choice(names)], *memo[name]) for _ in range(rng.randint(1, 3))]
            source.write_bytes(data)
            if not campaign.run(lambda: exercise(source), bytes(data), name, applied, time.monotonic):
                return 1
    finally:
        source.unlink(missing_ok=True)
        scratch.rmdir()
    campaign.summary(time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
