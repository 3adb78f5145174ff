"""`torchalloc top` checks what it shows as `report` does (issue 47).

top read every record whose checksum held: hand-made records showed "allocated -4294967296.0 GiB", two
2^63-byte blocks as 0 B, "reserved -8589934592.0 GiB"; a header clock or a record time at or past 2^63 ns
ended it with an internal error (Sparkline.add). Now its reader applies log/checks.py, the one set of record
checks every reader uses: what report drops, top drops, and its frame says how many.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_logs as H  # noqa: E402
from cli_in_process import cli  # noqa: E402

from torchalloc.cli.top_reader import LiveReader  # noqa: E402
from torchalloc.cli.top_state import LiveState  # noqa: E402
from torchalloc.log.checks import impossible  # noqa: E402
from torchalloc.log.reader import read_log  # noqa: E402

MiB = 1 << 20


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / f"{name}.talog"
    path.write_bytes(data)
    return path


def _top(path: Path) -> str:
    status, out, err = cli("top", "--once", str(path))
    assert status == 0 and err == "", err
    return out


def _state(path: Path) -> LiveState:
    state = LiveState(LiveReader(str(path)))
    state.refresh()
    return state


@pytest.mark.parametrize("name", sorted(H.HOSTILE))
def test_top_drops_what_report_drops(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, name, H.HOSTILE[name]())
    bad, notes = impossible(read_log(path).records)
    state = _state(path)
    assert state.reader.impossible == int(bad.sum())
    assert state.reader.impossible_notes() == notes
    if bad.any():
        n = int(bad.sum())
        assert f"dropped {n} impossible record{'s' if n > 1 else ''}" in _top(path)


@pytest.mark.parametrize(("name", "allocated", "reserved"), [
    ("two-allocs-of-2-63", 4 * MiB, 20 * MiB), ("three-allocs-of-2-62", 4 * MiB, 20 * MiB),
    ("huge-segments", 4 * MiB, 20 * MiB)])
def test_top_shows_the_sane_records_levels(tmp_path: Path, name: str, allocated: int, reserved: int) -> None:
    state = _state(_write(tmp_path, name, H.HOSTILE[name]()))
    assert (state.allocated, state.reserved) == (allocated, reserved)
    assert (state.peak_allocated, state.peak_reserved) == (allocated, reserved)
    out = _top(tmp_path / f"{name}.talog")
    assert "allocated 4.0 MiB (peak 4.0 MiB" in out and "reserved 20.0 MiB (peak 20.0 MiB" in out, out
    assert "-" not in out.split("\n")[1], out  # no negative level


def _header_clock(data: bytes, monotonic_ns: int) -> bytes:
    """`data` (a LogBuilder log) with its header's CLOCK_MONOTONIC changed, the header's checksum sealed again."""
    header = bytearray(data[:H.HEADER_SIZE])
    header[32:40] = struct.pack("<Q", monotonic_ns)
    header[60] = 0
    header[60] = H._xor(header)
    return bytes(header) + data[H.HEADER_SIZE:]


@pytest.mark.parametrize("clock", [(1 << 63) + 10, (1 << 64) - 1, 1 << 62])
def test_a_header_clock_that_is_not_the_records_is_not_time_zero(tmp_path: Path, clock: int) -> None:
    b = H.LogBuilder()
    H._base(b)
    path = _write(tmp_path, "clock", _header_clock(b.to_bytes(), clock))
    out = _top(path)
    assert "allocated 4.0 MiB (peak 4.0 MiB at t=0.000 s)" in out, out
    assert "t=-" not in out


def test_a_record_time_past_2_63_is_dropped(tmp_path: Path) -> None:
    b = H.LogBuilder()
    H._base(b)
    b.alloc(0x9000_0000, MiB, time_ns=(1 << 63) + 5)
    path = _write(tmp_path, "late", b.to_bytes())
    out = _top(path)
    assert "allocated 4.0 MiB" in out and "dropped 1 impossible record:" in out, out
    bad, notes = impossible(read_log(path).records)  # report drops it too, with the reason
    assert int(bad.sum()) == 1 and "a time at or past 2^63 ns" in notes[0]
    status, out, err = cli("report", str(path))
    assert status == 0 and "a time at or past 2^63 ns" in err + out


def test_blocks_adding_up_past_2_62_end_top_with_one_line(tmp_path: Path) -> None:
    b = H.LogBuilder()
    H._base(b)
    for k in range(5):  # each sane (1 TiB), together past the 2^62 bytes int64 levels hold, once the bound is low
        b.alloc(0x1_0000_0000 * (k + 1), H.MAX_REQUEST)
    path = _write(tmp_path, "sum", b.to_bytes())
    import torchalloc.log.checks as checks

    saved = checks.MAX_SUM
    checks.MAX_SUM = 3 << 40
    try:
        status, out, err = cli("top", "--once", str(path))
    finally:
        checks.MAX_SUM = saved
    assert status == 2 and out == "" and "add up to" in err and len(err.strip().splitlines()) == 1, err
