"""Log integrity (issue 15): the checksums of format version 2, what the
reader says it dropped (as the tool's own notes), how a log's writer ended
(closed, killed, still running), and version-1 logs still decoding."""
from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from torchalloc.log import reader as talog
from torchalloc.cli import report as report_cli
from torchalloc.report import text as report
from torchalloc.log.reader import LogFormatError, read_log

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "python" / "torchalloc" / "data" / "phases_trace.talog.xz"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_log_decode import synth  # noqa: E402  (a version-1 log built from docs/LOG_FORMAT.md)


def _xor(b: bytes | bytearray) -> int:
    x = 0
    for c in b:
        x ^= c
    return x


def sealed(data: bytes) -> bytes:
    """A synth() log made version 2: byte 62 of every written slot and byte 60
    of the header set so that each one's bytes XOR to zero (docs/LOG_FORMAT.md)."""
    out = bytearray(data)
    out[8:12] = struct.pack("<I", 2)
    out[60] = 0
    out[60] = _xor(out[:128])
    for off in range(128, len(out) - 63, 64):
        if out[off + 63]:
            out[off + 62] = 0
            out[off + 62] = _xor(out[off:off + 64])
    return bytes(out)


def flipped(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def changed_silently(original: talog.Log, damaged: talog.Log) -> bool:
    """Whether a decoded record differs from the original record of its sequence number."""
    by_seq = {int(s): i for i, s in enumerate(original.records["seq"].tolist())}
    for rec in damaged.records:
        i = by_seq.get(int(rec["seq"]))
        if i is None or original.records[i].tobytes() != rec.tobytes():
            return True
    return False


def test_a_sealed_synthetic_log_decodes_cleanly() -> None:
    log = read_log(sealed(synth(10)))
    assert log.header.version == 2 and log.header.checksum_ok and log.damage == []
    assert len(log) == 22 and log.complete and log.strings == {1: "fwd"}


def test_every_single_bit_flip_is_caught_and_no_record_changes() -> None:
    data = sealed(synth(20))
    original = read_log(data)
    rng = random.Random(15)
    bits = rng.sample(range(len(data) * 8), 3000)
    for bit in bits:
        try:
            log = read_log(flipped(data, bit))
        except LogFormatError:
            continue  # magic, version, sizes, byte order: refused outright
        assert log.damage, f"bit {bit} (byte {bit // 8}) flipped and nothing was said"
        assert not changed_silently(original, log), f"bit {bit}: a record decoded with different values"


def test_a_dropped_record_is_named_and_the_rest_stand() -> None:
    data = sealed(synth(50))
    bad = 128 + 64 * 30
    log = read_log(flipped(data, bad * 8 + 24 * 8 + 3))  # a bit of record 30's size
    assert len(log) == 102 - 1 and 30 not in log.records["seq"].tolist()
    assert 31 in log.records["seq"].tolist() and log.complete  # the records after it stand
    assert log.damage == [f"<bytes>: 1 record failed the checksum (bytes changed after they were written: a disk "
                          f"or copy error) and were dropped, at byte offset {bad}"]
    header = read_log(flipped(data, 56 * 8))  # the header's status
    assert not header.header.checksum_ok and "header failed its checksum" in header.damage[0]


def test_version_1_logs_still_decode() -> None:
    log = read_log(synth(10))
    assert log.header.version == 1 and log.damage == [] and len(log) == 22
    bundled = read_log(BUNDLED)
    assert bundled.header.version == 1 and bundled.damage == [] and bundled.complete
    assert bundled.writer == talog.WRITER_CLOSED and len(bundled.strings) > 0


def test_the_reader_refuses_what_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match="is a directory"):
        read_log(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(LogFormatError, match="is a FIFO"):
        read_log(fifo)  # reading one would wait forever


# ---------------------------------------------------------------------------
# Logs written by the C library in a child process
# ---------------------------------------------------------------------------


def _child(library_path: Path, log: Path, body: str, *, torch: bool = False) -> subprocess.Popen[str]:
    script = textwrap.dedent(f"""
        import ctypes, sys, time
        {"import torch" if torch else ""}
        lib = ctypes.CDLL({str(library_path)!r})
        lib.torchalloc_malloc.restype = ctypes.c_void_p
        lib.torchalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.torchalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        assert lib.torchalloc_init(b"backend:sim,warn:0,oom_report:off,log:{log},stacks:1") == 0
        lib.torchalloc_phase_begin(b"forward")
        kept = [lib.torchalloc_malloc(4096, 0, None) for _ in range(100)]
        for p in kept[50:]:
            lib.torchalloc_free(p, 4096, 0, None)
        lib.torchalloc_mark(b"step 1")
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("with_torch", [False, True])
def test_a_normal_exit_closes_the_log(library_path: Path, tmp_path: Path, with_torch: bool) -> None:
    if with_torch:
        pytest.importorskip("torch")  # libtorch's own exit-time destructors run beside ours
    path = tmp_path / "exit.talog"
    child = _child(library_path, path, "sys.exit(0)  # no teardown, blocks and a phase still open\n",
                   torch=with_torch)
    assert child.wait() == 0
    log = read_log(path)
    assert log.header.status == talog.STATUS_CLOSED and log.complete and log.writer == talog.WRITER_CLOSED
    assert log.damage == []
    assert path.stat().st_size == log.header.end_offset < (1 << 20)  # the 16 MiB preallocation trimmed
    assert int((log.records["kind"] == talog.ALLOC).sum()) == 100


def test_running_then_killed(library_path: Path, tmp_path: Path) -> None:
    from torchalloc.analysis import analyze

    path = tmp_path / "live.talog"
    child = _child(library_path, path, 'print("ready", flush=True)\ntime.sleep(60)\n')
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        live = read_log(path)
        assert live.writer == talog.WRITER_RUNNING and live.header.pid == child.pid
        assert any(f"still being written (process {child.pid} holds it)" in n for n in analyze(path).notes)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    dead = read_log(path)
    assert dead.writer == talog.WRITER_KILLED and not dead.complete
    assert int((dead.records["kind"] == talog.ALLOC).sum()) == 100
    assert any(f"its writer (process {child.pid}) was killed" in n for n in analyze(path).notes)
    copy = read_log(path.read_bytes())  # bytes have no lock to ask
    assert copy.writer == talog.WRITER_UNKNOWN


def _closed_log(library_path: Path, tmp_path: Path) -> Path:
    path = tmp_path / "run.talog"
    assert _child(library_path, path, "sys.exit(0)\n").wait() == 0
    return path


def test_bit_flips_in_a_real_log_are_caught(library_path: Path, tmp_path: Path) -> None:
    data = _closed_log(library_path, tmp_path).read_bytes()
    original = read_log(data)
    assert original.header.version == talog.VERSION and original.damage == []
    rng = random.Random(1500)
    for bit in rng.sample(range(len(data) * 8), 500):
        try:
            log = read_log(flipped(data, bit))
        except LogFormatError:
            continue
        assert log.damage, f"bit {bit} flipped and nothing was said"
        assert not changed_silently(original, log), f"bit {bit}: a record decoded with different values"


def test_the_report_prints_damage_as_its_own_notes(library_path: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = _closed_log(library_path, tmp_path)
    log = read_log(path)
    alloc = int(np.flatnonzero(log.records["kind"] == talog.ALLOC)[10])
    offset = 128 + 64 * int(log.records["seq"][alloc])
    data = bytearray(path.read_bytes())
    data[offset + 24] ^= 0x40  # the size of one alloc record
    path.write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Python warning, with its source line, on the way
        assert report_cli.main([str(path)]) == 0
    out = capsys.readouterr()
    said = " ".join(out.out.split())  # the text wraps its lines to the terminal's width
    assert f"note: {path}: 1 record failed the checksum" in said and f"byte offset {offset}" in said
    assert out.err == ""
    assert report_cli.main([str(path), "--json"]) == 0
    out = capsys.readouterr()
    assert any("failed the checksum" in n for n in json.loads(out.out)["notes"])
    assert f"torchalloc report: note: {path}: 1 record failed the checksum" in out.err


def test_wall_time_survives_absurd_header_clocks() -> None:
    """The header's clocks are u64: a damaged pair once made wall_time_ns() raise OverflowError (found by
    fuzz_log_decode). The offset is added modulo 2**64, as C would; a sane header gives the plain sum."""
    import dataclasses

    log = read_log(REPO / "tests" / "fuzz" / "corpus" / "decoder" / "closed-stacks")
    h = log.header
    expected = log.records["time_ns"].astype(np.int64) + (h.created_realtime_ns - h.created_monotonic_ns)
    assert np.array_equal(log.wall_time_ns(), expected)
    for realtime, monotonic in ((2**64 - 1, 0), (0, 2**64 - 1), (2**63, 2**63 - 1)):
        log.header = dataclasses.replace(h, created_realtime_ns=realtime, created_monotonic_ns=monotonic)
        got = log.wall_time_ns()
        offset = (realtime - monotonic) % (1 << 64)
        want = [((int(t) + offset) % (1 << 64)) for t in log.records["time_ns"][:3]]
        assert [int(x) % (1 << 64) for x in got[:3]] == want
