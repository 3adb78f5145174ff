"""The tools' command lines say what is wrong and what would be right (issue 23, findings 9 and 10).

`report --at` names a moment of the log or fails saying which: nan and inf
were accepted ("At t=nans"), and times outside the log were clamped silently
to its first or last event. A negative value of an option reached argparse
as an option of its own ("expected one argument"). A mistyped command got
no suggestion, an integer out of range in TORCHALLOC_CONF no range, and one
device was "1 devices".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_logs as H  # noqa: E402
from cli_in_process import cli  # noqa: E402




@pytest.fixture
def log(tmp_path: Path) -> Path:
    b = H.LogBuilder()  # records 1 µs apart: the last, END, at t=5 µs
    b.segment(0x1000, 20 << 20)
    b.alloc(0x1000, 1 << 20)
    b.mark("after alloc")
    b.alloc(0x2000, 1 << 20)
    path = tmp_path / "run.talog"
    path.write_bytes(b.to_bytes())
    return path


def test_at_value_parses_times_and_labels() -> None:
    from torchalloc.cli.args import at_value

    assert at_value("1.5") == 1.5 and at_value("0") == 0.0 and at_value("1e-6") == 1e-6
    assert at_value("1.5s") == "1.5s"  # a marker may be named so; the analysis reads it as 1.5 s otherwise
    assert at_value("after forward") == "after forward"
    for bad in ("nan", "inf", "-inf", "NaN", "infs", "nans"):
        with pytest.raises(ValueError, match="not a time"):
            at_value(bad)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "nans"])
def test_report_refuses_nan_and_inf(log: Path, value: str) -> None:
    status, out, err = cli("report", str(log), f"--at={value}")
    assert status == 2 and out == "" and "not a time" in err and "t=nan" not in err


@pytest.mark.parametrize("value", ["-1", "1e-5", "1e9", "-0.5s"])
def test_report_refuses_times_outside_the_log_naming_its_range(log: Path, value: str) -> None:
    status, out, err = cli("report", str(log), "--at", value)
    assert status == 2 and out == ""
    assert "is not in this log: it covers t=0 s to t=5e-06 s" in err


def test_times_inside_the_log_and_markers_still_work(log: Path) -> None:
    for value, moment in (("0", "At t=0s"), ("2.5e-6", "At t=2.5e-06s"), ("5e-6", "At t=5e-06s"),
                          ("3e-6s", "At t=3e-06s"), ("after alloc", "At marker 'after alloc'")):
        status, out, err = cli("report", str(log), "--at", value)
        assert status == 0 and moment in out, (value, err)
    status, out, err = cli("report", str(log), "--at", "5e-6", "--json")
    assert status == 0, err


def test_a_negative_capacity_is_refused_saying_so(log: Path) -> None:
    for args in (("--capacity", "-5GiB"), ("--capacity=-5GiB",), ("--capacity", "-1")):
        status, out, err = cli("replay", str(log), *args, "--no-search")
        assert status == 2 and out == "" and "expected one argument" not in err, args
        assert "--capacity -" in err and "cannot be negative (0 means unlimited)" in err, err


def test_capacity_zero_is_unlimited_and_documented(log: Path, library_path: Path) -> None:
    status, out, err = cli("replay", "--help")
    assert status == 0 and "0 means" in out and "unlimited" in out
    status, out, err = cli("replay", str(log), "--capacity", "0", "--json", "--no-search")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["trace"]["capacity"] == 0 and not any(p["oom_at_capacity"] for p in doc["policies"].values())


def test_an_option_value_is_not_taken_for_an_option() -> None:
    from torchalloc.cli.args import with_negative_values

    assert with_negative_values(["x", "--at", "-1", "--at", "peak"], ["--at"]) == ["x", "--at=-1", "--at", "peak"]
    assert with_negative_values(["--at", "-.5", "--capacity", "-5GiB"], ["--at"]) == ["--at=-.5", "--capacity",
                                                                                      "-5GiB"]
    assert with_negative_values(["--at", "--json"], ["--at"]) == ["--at", "--json"]  # argparse says it
    assert with_negative_values(["--", "--at", "-1"], ["--at"]) == ["--", "--at", "-1"]


@pytest.mark.parametrize("typo, meant", [("repot", "report"), ("exprot", "export"), ("rplay", "replay"),
                                         ("inf", "info")])
def test_a_mistyped_command_gets_a_suggestion(typo: str, meant: str) -> None:
    status, out, err = cli(typo)
    assert status == 2 and f"unknown command '{typo}'; did you mean {meant}?" in err


def test_a_command_far_from_any_gets_none() -> None:
    status, out, err = cli("frobnicate")
    assert status == 2 and "unknown command 'frobnicate'\n" in err and "did you mean" not in err


def test_an_integer_out_of_range_in_the_configuration_says_the_range(library_path: Path) -> None:
    from torchalloc import _lib

    try:
        with pytest.raises(ValueError, match=r"'expandable' \(expected off, on, compact or reclaim, or an integer from 0 to 3\)"):
            _lib.init("backend:sim,expandable:4")
    finally:
        _lib.teardown()


def test_one_device_is_not_plural(tmp_path: Path) -> None:
    import pickle

    from torchalloc.log.trace import TraceError, load_trace

    snap = tmp_path / "one.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": []}]]}))
    with pytest.raises(TraceError, match=r"no device 3 \(the snapshot has traces for 1 device: 0\)"):
        load_trace(snap, device=3)


@pytest.mark.parametrize("text", ["Some notes about the run\n", "Nothing to see\n"])
def test_a_text_file_is_not_called_a_snapshot(tmp_path: Path, text: str) -> None:
    """Its first letter is a pickle opcode (STRING, NONE): it was called "a PyTorch memory snapshot (a
    pickle)" with a pointer to replay, which then failed on it (issue 47)."""
    notes = tmp_path / "notes.txt"
    notes.write_text(text)
    for args in (["report"], ["top", "--once"], ["export", "-o", str(tmp_path / "s.pickle")]):
        status, out, err = cli(*args, str(notes))
        assert status == 2 and out == "", (args, err)
        assert "snapshot" not in err and f"{notes}: not a torchalloc log" in err, (args, err)
    status, out, err = cli("replay", str(notes))
    assert status == 2 and out == ""
    assert f"{notes}: neither a torchalloc log nor a readable PyTorch memory snapshot" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("protocol", [0, 1, 2, 4, 5])
def test_a_snapshot_is_still_pointed_to_replay(tmp_path: Path, protocol: int) -> None:
    import pickle

    snapshot = tmp_path / "snap.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=protocol))
    status, _, err = cli("report", str(snapshot))
    assert status == 2 and "is a PyTorch memory snapshot (a pickle)" in err and "torchalloc replay" in err, err
