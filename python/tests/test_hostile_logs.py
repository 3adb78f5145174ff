"""Hand-made logs whose checksums hold but whose records no torchalloc writer produces (issue 23, finding 5).

`report` and `export` drop each impossible record with a note naming it
(sequence number, byte offset) and why, and report what the rest of the log
says; `replay` refuses the log, naming the first such record. Never a wrong
headline, an int64 overflow or an exception from deep in the analysis.
The shapes are in hostile_logs.py (also the seeds of the log fuzzer).
"""
from __future__ import annotations

import json
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_logs as H  # noqa: E402
from cli_in_process import cli  # noqa: E402

MiB = 1 << 20

# shape -> (peak allocated the sane records give, what the note says, the records it names)
EXPECTED = {
    "two-allocs-of-2-63": (4 * MiB, "a block of more than 1099509530624 bytes requested", [5, 6]),
    "three-allocs-of-2-62": (4 * MiB, "a block of more than 1099509530624 bytes requested", [5, 6, 7]),
    "huge-segments": (4 * MiB, "a segment of more than 1099511627776 bytes", [5, 6]),
    "oom-of-2-62": (4 * MiB, "an OOM asking for more than 1099509530624 bytes", [5]),
    "device-of-2-62": (4 * MiB, "a device record with more than 1125899906842624 bytes", [5]),
    "repeated-phase-start": (5 * MiB, "a phase occurrence begun a second time", [5]),
    "phase-end-without-begin": (5 * MiB, "a phase end with no open occurrence", [6]),
    "block-record-without-device": (4 * MiB, "a block, segment, OOM or device record about no device", [5]),
    "phase-id-out-of-range": (4 * MiB, "a phase id above 255", [5]),
}




@pytest.fixture(autouse=True)
def _lines_long_enough_for_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The notes and the job report's rank lines name the log by its path, and the text wraps at $COLUMNS
    (else 100), inside a long word if it must: wide enough that no temporary folder's path is cut (under
    pytest-xdist they are 10 characters longer, and some were)."""
    monkeypatch.setenv("COLUMNS", "400")


def named(records: list[int]) -> str:
    return ", ".join(f"record {s} (byte offset {128 + 64 * s})" for s in records)


@pytest.fixture(params=["one piece", "in pieces"])
def pieces(request, monkeypatch) -> bool:
    """Each tool on the log read in one piece, and in pieces of 3 records (log/chunks.py), so that a phase
    occurrence begins in one and ends in another: the same records dropped, the same notes, the same refusal."""
    if request.param == "in pieces":
        from torchalloc.log import chunks

        real = chunks.ChunkedLog.__init__

        def in_pieces_of_3(self, source, chunk_records=0, *rest, **kw):  # type: ignore[no-untyped-def]
            real(self, source, 3, *rest, **kw)

        monkeypatch.setattr(chunks.ChunkedLog, "__init__", in_pieces_of_3)
    return request.param == "in pieces"


@pytest.fixture
def write(tmp_path: Path):
    def _write(shape: str) -> Path:
        path = tmp_path / f"{shape}.talog"
        path.write_bytes(H.HOSTILE[shape]())
        return path
    return _write


def test_the_shapes_decode_with_valid_checksums() -> None:
    from torchalloc.log import read_log

    for shape, make in H.HOSTILE.items():
        log = read_log(make())
        assert log.damage == [] and log.complete and log.header.checksum_ok, shape


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_report_drops_the_record_and_names_it(shape: str, write, pieces: bool) -> None:
    peak, why, records = EXPECTED[shape]
    path = write(shape)
    status, out, err = cli("report", str(path))
    assert status == 0, err
    assert f"peak allocated {peak // MiB}.0 MiB" in out
    notes = [" ".join(n.split()) for n in re.findall(r"^note:.*(?:\n  .*)*", out, re.M)]  # each unwrapped
    note = next(n for n in notes if "impossible record" in n)
    assert why in note and named(records) in note and str(path) in note
    status, out, err = cli("report", str(path), "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["peak_allocated"] == peak and doc["peak_anatomy"]["allocated"] == peak
    assert 0 < doc["peak_reserved"] < 1 << 40
    assert any(why in n and named(records) in n for n in doc["notes"])
    assert why in err  # the note goes to stderr too, where the user looks


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_export_drops_the_record_and_names_it(shape: str, write, tmp_path: Path, pieces: bool) -> None:
    _, why, _ = EXPECTED[shape]
    snap = tmp_path / "snap.pickle"
    status, out, err = cli("export", str(write(shape)), "-o", str(snap))
    assert status == 0, err
    assert why in err
    doc = pickle.loads(snap.read_bytes())
    sizes = [e["size"] for trace in doc["device_traces"] for e in trace] + [s["total_size"] for s in doc["segments"]]
    assert sizes and max(sizes) < 1 << 40


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_replay_refuses_naming_the_record(shape: str, write, library_path: Path, pieces: bool) -> None:
    _, why, records = EXPECTED[shape]
    status, out, err = cli("replay", str(write(shape)), "--no-search")
    assert status != 0 and out == ""
    assert why in err and f"record {records[0]} (byte offset {128 + 64 * records[0]})" in err
    assert "internal error" not in err


def test_a_job_report_shows_the_hostile_ranks_true_peak(write) -> None:
    sane, hostile = write("control-characters"), write("three-allocs-of-2-62")
    status, out, err = cli("report", str(sane), str(hostile))
    assert status == 0, err
    assert f"rank 1: {hostile}" in out.splitlines()
    row = next(line for line in out.splitlines() if line.lstrip().startswith("1 "))
    assert re.search(r"\b4\.0 MiB\b.*\b20\.0 MiB\b", row), row
    assert "-" not in row.split()[3] and "KiB" not in row
    status, out, err = cli("report", str(sane), str(hostile), "--json")
    assert status == 0, err
    ranks = json.loads(out)["ranks"]
    assert [r["peak_allocated"] for r in ranks] == [4 * MiB, 4 * MiB]


def test_the_checker_names_each_record_once() -> None:
    """A record with two problems is named for the first; the count per problem is exact."""
    from torchalloc.log import read_log
    from torchalloc.log.checks import impossible

    b = H.LogBuilder()
    b.alloc(0x1000, 1 << 63, 1 << 63, device=-1)  # about no device, and too large
    b.alloc(0x2000, 1 << 62, 1 << 62)
    b.alloc(0x3000, 512)
    log = read_log(b.to_bytes())
    bad, notes = impossible(log.records)
    assert bad.tolist() == [True, True, False, False]  # the END record stands
    assert len(notes) == 2 and notes[0].startswith("1 impossible record (a block, segment, OOM or device record about no")
    assert notes[1].startswith("1 impossible record (a block of more than") and "record 1 " in notes[1]


def test_sane_logs_lose_nothing() -> None:
    from torchalloc.log import read_log
    from torchalloc.log.checks import impossible

    b = H.LogBuilder()
    b.begin("forward")
    b.alloc(0x1000, H.MAX_REQUEST, H.MAX_REQUEST)
    b.segment(0x1000, 1 << 40)
    b.end("forward")
    b.begin("forward")  # occurrence 2
    b.oom(H.MAX_REQUEST, 1 << 41)
    b.end("forward")
    bad, notes = impossible(read_log(b.to_bytes()).records)
    assert not bad.any() and notes == []
    assert impossible(np.zeros(0, dtype=read_log(b.to_bytes()).records.dtype))[1] == []


def test_blocks_adding_up_past_64_bit_sums_are_refused_clearly(write, tmp_path: Path, monkeypatch, pieces: bool
                                                                ) -> None:
    """No single record is to blame when millions of 1 TiB blocks add up past 2^62: the log is refused.
    (Shown with the bound lowered: the real one needs a 256 MB log.)"""
    from torchalloc.log import checks as log_checks

    monkeypatch.setattr(log_checks, "MAX_SUM", 6 * MiB)
    path = write("repeated-phase-start")  # 4 MiB and 1 MiB blocks, a 20 MiB segment
    for verb in (("report",), ("report", "--json"), ("export", "-o", str(tmp_path / "s.pickle")), ("replay",)):
        status, out, err = cli(verb[0], str(path), *verb[1:])
        assert status != 0 and "add up to" in err and str(path) in err and "internal error" not in err, verb


def test_export_of_one_log_without_rank_says_nothing_about_ranks(write, tmp_path: Path) -> None:
    status, out, err = cli("export", str(write("control-characters")), "-o", str(tmp_path / "s.pickle"))
    assert status == 0 and "$RANK" not in err and "numbered" not in err, err


def test_an_oom_after_a_block_at_the_top_of_the_address_space(write, library_path: Path, pieces: bool) -> None:
    """Addresses are whatever the device gave: any 64-bit value is possible, so nothing is dropped, and the
    OOM's replay picks an address for the failed request that no block uses."""
    from torchalloc.replay.oom_alternatives import _unused_address

    status, out, err = cli("report", str(write("address-at-the-top")), "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["peak_allocated"] == 4 * MiB + 512 and len(doc["ooms"]) == 1 and doc["ooms"][0]["alternatives"]
    top = (1 << 64) - 4096
    assert _unused_address(np.array([1 << 30, top], dtype=np.uint64)) == (1 << 30) - (1 << 20)
    assert _unused_address(np.array([0, 1 << 30, top], dtype=np.uint64)) == 1 << 20


def test_oom_detail_takes_segments_in_the_top_half_of_the_address_space() -> None:
    """Found by fuzz_log_decode: a damaged log's segment at 2^63 or above overflowed int64 in the advice's figures."""
    from torchalloc.analysis.sections.ooms.diagnosis import oom_detail

    top = (1 << 63) + (1 << 21)
    detail = oom_detail({top: 4 << 20}, [top + 4096], [1 << 20], [0], 0, "caching", 0, 2 << 20)
    assert detail["pinned_segments"] == 1 and detail["pinning"] == 1 << 20
