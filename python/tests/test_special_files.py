"""Special files given as input (issue 47): a FIFO with no writer blocks the open, then every read, for ever;
a device may never end. Every tool and every reader takes regular files (or compressed ones) only, checks the
type on the open descriptor, and never blocks on open or read: one line naming what the file is, exit 2.

Each case runs in a child with a timeout, so a regression fails the test instead of hanging the suite.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
TIMEOUT = 60  # seconds: far beyond what a refusal takes, short of hanging the suite


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    try:
        return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args)} still ran after {TIMEOUT} s: it blocked on the special file")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "run.talog"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("verb", [["report"], ["report", "--json"], ["replay"], ["export", "-o", "OUT"],
                                  ["top", "--once"]])
def test_every_tool_refuses_a_fifo_at_once(fifo: Path, verb: list[str]) -> None:
    args = [str(fifo.parent / "out.json") if word == "OUT" else word for word in verb]
    done = _run(["-m", "torchalloc.cli", *args, str(fifo)])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a FIFO" in lines[0], done.stderr
    assert lines[0].startswith(f"torchalloc {verb[0]}: error: ")


def test_a_link_to_a_fifo_is_refused_as_the_fifo(fifo: Path) -> None:
    link = fifo.parent / "link.talog"
    link.symlink_to(fifo)
    done = _run(["-m", "torchalloc.cli", "report", str(link)])
    assert done.returncode == 2 and "is a FIFO" in done.stderr, done.stderr


# The readers a program calls directly, each on the FIFO: the error it raises, named.
_READERS = r"""
import sys
from torchalloc.log.reader import LogFormatError, read_header, read_log
from torchalloc.log.chunks import ChunkedLog
from torchalloc.log.trace import TraceError, load_trace
from torchalloc.cli.top_reader import LiveReader
from torchalloc._compressed import open_decompressed
path = sys.argv[1]
for name, call in [("read_log", read_log), ("read_header", read_header), ("ChunkedLog", ChunkedLog),
                   ("load_trace", load_trace), ("LiveReader", LiveReader), ("open_decompressed", open_decompressed)]:
    try:
        call(path)
        print(name, "read it")
    except (LogFormatError, TraceError, ValueError) as e:
        print(name, type(e).__name__, e)
"""


def test_every_reader_refuses_a_fifo_without_blocking(fifo: Path) -> None:
    done = _run(["-c", _READERS, str(fifo)])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6, done.stdout
    for line in lines:
        assert "is a FIFO, not" in line, line


def test_a_character_device_is_refused(tmp_path: Path) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    for verb in (["report"], ["replay"], ["top", "--once"]):
        done = _run(["-m", "torchalloc.cli", *verb, "/dev/zero"])
        assert done.returncode == 2 and "is a character device" in done.stderr, (verb, done.stderr)
