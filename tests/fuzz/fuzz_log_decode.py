#!/usr/bin/env python3
"""A mutation fuzzer of the log decoder (torchalloc.log.read_log) and of the
tools that read its result (report, export, replay's trace), in plain
Python: no coverage feedback, no new dependency (libFuzzer's Python
counterpart, atheris, is not packaged for every Python we run on).

Seeds are real logs the C library wrote on the simulated device, one of
them opened mid-run, and hand-made logs whose checksums hold but whose
records no writer produces (hostile-*, the shapes of issue 23)
(tests/fuzz/corpus/decoder/, made by make_corpus.py). Each input is a seed
(or two, spliced) put through 1 to 4 mutations that aim where a decoder
breaks: bit flips, interesting values in header fields and in record
fields (kind, sequence number, string/stack ids, lengths, chunk numbers),
truncation anywhere or near a record boundary, splicing, records deleted,
duplicated or swapped, ranges zeroed, garbage appended; a compressed seed
is mutated compressed and read from a file. Besides the stored seeds, a few
are made at start (generated_seeds): real logs followed by ZERO_PAD zero
bytes, xz- and gzip-compressed, a few KB that inflate to far more (the shape
of issue 36); they are always mutated compressed. Two mutations reseal the
slot they change (its checksum recomputed), so that the tools, not only
the checksum, meet impossible values: a record field set to an interesting
value, and a record copied over another (its sequence number kept), which
makes a phase begun twice or ended unopened, a block freed twice.

Every input must either decode (a Log, damage allowed and reported in its
warnings), then summarise (to_text) and resolve its stacks and labels, or
raise the decoder's own LogFormatError. Every seed, and a --tools share of
the decoded inputs, then goes through the report (its text and JSON
data), export's snapshot and replay's trace, which may refuse the log only
with LogFormatError or TraceError (a clear message naming the damage).
Anything else (another exception, more than --per-input seconds) is a
failure: the input is saved, the traceback printed, and the exit status is 1.

    python3 tests/fuzz/fuzz_log_decode.py [--seconds 60] [--seed N] [--per-input 5] [--tools 0.125]
                                          [--corpus DIR] [--save DIR]
"""
from __future__ import annotations

import argparse
import lzma
import random
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))
sys.path.insert(0, str(HERE))  # fuzz_loop, beside this file

from fuzz_loop import Campaign  # noqa: E402
from torchalloc._compressed import decompress, is_compressed  # noqa: E402
from torchalloc.log.reader import (  # noqa: E402
    HEADER_SIZE,
    RECORD_DTYPE,
    RECORD_SIZE,
    LogFormatError,
    read_log,
    to_text,
)
from torchalloc.log.trace_events import TraceError  # noqa: E402

INTERESTING_INTS = (0, 1, 2, 7, 8, 63, 64, 65, 127, 128, 129, 255, 256, 4096, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF,
                    0x80000000, 0xFFFFFFFF, 1 << 40, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)
# Header fields (log/format.py's HEADER_STRUCT): offset and size. Version, header size,
# record size, byte-order mark, status and end offset are the ones read.
HEADER_FIELDS = ((8, 4), (12, 4), (16, 4), (20, 4), (24, 8), (32, 8), (40, 4), (44, 4), (48, 8), (56, 4),
                 (60, 4), (64, 8), (72, 16))
RECORD_FIELDS = tuple((RECORD_DTYPE.fields[n][1], RECORD_DTYPE.fields[n][0].itemsize) for n in RECORD_DTYPE.names)
# Metadata records reuse the slot: id (0, 4), len/nframes (4, 2), chunk (6, 2), frame ids from 16.
META_FIELDS = ((0, 4), (4, 2), (6, 2), (16, 4), (20, 4), (24, 4))


# Zeros after a log in the generated seeds: enough that inflating them whole shows (as it did before issue 36),
# few enough that reading them a piece at a time stays a small share of --per-input.
ZERO_PAD = 32 << 20
_PACKERS = {"xz": lambda: lzma.LZMACompressor(preset=0), "gz": lambda: zlib.compressobj(9, wbits=31)}


def generated_seeds(plain: dict[str, bytes]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Seeds made here rather than stored (a stored one would be a large file or hide what it is): each of
    two real logs, one closed and one whose writer was killed, followed by ZERO_PAD zero bytes and
    compressed a piece at a time. Returns (compressed, plain form) by name; the plain form has a few KiB of
    zeros, so that mutating it stays cheap."""
    packed, small = {}, {}
    zeros = bytes(1 << 20)
    for base in ("closed-stacks", "open-when-copied"):
        if base not in plain:
            continue
        for fmt, make in _PACKERS.items():
            packer = make()
            parts = [packer.compress(plain[base])] + [packer.compress(zeros) for _ in range(ZERO_PAD // len(zeros))]
            name = f"{base}+zeros.{fmt}"
            packed[name] = b"".join(parts) + packer.flush()
            small[name] = plain[base] + bytes(4096)
    return packed, small


def put_int(data: bytearray, offset: int, size: int, value: int) -> None:
    if offset + size <= len(data):
        data[offset:offset + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def record_offset(rng: random.Random, data: bytearray) -> int:
    n = max(1, (len(data) - HEADER_SIZE) // RECORD_SIZE)
    return HEADER_SIZE + rng.randrange(n) * RECORD_SIZE


def reseal(data: bytearray, at: int) -> None:
    """Recompute the checksum of the slot at byte `at` (version 2: its 64 bytes XOR to 0)."""
    if at + RECORD_SIZE > len(data) or int.from_bytes(data[8:12], "little") < 2:
        return
    data[at + 62] = 0
    x = 0
    for b in data[at:at + RECORD_SIZE]:
        x ^= b
    data[at + 62] = x


def mutate(rng: random.Random, data: bytearray, other: bytes) -> str:
    """One mutation of `data` in place; returns its name (for the statistics)."""
    m = rng.randrange(14)
    if m == 12:
        at = record_offset(rng, data)
        offset, size = rng.choice(RECORD_FIELDS)
        if offset not in (8, 62, 63):  # the sequence number, checksum and kind stay what the slot says
            put_int(data, at + offset, size, rng.choice(INTERESTING_INTS) if rng.random() < 0.7
                    else rng.getrandbits(64))
            reseal(data, at)
        return "record field, resealed"
    if m == 13:
        a, b = record_offset(rng, data), record_offset(rng, data)
        if a != b and max(a, b) + RECORD_SIZE <= len(data):
            seq = data[b + 8:b + 16]
            data[b:b + RECORD_SIZE] = data[a:a + RECORD_SIZE]
            data[b + 8:b + 16] = seq
            reseal(data, b)
        return "record copied, resealed"
    if m == 0:
        for _ in range(rng.randint(1, 8)):
            if data:
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
        return "bit flips"
    if m == 1:
        offset, size = rng.choice(HEADER_FIELDS)
        value = rng.choice(INTERESTING_INTS) if rng.random() < 0.7 else int.from_bytes(
            data[offset:offset + size], "little") + rng.randint(-70, 70)
        if offset == 64 and rng.random() < 0.5:  # end offset near the real end
            value = len(data) + rng.randint(-200, 200)
        put_int(data, offset, size, value)
        return "header field"
    if m in (2, 3):
        at = record_offset(rng, data)
        offset, size = rng.choice(RECORD_FIELDS if m == 2 else META_FIELDS)
        put_int(data, at + offset, size, rng.choice(INTERESTING_INTS) if rng.random() < 0.6 else rng.getrandbits(64))
        return "record field" if m == 2 else "metadata field"
    if m == 4:
        at = record_offset(rng, data)
        put_int(data, at + 63, 1, rng.randrange(256))  # the kind byte, published last by the writer
        return "record kind"
    if m == 5:
        cut = record_offset(rng, data) + rng.choice((0, 0, 1, 32, 63, 64, -1)) if rng.random() < 0.6 else \
            rng.randrange(len(data) + 1)
        del data[max(0, cut):]
        return "truncation"
    if m == 6:
        cut = rng.randrange(len(data) + 1)
        data[cut:] = other[rng.randrange(len(other) + 1):]
        return "splice"
    if m == 7:
        at = record_offset(rng, data)
        del data[at:at + RECORD_SIZE * rng.randint(1, 3)]
        return "records deleted"
    if m == 8:
        at = record_offset(rng, data)
        data[at:at] = data[at:at + RECORD_SIZE] * rng.randint(1, 3)
        return "records duplicated"
    if m == 9:
        a, b = record_offset(rng, data), record_offset(rng, data)
        if a > b:
            a, b = b, a
        if a != b and b + RECORD_SIZE <= len(data):
            ra, rb = data[a:a + RECORD_SIZE], data[b:b + RECORD_SIZE]
            data[a:a + RECORD_SIZE], data[b:b + RECORD_SIZE] = rb, ra
        return "records swapped"
    if m == 10:
        at = rng.randrange(len(data) + 1)
        data[at:at + rng.randint(1, 512)] = bytes(min(len(data) - at, 512))[: rng.randint(1, 512)]
        return "range zeroed"
    data += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
    return "garbage appended"


def exercise(source, tools: bool = False) -> str:
    """Decode and use the result as a tool would (with `tools`, as report, export and replay do); the
    outcome's name."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warn=False must mean no warnings at all
            log = read_log(source, warn=False)
    except LogFormatError:
        return "LogFormatError"
    to_text(log)
    for record in log.records[:64]:
        log.stack(record["stack"])
        log.label(record)
    log.wall_time_ns()  # a header with absurd clock fields once made this raise OverflowError
    outcome = "decoded, damage reported" if log.warnings else "decoded"
    return outcome if not tools else outcome + ", " + use_tools(source)


def use_tools(source) -> str:
    """The log (its bytes, or the path of a compressed one) through report, export and replay's trace, as the
    CLI runs them: read in pieces, so that blocks and phases cross them. A mutated log's own bytes are small:
    pieces of 7 records; a compressed one may inflate to many megabytes of zeros: pieces of 4096 (7 would cost
    seconds per input in piece overhead alone; the tools' own pieces are 262144)."""
    from torchalloc.analysis import analyze
    from torchalloc.report.export import to_snapshot
    from torchalloc.report.text import render_text
    from torchalloc.log.trace_stream import load_log

    piece = 7 if isinstance(source, (bytes, bytearray)) else 4096
    try:
        a = analyze(source, chunk_records=piece)
        a.to_dict()
        render_text(a, at=("peak", "end"))
        to_snapshot(source, 0, chunk_records=piece)
    except LogFormatError:
        return "tools refused"
    try:
        load_log(source, chunk_records=piece)
    except (TraceError, LogFormatError):
        return "tools ran, replay refused"
    return "tools ran"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--per-input", type=float, default=5.0, help="time bound of one input (seconds)")
    ap.add_argument("--tools", type=float, default=0.125, help="share of decoded inputs also put through the "
                    "tools (report, export, replay's trace; every seed is): they take ~10 ms an input, the decoder "
                    "~0.5 ms")
    ap.add_argument("--corpus", type=Path, default=HERE / "corpus" / "decoder")
    ap.add_argument("--save", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()

    seeds = {p.name: p.read_bytes() for p in sorted(args.corpus.iterdir()) if p.is_file()}
    if not seeds:
        print(f"fuzz_log_decode: no seeds in {args.corpus}")
        return 1
    plain = {name: decompress(d) for name, d in seeds.items()}
    made, made_plain = generated_seeds(plain)
    seeds.update(made)
    plain.update(made_plain)
    scratch = Path(tempfile.mkdtemp(prefix="fuzz_log_decode-"))
    for name, data in plain.items():  # the seeds themselves must decode, and the tools read them
        assert exercise(data, tools=True).startswith("decoded"), f"seed {name} does not decode"
        if is_compressed(seeds[name][:8]):  # and so must the compressed files, read as files
            packed = scratch / "seed"
            packed.write_bytes(seeds[name])
            assert exercise(packed).startswith("decoded"), f"seed {name}, compressed, does not decode"
            packed.unlink()
    rng = random.Random(args.seed)
    campaign = Campaign("fuzz_log_decode", args.seed, args.per_input, args.save)
    names = sorted(seeds)
    start = time.monotonic()
    print(f"fuzz_log_decode: {len(seeds)} seeds from {args.corpus}, seed {args.seed}, {args.seconds:.0f} s, "
          f"{args.per_input:g} s per input")
    try:
        while time.monotonic() - start < args.seconds:
            name = rng.choice(names)
            compressed = is_compressed(seeds[name][:8]) and (name in made or rng.random() < 0.3)
            data = bytearray(seeds[name] if compressed else plain[name])
            other = plain[rng.choice(names)]
            applied = [mutate(rng, data, other) for _ in range(rng.randint(1, 4))]
            source: object = bytes(data)
            if compressed:  # the decompression path reads files only
                source = scratch / "input.talog.compressed"
                source.write_bytes(data)
            tools = rng.random() < args.tools
            if not campaign.run(lambda: exercise(source, tools=tools), bytes(data),
                                name + (", compressed" if compressed else ""), applied, time.monotonic):
                return 1
    finally:
        for p in scratch.iterdir():
            p.unlink()
        scratch.rmdir()
    campaign.summary(time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
