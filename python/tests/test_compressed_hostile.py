"""A small compressed log that inflates to far more than it holds (issue 36, finding A).

312 KB of xz held a header, one record and 2 GiB of zero slots; `report`,
`replay` and `export` each inflated it whole and reached 4.3 GB resident,
because whether to read a log in pieces was decided by its compressed size.
Now a compressed file is inflated a piece at a time, the tools read every
log in pieces (log/chunks.py), and a log decoded whole (read_log) keeps
none of the zeros it ends with (log/files.py, _compressed.py). The
memory each tool takes is measured with tracemalloc (numpy's buffers are
traced too): it must stay far below what the file inflates to.
"""
from __future__ import annotations

import io
import lzma
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_logs import LogBuilder  # noqa: E402

from torchalloc.log import read_log  # noqa: E402
from torchalloc.log.reader import read_header  # noqa: E402
from cli_in_process import cli  # noqa: E402

MiB = 1 << 20
ZEROS = 128 * MiB  # eight of the tools' pieces of 16 MiB
# The most a tool may hold for that log, as tracemalloc counts it: read_log, its two records and the
# decompressor's buffers; the tools, reading in pieces, one piece of 16 MiB (DEFAULT_CHUNK_RECORDS) and what is
# computed from it (about 70 MiB, whatever the log's size). Inflated whole, as before issue 36, it held 128 MiB
# and more.
WHOLE_BOUND, PIECES_BOUND = 16 * MiB, 96 * MiB


def _log_head() -> bytes:
    """A log whose writer was killed (status open): a segment and a 4 MiB block, then (appended) its zeros."""
    b = LogBuilder()
    b.segment(0x7000_0000, 20 * MiB)
    b.alloc(0x7000_0000, 4 * MiB)
    return b.to_bytes(closed=False)


def _packed(head: bytes, zeros: int, compressor: Any) -> bytes:
    """`head` and `zeros` zero bytes, compressed a piece at a time (the test never holds the zeros whole)."""
    piece = bytes(8 * MiB)
    out = [compressor.compress(head)]
    for _ in range(zeros // len(piece)):
        out.append(compressor.compress(piece))
    out.append(compressor.flush())
    return b"".join(out)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "killed.talog.xz"
    path.write_bytes(_packed(_log_head(), ZEROS, lzma.LZMACompressor(preset=0)))
    assert path.stat().st_size < 64 << 10  # a small file ...
    return path


def _peak(work: Callable[[], Any]) -> tuple[Any, int]:
    """What `work` returns, and the most memory it held at once (bytes, as tracemalloc counts them)."""
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()




def test_the_log_decodes_whole_without_its_zeros(bomb: Path) -> None:
    log, peak = _peak(lambda: read_log(bomb))
    assert peak < WHOLE_BOUND, f"read_log held {peak / MiB:.0f} MiB for a log of two records"
    plain = read_log(_log_head())
    assert np.array_equal(log.records, plain.records) and len(log.records) == 2
    assert log.damage == plain.damage == [] and log.writer == "unknown"
    header, peak = _peak(lambda: read_header(bomb))  # only the header is inflated
    assert peak < 8 * MiB and header.status == 0


def test_report_stays_bounded(bomb: Path) -> None:
    (status, out, err), peak = _peak(lambda: cli("report", str(bomb)))
    assert status == 0, err
    assert "peak allocated 4.0 MiB" in out and peak < PIECES_BOUND, f"report held {peak / MiB:.0f} MiB"


def test_export_and_replay_stay_bounded(bomb: Path, tmp_path: Path) -> None:
    snapshot = tmp_path / "snap.pickle"
    (status, out, err), peak = _peak(lambda: cli("export", str(bomb), "-o", str(snapshot)))
    assert status == 0, err
    assert "2 trace entries" in out + err and peak < PIECES_BOUND, f"export held {peak / MiB:.0f} MiB"
    from torchalloc.log.trace import load_trace

    trace, peak = _peak(lambda: load_trace(bomb))  # what replay reads: in pieces, whatever the size
    assert len(trace) == 1 and peak < PIECES_BOUND, f"replay's trace held {peak / MiB:.0f} MiB"


@pytest.mark.parametrize("compress", ["xz", "gzip"])
def test_compressed_logs_decode_as_the_plain_file(compress: str, tmp_path: Path) -> None:
    """Zeros between records stay (incomplete records, noted); zeros at the end go; the notes about the end
    (a partial record, an end offset past the file's end, bytes past it) are what the plain file gives."""
    b = LogBuilder()
    b.segment(0x7000_0000, 20 * MiB)
    b.alloc(0x7000_0000, 4 * MiB)
    b.free(0x7000_0000, 4 * MiB)
    closed, head = b.to_bytes(), b.to_bytes(closed=False)
    torn = head[:128 + 64] + bytes(64) + head[128 + 128:]  # record 1 never completed
    partial = head + b"\x07" + bytes(30)  # the file ends inside a record
    cut = bytearray(closed[:-64])  # the header says the writer wrote one slot more
    past_end = closed + b"\x01" * 64 + bytes(3 * MiB)  # bytes after the declared end, then zeros
    cases = {"zeros at the end": head + bytes(3 * MiB + 5), "torn, then zeros": torn + bytes(MiB),
             "partial": partial, "cut": bytes(cut), "past the end": past_end, "header only": head[:128],
             "nothing but zeros after the magic": head[:8] + bytes(2 * MiB)}
    for name, data in cases.items():
        path = tmp_path / f"case.talog.{compress}"
        packer = lzma.LZMACompressor(preset=0) if compress == "xz" else zlib.compressobj(1, wbits=31)
        path.write_bytes(_packed(data, 0, packer))
        try:
            want = read_log(data)
        except Exception as e:  # noqa: BLE001 -- the compressed file must be refused the same way
            with pytest.raises(type(e), match="not a torchalloc log|cut short|version"):
                read_log(path)
            continue
        got = read_log(path)
        assert np.array_equal(got.records, want.records), name
        assert [d.replace(str(path), "<bytes>") for d in got.damage] == want.damage, name
        assert (got.truncated, got.complete) == (want.truncated, want.complete), name


def test_a_cut_bomb_is_one_clear_line(bomb: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.talog.xz"
    cut.write_bytes(bomb.read_bytes()[: bomb.stat().st_size // 2])
    for verb in ("report", "replay"):
        status, out, err = cli(verb, str(cut))
        assert status == 2 and "truncated or corrupt compressed file" in err, (verb, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_trimmed_reading_keeps_interior_zeros() -> None:
    """read_trimmed drops only the zeros the stream ends with, across piece boundaries."""
    from torchalloc._compressed import read_trimmed

    data = b"\x01" + bytes(3 * MiB) + b"\x02" + bytes(2 * MiB + 3)
    kept, total = read_trimmed(io.BytesIO(data), keep_at_least=16, pad=63)
    assert total == len(data) and bytes(kept) == data[: 3 * MiB + 2 + 63]
    kept, total = read_trimmed(io.BytesIO(bytes(100)), keep_at_least=16)
    assert (bytes(kept), total) == (bytes(16), 100)
    kept, total = read_trimmed(io.BytesIO(b""))
    assert (bytes(kept), total) == (b"", 0)
