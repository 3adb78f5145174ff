"""The bit-flip experiment behind the log checksums' figures (issue 15).

Writes a training-shaped log with the C library on the sim device (phases,
markers, stacks; format version 2), takes the first 5000 slots of the
bundled phases_trace (version 1, no checksums), damages copies of each at
random and decodes them with torchalloc.log.read_log. Each trial is one of:
refused (LogFormatError), noted (Log.damage says something), SILENT-CHANGE
(a record or string decoded with different values and nothing said),
SILENT-LOSS (records missing, nothing said), no-effect.

    PYTHONPATH=python python3 python/tests/bitflip_demo.py [TRIALS] [LIBRARY]

LIBRARY defaults to build/libtorchalloc.so.
"""
from __future__ import annotations

import random
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Callable

from torchalloc._compressed import decompress
from torchalloc.log.reader import Log, LogFormatError, read_log

REPO = Path(__file__).resolve().parents[2]
Decoded = tuple[dict[int, bytes], dict[int, str]]


def write_log(library: Path, path: Path) -> bytes:
    script = textwrap.dedent(f"""
        import ctypes, random, sys
        lib = ctypes.CDLL({str(library)!r})
        lib.torchalloc_malloc.restype = ctypes.c_void_p
        lib.torchalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.torchalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        assert lib.torchalloc_init(b"backend:sim,warn:0,oom_report:off,log:{path},stacks:1") == 0
        rng = random.Random(1)
        live = []
        for step in range(20):
            for phase in (b"forward", b"backward", b"optimizer"):
                lib.torchalloc_phase_begin(phase)
                for _ in range(40):
                    n = rng.choice([512, 4096, 1 << 20, 3 << 20, 12 << 20])
                    live.append((lib.torchalloc_malloc(n, 0, None), n))
                    if len(live) > 60:
                        p, m = live.pop(rng.randrange(len(live)))
                        lib.torchalloc_free(p, m, 0, None)
                lib.torchalloc_phase_end(phase)
            lib.torchalloc_mark(f"step {{step}}".encode())
        sys.exit(0)  # the exit-time close writes END and trims the file
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    return path.read_bytes()


def version_1_sample(slots: int = 5000) -> bytes:
    data = bytearray(decompress((REPO / "python/torchalloc/data/phases_trace.talog.xz").read_bytes()))
    data = data[: 128 + 64 * slots]
    data[64:72] = struct.pack("<Q", len(data))  # as if it had been closed there
    return bytes(data)


def decoded(log: Log) -> Decoded:
    return {int(r["seq"]): r.tobytes() for r in log.records}, dict(log.strings)


def classify(original: Decoded, data: bytes) -> str:
    try:
        log = read_log(data)
    except LogFormatError:
        return "refused"
    records, strings = decoded(log)
    if log.damage:
        return "noted"
    if any(original[0].get(s) != b for s, b in records.items()) or any(
            original[1].get(k) != v for k, v in strings.items()):
        return "SILENT-CHANGE"
    return "SILENT-LOSS" if len(records) < len(original[0]) else "no-effect"


def one_bit(d: bytearray, rng: random.Random) -> None:
    b = rng.randrange(len(d) * 8)
    d[b // 8] ^= 1 << (b % 8)


def two_bits_in_one_slot(d: bytearray, rng: random.Random) -> None:
    s = 128 + 64 * rng.randrange((len(d) - 128) // 64)
    for b in rng.sample(range(512), 2):
        d[s + b // 8] ^= 1 << (b % 8)


def one_byte_changed(d: bytearray, rng: random.Random) -> None:
    d[rng.randrange(128, len(d))] ^= rng.randrange(1, 256)


def random_slot(d: bytearray, rng: random.Random) -> None:
    s = 128 + 64 * rng.randrange((len(d) - 128) // 64)
    d[s:s + 64] = bytes(rng.randrange(256) for _ in range(64))


def trials(data: bytes, n: int, damage: Callable[[bytearray, random.Random], None],
           rng: random.Random) -> dict[str, int]:
    original = decoded(read_log(data))
    out: dict[str, int] = {}
    for _ in range(n):
        copy = bytearray(data)
        damage(copy, rng)
        what = classify(original, bytes(copy))
        out[what] = out.get(what, 0) + 1
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    library = Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / "build" / "libtorchalloc.so"
    with tempfile.TemporaryDirectory() as tmp:
        v2 = write_log(library, Path(tmp) / "run.talog")
    v1 = version_1_sample()
    rng = random.Random(2026)
    for name, data in (("version 2", v2), ("version 1", v1)):
        print(f"{name}: {len(read_log(data).records)} records, {len(data)} bytes")
        for label, damage in (("single-bit flip", one_bit), ("two flips in one slot", two_bits_in_one_slot),
                              ("one byte changed", one_byte_changed), ("a slot of random bytes", random_slot)):
            print(f"  {label:24} {n} trials: {trials(data, n, damage, rng)}", flush=True)


if __name__ == "__main__":
    main()
