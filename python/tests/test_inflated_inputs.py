"""Inflated inputs cost what they describe (issue 47).

A compressed file is small; what it inflates to, and what the unpickler makes of a snapshot, is not. Each shape
here cost gigabytes from kilobytes before (figures in docs/RELIABILITY.md); each is now refused at once, with
one line saying why, in bounded memory:

- an xz stream declaring a 3 GiB dictionary (the decoder reserves and fills it): the decoder's memory is capped;
- a snapshot whose segments name one block dict thousands of times: refused as shared segments are;
- memo indices out of order (a compressed pickle has bytes to spare for the old "below the bytes before it"
  rule), one huge bytes object, and a pickle inflating past MAX_INFLATION times its compressed size.
"""
from __future__ import annotations

import lzma
import pickle
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_logs as H  # noqa: E402
from cli_in_process import cli  # noqa: E402

from torchalloc.log import trace  # noqa: E402
from torchalloc.log.trace import TraceError  # noqa: E402
from torchalloc.log.trace_snapshot import INFLATED_FLOOR, MAX_ARGUMENT  # noqa: E402

GiB = 1 << 30


def _declare_dictionary(xz: bytes, code: int) -> bytes:
    """`xz` (one stream from lzma.compress) with its first block's LZMA2 dictionary size byte set to `code`
    (39: 3 GiB), the block header's CRC32 sealed again. Nothing else changes: the data still decodes."""
    start = 12  # after the stream header
    size = (xz[start] + 1) * 4
    header = bytearray(xz[start:start + size])
    flags, at = header[1], 2
    for present in (0x40, 0x80):  # compressed and uncompressed sizes, as varints
        if flags & present:
            while header[at] & 0x80:
                at += 1
            at += 1
    assert header[at] == 0x21 and header[at + 1] == 1, "the first filter is LZMA2 with one byte of properties"
    header[at + 2] = code
    header[-4:] = struct.pack("<I", zlib.crc32(bytes(header[:-4])))
    return xz[:start] + bytes(header) + xz[start + size:]


def _small_log() -> bytes:
    b = H.LogBuilder()
    H._base(b)
    return b.to_bytes()


def _snapshot(**extra: Any) -> dict[str, Any]:
    return {"device_traces": [[{"action": "alloc", "addr": 4096, "size": 512, "stream": 0}]], "segments": [],
            **extra}


@pytest.mark.parametrize("verb", [["report"], ["replay"], ["export", "-o", "OUT"], ["top", "--once"]])
def test_an_xz_declaring_a_3_gib_dictionary_is_refused_at_once(tmp_path: Path, verb: list[str]) -> None:
    path = tmp_path / "run.talog.xz"
    path.write_bytes(_declare_dictionary(lzma.compress(_small_log()), 39))
    args = [str(tmp_path / "out.pickle") if word == "OUT" else word for word in verb]
    status, out, err = cli(*args, str(path))
    assert status == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "the xz stream needs more than 256 MiB of memory to inflate" in lines[0], err


def test_an_xz_snapshot_declaring_a_3_gib_dictionary_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle.xz"
    path.write_bytes(_declare_dictionary(lzma.compress(pickle.dumps(_snapshot())), 39))
    with pytest.raises(TraceError, match="needs more than 256 MiB of memory to inflate"):
        trace.load_trace(path)


def test_an_xz_of_an_ordinary_dictionary_still_reads(tmp_path: Path) -> None:
    """64 MiB, xz -9's dictionary (the same data, its header saying so): read as before."""
    path = tmp_path / "run.talog.xz"
    path.write_bytes(_declare_dictionary(lzma.compress(_small_log()), 26))  # (2 | 0) << (13 + 11): 64 MiB
    status, out, err = cli("report", str(path))
    assert status == 0 and "Peak: 4.0 MiB allocated" in out, err


def test_one_block_dict_named_by_every_block_is_refused(tmp_path: Path) -> None:
    """200 segments each naming one block dict 200 times (the issue's 4,000 x 4,000 in 7.6 KB of xz was 16
    million blocks, 3.49 GB and 22 s): refused at its second reference."""
    block = {"size": 512, "requested_size": 512, "state": "active_allocated", "frames": []}
    snapshot = _snapshot(segments=[{"device": 0, "address": i << 32, "total_size": 512 * 200, "stream": 0,
                                    "blocks": [block] * 200} for i in range(200)])
    path = tmp_path / "blocks.pickle.xz"
    path.write_bytes(lzma.compress(pickle.dumps(snapshot)))
    with pytest.raises(TraceError, match=r"segments\[0\]\.blocks\[1\] is segments\[0\]\.blocks\[0\] again "
                                         r"\(a shared reference in the pickle\)"):
        trace.load_trace(path)


def _padded(pickle_body: bytes, pad_ops: int) -> bytes:
    """PROTO 2, `pad_ops` NONE-POP pairs (2 bytes each, nothing kept), then `pickle_body`."""
    return b"\x80\x02" + b"N0" * pad_ops + pickle_body


def test_a_memo_index_out_of_order_is_refused_though_below_the_bytes_before_it(tmp_path: Path) -> None:
    """2 MiB of padding, then an empty dict stored as object 2^20: allowed by the old rule (an index below the
    bytes before it), it grew the unpickler's memo to 2^21 entries (4.24 GB from 39 KB of xz at 2^28)."""
    data = _padded(b"}r" + (1 << 20).to_bytes(4, "little") + b".", 1 << 20)
    path = tmp_path / "memo.pickle.xz"
    path.write_bytes(lzma.compress(data))
    with pytest.raises(TraceError, match=r"it stores object 1048576 at byte \d+: no pickler numbers objects out "
                                         r"of order \(the next is 0\)"):
        trace.load_trace(path)


def test_a_bytes_object_longer_than_any_snapshot_holds_is_refused(tmp_path: Path) -> None:
    """One bytes object of 2 MiB in an otherwise good snapshot (the issue's 3 GiB one in 469 KB of xz cost
    6.35 GB): refused before the unpickler reserves it."""
    path = tmp_path / "bytes.pickle.xz"
    path.write_bytes(lzma.compress(pickle.dumps(_snapshot(blob=bytes(MAX_ARGUMENT + 1)), protocol=4)))
    with pytest.raises(TraceError, match=rf"a string, bytes or frame of {MAX_ARGUMENT + 1} bytes at byte \d+: no "
                                         rf"memory snapshot holds one longer than {MAX_ARGUMENT} bytes"):
        trace.load_trace(path)
    status, out, err = cli("replay", str(path))
    assert status == 2 and len(err.strip().splitlines()) == 1, err


def test_a_compressed_pickle_inflating_past_its_bound_is_refused(tmp_path: Path) -> None:
    """A small xz whose pickle is padding past INFLATED_FLOOR (here over a thousand times the file)."""
    data = _padded(pickle.dumps(_snapshot(), protocol=2)[2:], INFLATED_FLOOR // 2 + 1)
    path = tmp_path / "padded.pickle.xz"
    path.write_bytes(lzma.compress(data, preset=1))
    assert path.stat().st_size * 1000 < INFLATED_FLOOR < len(data)
    with pytest.raises(TraceError, match=rf"it inflates to more than {INFLATED_FLOOR} bytes, 1000 times its "
                                         "compressed size: beyond any snapshot"):
        trace.load_trace(path)


def test_the_bundled_snapshot_is_within_every_bound() -> None:
    """PyTorch's own snapshot (7.6 MB of pickle in 0.9 MB of xz) loads: the bounds leave real ones alone."""
    bundled = Path(trace.__file__).resolve().parents[1] / "data" / "default_trace.pickle.xz"
    assert len(trace.load_trace(bundled)) > 0
