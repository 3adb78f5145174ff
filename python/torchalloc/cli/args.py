"""Checks the command-line tools make before their work, so a mistake is one clear line at once.

A report on a 10 GB log takes minutes; finding only then that `--html`
names a directory that does not exist, or that the "log" is a PyTorch
snapshot that `torchalloc replay` reads, wastes them. Every message here is
what follows "torchalloc VERB: error: ".
"""
from __future__ import annotations

import bz2
import glob
import lzma
import math
import os
import sys
import tempfile
import zlib
from pathlib import Path
from typing import NoReturn, Sequence

from .._compressed import XZ_MEMLIMIT, NotAFileError, file_kind, open_file
from .._records import LOG_MAGIC
from ..log.trace_snapshot import looks_like_snapshot
from ..printable import printable

_SNIFF_BYTES = 64 << 10  # a compressed file's first block: enough to show what it starts with


def _first_bytes(head: bytes) -> bytes:
    """The first bytes of the content `head` starts (a file's first bytes, decompressed when gzip, xz or bz2)."""
    try:
        if head.startswith(b"\x1f\x8b"):
            return zlib.decompressobj(wbits=31).decompress(head, 16)
        if head.startswith(b"\xfd7zXZ\x00"):
            return lzma.LZMADecompressor(memlimit=XZ_MEMLIMIT).decompress(head, 16)
        if head.startswith(b"BZh"):
            return bz2.BZ2Decompressor().decompress(head)[:16]
    except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error):
        return b""
    return head[:16]


def fail(prog: str, message: str, status: int = 2) -> NoReturn:
    """Print "PROG: error: MESSAGE" (one line: argparse's style, without its usage text) and exit."""
    print(printable(f"{prog}: error: {' '.join(message.split())}"), file=sys.stderr)
    raise SystemExit(status)


# What a command reads when given no log, as `report` does (and `replay` its own trace): the demo recorded on a
# GPU (data/demo_trace.md), which the wheel carries.
BUNDLED_DEMO = Path(__file__).resolve().parents[1] / "data" / "demo_trace.talog.xz"


def bundled_demo(prog: str) -> list[str]:
    """[the bundled demo log], for a command given no log; fails saying so where the installation lacks it."""
    if not BUNDLED_DEMO.is_file():
        fail(prog, f"no log given, and this installation has no bundled demo trace ({BUNDLED_DEMO} is missing): "
                   "give a log (TORCHALLOC_CONF=log:PATH)")
    return [str(BUNDLED_DEMO)]


def at_value(text: str) -> str | float:
    """A `--at` value: seconds since the log was opened (a number, optionally ending in "s") or a marker's
    label. ValueError for nan and inf, which name no moment (the range is checked against the log)."""
    try:
        seconds = float(text.removesuffix("s"))
    except ValueError:
        return text  # a marker's label
    if not math.isfinite(seconds):
        raise ValueError(f"--at {text}: not a time; give seconds since the log was opened (e.g. --at 1.5) "
                         "or a marker's label")
    return text if text.endswith("s") else seconds  # "1.5s" stays text: a marker may be named so


def with_negative_values(argv: Sequence[str], options: Sequence[str]) -> list[str]:
    """`argv` with "OPTION -5GiB" joined into "OPTION=-5GiB" for the given options, so the value reaches the
    option's own check ("not a size", "not in this log") instead of argparse's "expected one argument"
    (argparse takes a word starting with "-" and a digit for an option of its own)."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out += args[i:]
            break
        value = args[i + 1] if i + 1 < len(args) else ""
        if word in options and len(value) > 1 and value[0] == "-" and (value[1].isdigit() or value[1] in ".i"):
            out.append(f"{word}={value}")  # "-5GiB", "-1", "-.5", "-inf"
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def output_problem(path: str) -> str | None:
    """Why `path` cannot be written as an output file, or None."""
    if not path:
        return "the output path is empty"
    if os.path.isdir(path):
        return f"{path}: is a directory (give a file name)"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{path}: directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"{path}: cannot write in {parent} (permission denied)"
    try:  # access() says yes where creating says no (/proc, a read-only mount): ask by creating, before the work
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".torchalloc-probe-"):
            pass
    except OSError as e:
        return f"{path}: cannot create a file in {parent} ({e.strerror or e})"
    return None


def input_problem(path: str) -> str | None:
    """Why `path` cannot be read as an input file, or None (its content is checked by the reader)."""
    if not os.path.exists(path):
        return f"{path}: no such file"
    try:
        kind = file_kind(os.stat(path).st_mode)
    except OSError as e:
        return f"{path}: cannot read it ({e.strerror or e})"
    if kind is not None:  # a FIFO's or a device's reads may wait for ever
        return f"{path}: is {kind}, not a log"
    if not os.access(path, os.R_OK):
        return f"{path}: cannot read it (permission denied)"
    return None


def snapshot_pointer(path: str, verb: str) -> str | None:
    """When `path` is a PyTorch memory snapshot rather than a torchalloc log: what to run instead."""
    try:
        with open_file(path) as f:
            head = f.read(_SNIFF_BYTES)
    except (OSError, NotAFileError):
        return None
    data = _first_bytes(head)
    if data.startswith(LOG_MAGIC) or not looks_like_snapshot(data):
        return None
    return (f"{path} is a PyTorch memory snapshot (a pickle), not a torchalloc log, so `torchalloc {verb}` "
            f"cannot read it: `torchalloc replay {path}` replays it through each policy, and "
            "https://pytorch.org/memory_viz draws it")


def _is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


def expand_logs(paths: Sequence[str]) -> tuple[list[str], str | None]:
    """The input files: each path as given, or -- when it names no file and holds * ? [ -- the files the
    pattern matches, sorted (so `'run.*.talog'` works quoted, where the shell did not expand it). Also the
    problem with them, or None."""
    out: list[str] = []
    for path in paths:
        if not os.path.exists(path) and _is_pattern(path):
            matches = sorted(m for m in glob.glob(path) if os.path.isfile(m))
            if not matches:
                return out, f"{path}: no file matches this pattern"
            out += matches
        else:
            out.append(path)
    for path in out:
        problem = input_problem(path)
        if problem:
            return out, problem
    if len(set(map(os.path.realpath, out))) < len(out):
        return out, "a log is given twice (each rank's log once)"
    return out, None
