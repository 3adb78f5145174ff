"""`torchalloc replay`: trace loading (PyTorch snapshots; hostile and broken ones are in
test_snapshot_hostile.py) and replay answers worked out by hand.

The fixture data/small_snapshot.pickle is written by data/make_small_snapshot.py
(its docstring tells the story). With the prelude, the replayed events are
(MiB; stream 0, phase 0):

    e0 Q 4   e1 P 0.5   e2 A 8   e3 B 8   e4 -Q   e5 C 2   e6 -A
    e7 D 9   e8 -B   e9 -C   e10 -D   e11 E 24   e12 -A (stray)

Live requested bytes peak at e11: P + E = 24.5 MiB.

caching (and phase_arena, one phase): Q opens a 20 MiB segment S1, P a 2 MiB
small-pool segment (22 reserved). A, B fill S1's 16 MiB; after -Q, C takes
2 of Q's 4 MiB (rest 2 > 1 MiB: split); after -A, D 9 MiB takes 9 of the 10
free MiB, and the 1 MiB left is not > 1 MiB, so D's block is 10 MiB. After
-B -C -D S1 is wholly free; E 24 MiB fits nowhere and opens 24 MiB:
reserved 46 MiB at e11. Then free = 20 (S1) + 1.5 (S0's tail), largest 20:
fragmentation 1.5 / 21.5 = 3/43. Device allocations 3, frees 0.
At capacity C: e0-e10 need 22 MiB; at e11 22 + 24 > C for C < 46, so the
retry releases S1 (wholly free) and needs 2 + 24 = 26 <= C. Smallest
capacity: 26 MiB; at 25 MiB: OOM at event 11. So at 30 MiB the run peaks
at 26 MiB reserved at e11, with 1 device free (S1), and the only free
bytes at the peak are S0's 1.5 MiB tail (fragmentation 0).

exact: reserved = live bytes: 4, 4.5, 12.5, 20.5, 16.5, 18.5, 10.5, 19.5,
11.5, 9.5, 0.5, 24.5: peak 24.5 MiB at e11; 7 device allocations, 5 frees;
smallest capacity 24.5 MiB; at 20 MiB: OOM at event 3 (B makes 20.5).

PyTorch itself: 22 MiB reserved before the history (end: S0 2 + S2 24 = 26;
the history's net growth -20 + 24 = +4), peak 26 MiB.
"""
from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import pickle
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from torchalloc.cli import replay as replay_cli
from torchalloc.replay import engine as replay
from torchalloc.log import trace
from torchalloc import units
from torchalloc.log.trace import ALLOC, FREE, PHASE_BEGIN, PHASE_END, TraceError

DATA = Path(__file__).resolve().parent / "data"
SNAPSHOT = DATA / "small_snapshot.pickle"
MiB = 1 << 20
GiB = 1 << 30
KiB = 1 << 10

POLICIES = ("caching", "exact", "phase_arena", "caching+expandable", "phase_arena+expandable", "caching+compact",
            "phase_arena+compact", "caching+reclaim", "phase_arena+reclaim")  # replay's default set


@pytest.fixture
def lib(library_path: Path) -> Path:
    """The library, skipping when it predates replay."""
    from torchalloc import _lib

    if not _lib.has("torchalloc_replay"):
        pytest.skip(f"{library_path} has no torchalloc_replay (built before replay.c); rebuild it")
    return library_path


def run_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status = replay_cli.main(list(args))
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 2
            err.write(str(e.code))
    return status, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------
# Parsing a PyTorch snapshot
# ---------------------------------------------------------------------------


def test_parse_small_snapshot() -> None:
    t = trace.load_trace(SNAPSHOT)
    assert t.source == "pytorch-snapshot" and t.device == 0
    assert len(t) == 13
    assert list(t.events["kind"]) == [ALLOC, ALLOC, ALLOC, ALLOC, FREE, ALLOC, FREE, ALLOC, FREE, FREE, FREE, ALLOC, FREE]
    assert list(t.events["size"][:4]) == [4 * MiB, 512 * KiB, 8 * MiB, 8 * MiB]
    assert t.prelude == 2 and t.unknown_frees == 2 and t.replaced_allocs == 0
    assert t.peak_requested == t.peak_rounded == 24 * MiB + 512 * KiB
    assert t.native_initial_reserved == 22 * MiB
    assert t.native_peak_reserved == 26 * MiB
    assert any("mid-run" in n for n in t.notes)
    assert any("22.00 MiB reserved before the history began" in n for n in t.notes)


def test_parse_without_prelude_counts_unknown_frees() -> None:
    t = trace.load_trace(SNAPSHOT, prelude=False)
    assert len(t) == 11 and t.prelude == 0 and t.unknown_frees == 2
    assert t.peak_requested == 24 * MiB  # E alone; P and Q are not known
    assert t.native_peak_reserved == 26 * MiB  # the estimate needs no prelude


def test_compressed_snapshots_load_the_same(tmp_path: Path) -> None:
    raw = SNAPSHOT.read_bytes()
    (tmp_path / "s.pickle.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "s.pickle.xz").write_bytes(lzma.compress(raw))
    (tmp_path / "named_anything").write_bytes(lzma.compress(raw))  # recognised by content
    ref = trace.load_trace(SNAPSHOT)
    for name in ("s.pickle.gz", "s.pickle.xz", "named_anything"):
        t = trace.load_trace(tmp_path / name)
        assert np.array_equal(t.events, ref.events)
        assert t.native_peak_reserved == ref.native_peak_reserved


def test_native_series_follows_segment_events() -> None:
    t = trace.load_trace(SNAPSHOT)
    s = t.native_reserved_series(13)
    assert s is not None
    # 22 MiB until e11, where S1 (-20) and S2 (+24) both land: the bucket's high is 26.
    assert list(s[:11]) == [22 * MiB] * 11 and list(s[11:]) == [26 * MiB] * 2


def test_device_choice(tmp_path: Path) -> None:
    assert trace.load_trace(SNAPSHOT).device == 0  # the busiest
    with pytest.raises(TraceError, match="device_traces are empty"):
        trace.load_trace(SNAPSHOT, device=1)
    with pytest.raises(TraceError, match="no device 5"):
        trace.load_trace(SNAPSHOT, device=5)


def test_streams_are_kept() -> None:
    snap: dict[str, Any] = {"device_traces": [[
        {"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 0},
        {"action": "alloc", "addr": 2 << 40, "size": 512, "stream": 0x55D0C0DE},
        {"action": "alloc", "addr": 3 << 40, "size": 512, "stream": -1},  # a pointer read as signed
    ]]}
    t = trace.from_snapshot(snap)
    assert list(t.events["stream"]) == [0, 0x55D0C0DE, (1 << 64) - 1]


# ---------------------------------------------------------------------------
# Replay answers, by hand (see the module docstring)
# ---------------------------------------------------------------------------


def test_each_policy_by_hand(lib: Path) -> None:
    t = trace.load_trace(SNAPSHOT)
    report = replay.run(t, POLICIES, capacity=80 * GiB)
    got = {p.policy: p for p in report.policies}
    for name in ("caching", "phase_arena"):
        p = got[name]
        assert not p.capped and p.unlimited_peak_reserved == 46 * MiB
        assert p.peak_reserved == 46 * MiB and p.peak_reserved_event == 11
        assert p.peak_allocated == 24 * MiB + 512 * KiB
        assert p.free_at_peak == 21 * MiB + 512 * KiB and p.largest_free_at_peak == 20 * MiB
        assert p.fragmentation_at_peak == pytest.approx(3 / 43)
        assert (p.device_allocs, p.device_frees) == (3, 0)
        assert p.min_capacity == 26 * MiB
    e = got["exact"]
    assert e.peak_reserved == e.peak_allocated == 24 * MiB + 512 * KiB
    assert e.fragmentation_at_peak == 0.0
    assert (e.device_allocs, e.device_frees) == (7, 5)
    assert e.min_capacity == 24 * MiB + 512 * KiB
    assert not e.oom_at_capacity


def test_columns_under_a_capacity_are_the_capped_run(lib: Path) -> None:
    """30 MiB: caching and phase_arena release S1 and retry at e11 (see the module docstring); the peaks shown
    are that run's, and the unconstrained peak is kept beside them. exact never exceeds 30 MiB: not capped."""
    t = trace.load_trace(SNAPSHOT)
    got = {p.policy: p for p in replay.run(t, POLICIES, capacity=30 * MiB, search=False).policies}
    for name in ("caching", "phase_arena"):
        p = got[name]
        assert p.capped and p.unlimited_peak_reserved == 46 * MiB
        assert p.peak_reserved == 26 * MiB and p.peak_reserved_event == 11
        assert p.free_at_peak == p.largest_free_at_peak == 1 * MiB + 512 * KiB and p.fragmentation_at_peak == 0.0
        assert (p.device_allocs, p.device_frees) == (3, 1)
        assert not p.oom_at_capacity and p.oom_event is None
    assert not got["exact"].capped and got["exact"].peak_reserved == 24 * MiB + 512 * KiB
    doc = replay.report_json(replay.Report(trace=t, capacity=30 * MiB, policies=list(got.values())))
    assert doc["policies"]["caching"]["peak_reserved"] == 26 * MiB
    assert doc["policies"]["caching"]["unlimited_peak_reserved"] == 46 * MiB
    text = replay.format_table(replay.Report(trace=t, capacity=30 * MiB, policies=list(got.values())))
    assert "no (cache released)" in text and "caching peaked at 46.00 MiB reserved without a limit" in text


def test_oom_event_at_capacity(lib: Path) -> None:
    t = trace.load_trace(SNAPSHOT)
    got = {p.policy: p for p in replay.run(t, POLICIES, capacity=25 * MiB, search=False).policies}
    assert got["caching"].oom_at_capacity and got["caching"].oom_event == 11
    assert got["phase_arena"].oom_event == 11
    assert not got["exact"].oom_at_capacity
    assert got["caching"].min_capacity is None  # search skipped
    got = {p.policy: p for p in replay.run(t, ["exact"], capacity=20 * MiB, search=False).policies}
    assert got["exact"].oom_event == 3


def test_min_capacity_is_the_smallest_that_runs(lib: Path) -> None:
    t = trace.load_trace(SNAPSHOT)
    assert replay.replay_once(t, "caching", 26 * MiB)[0]["oom"] == 0
    assert replay.replay_once(t, "caching", 26 * MiB - 512)[0]["oom"] == 1
    assert replay.replay_once(t, "exact", 24 * MiB + 512 * KiB)[0]["oom"] == 0
    assert replay.replay_once(t, "exact", 24 * MiB + 511 * KiB)[0]["oom"] == 1


def test_synthetic_phases_and_streams(lib: Path) -> None:
    """From arrays: phase_arena keeps phases apart, streams keep caches apart (cf. tests/test_replay.c T2)."""
    kind = [PHASE_BEGIN, ALLOC, PHASE_END, PHASE_BEGIN, ALLOC, PHASE_END, PHASE_BEGIN, ALLOC, PHASE_END]
    size = [0, 4 * MiB, 0, 0, 4 * MiB, 0, 0, 14 * MiB, 0]
    addr = [0, 0x10, 0, 0, 0x20, 0, 0, 0x30, 0]
    phase = [1, 1, 1, 2, 2, 2, 1, 1, 1]
    t = trace.from_arrays(kind, addr, size, phase=phase)
    assert t.peak_requested == 22 * MiB
    got = {p.policy: p for p in replay.run(t, POLICIES, capacity=0).policies}
    assert got["caching"].peak_reserved == 34 * MiB
    assert got["phase_arena"].peak_reserved == 40 * MiB
    assert got["phase_arena"].fragmentation_at_peak == 0.5
    assert got["exact"].peak_reserved == 22 * MiB
    # Two streams: the freed 8 MiB on stream 0 cannot serve stream 7.
    t2 = trace.from_arrays([ALLOC, FREE, ALLOC], [1, 1, 2], [8 * MiB, 0, 8 * MiB], stream=[0, 0, 7])
    assert replay.replay_once(t2, "caching")[0]["peak_reserved"] == 40 * MiB


def test_trace_peaks_match_replay_of_exact(lib: Path) -> None:
    """The trace's own live peak (numpy) equals the exact policy's requested peak (C), lost frees and all."""
    rng = np.random.default_rng(7)
    n = 20000
    kind = np.where(rng.random(n) < 0.55, ALLOC, FREE).astype(np.uint8)
    addr = rng.integers(0, 300, n).astype(np.uint64) * 4096 + 4096  # addresses collide: lost and stray frees
    size = np.where(kind == ALLOC, rng.integers(0, 3 * MiB, n), 0).astype(np.uint64)
    t = trace.from_arrays(kind, addr, size)
    result, _ = replay.replay_once(t, "exact")
    assert result["peak_requested"] == t.peak_requested
    assert result["peak_allocated"] == t.peak_rounded
    assert result["unknown_frees"] > 0 and result["replaced_allocs"] > 0


def test_reserved_series(lib: Path) -> None:
    t = trace.load_trace(SNAPSHOT)
    report = replay.run(t, ["exact"], capacity=0, search=False, series_len=13)
    series = report.policies[0].series
    assert series is not None
    live = [4, 4.5, 12.5, 20.5, 16.5, 18.5, 10.5, 19.5, 11.5, 9.5, 9.5, 24.5, 24.5]
    live[10] = 0.5
    assert [v / MiB for v in series] == live
    assert report.native_series is not None and len(report.native_series) == 13


def test_bad_policy_is_a_clear_error(lib: Path) -> None:
    status, out, err = run_main(str(SNAPSHOT), "--policies", "caching,nope")
    assert status == 2 and "unknown policy 'nope'" in err


def test_roundup_power2_divisions_names_and_rounds_each_policy(lib: Path) -> None:
    # Two divisions a power of 2: D's 9 MiB becomes 12 MiB (8 + 4), so exact holds B + C + D + P = 22.5 MiB at
    # e7 and runs out there at 21 MiB, where without them it runs out at e11 (E); the other requests are
    # multiples of their step already.
    status, out, err = run_main(str(SNAPSHOT), "--json", "--no-search", "--capacity", "21MiB", "--policies",
                                "exact,caching", "--roundup-power2-divisions", "2")
    assert status == 0, err
    rounded = json.loads(out)["policies"]
    assert set(rounded) == {"exact@2", "caching@2"}
    assert rounded["exact@2"]["oom_event"] == 7
    status, out, err = run_main(str(SNAPSHOT), "--json", "--no-search", "--capacity", "21MiB", "--policies", "exact")
    assert status == 0, err
    assert json.loads(out)["policies"]["exact"]["oom_event"] == 11
    status, out, err = run_main(str(SNAPSHOT), "--policies", "exact", "--roundup-power2-divisions", "3")
    assert status == 2 and "'exact@3': roundup_power2_divisions: '3' is not a power of 2" in err


# ---------------------------------------------------------------------------
# Command line and output
# ---------------------------------------------------------------------------


def test_json_output_schema(lib: Path) -> None:
    status, out, err = run_main(str(SNAPSHOT), "--json", "--capacity", "25MiB")
    assert status == 0, err
    doc = json.loads(out)
    assert set(doc) == {"trace", "policies"}
    tr = doc["trace"]
    assert {"events", "peak_allocated", "native_peak_reserved"} <= set(tr)
    assert tr["events"] == 13 and tr["peak_allocated"] == 24 * MiB + 512 * KiB
    assert tr["native_peak_reserved"] == 26 * MiB
    assert set(doc["policies"]) == set(POLICIES)
    for name, p in doc["policies"].items():
        required = {"peak_allocated", "peak_reserved", "fragmentation_at_peak", "device_allocs", "min_capacity",
                    "oom_at_capacity"}
        assert required <= set(p), name
        for key in ("peak_allocated", "peak_reserved", "device_allocs", "min_capacity"):
            assert type(p[key]) is int, (name, key)  # bytes as integers, not floats
        assert type(p["fragmentation_at_peak"]) is float and 0.0 <= p["fragmentation_at_peak"] < 1.0
        assert type(p["oom_at_capacity"]) is bool
        assert p["default"] is (name == "caching+reclaim")  # what install() picks
        assert type(p["synchronizes"]) is int and p["synchronizes"] >= 0
    assert doc["policies"]["caching"]["oom_at_capacity"] is True
    assert doc["policies"]["caching"]["oom_event"] == 11
    assert doc["policies"]["caching"]["min_capacity"] == 26 * MiB
    assert doc["policies"]["exact"]["oom_at_capacity"] is False


def test_json_native_is_null_without_segment_information(lib: Path, tmp_path: Path) -> None:
    p = tmp_path / "bare.pickle"
    p.write_bytes(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 1, "size": 512}]]}))
    status, out, err = run_main(str(p), "--json", "--policies", "exact")
    assert status == 0, err
    assert json.loads(out)["trace"]["native_peak_reserved"] is None


def test_table_output(lib: Path) -> None:
    status, out, err = run_main(str(SNAPSHOT), "--capacity", "25MiB")
    assert status == 0, err
    assert "recorded (PyTorch)" in out and "26.00 MiB" in out and " req." in out
    for name in POLICIES:
        assert name in out
    assert "at event 11" in out and "begins mid-run" in out


def test_missing_default_trace_is_a_clear_error(lib: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(replay, "DEFAULT_TRACE", tmp_path / "default_trace.pickle.xz")
    status, out, err = run_main()
    assert status == 2 and "bundled default trace is missing" in err and "record_trace.py" in err


def test_default_trace_replays(lib: Path) -> None:
    if not replay.DEFAULT_TRACE.is_file():
        pytest.skip(f"{replay.DEFAULT_TRACE} not recorded yet (examples/record_trace.py on a GPU)")
    t = trace.load_trace(replay.DEFAULT_TRACE)
    assert len(t) > 10000 and t.native_peak_reserved is not None
    status, out, err = run_main("--json", "--no-search")
    assert status == 0, err
    assert json.loads(out)["trace"]["events"] == len(t)


def test_png(lib: Path, tmp_path: Path) -> None:
    png = tmp_path / "reserved.png"
    status, out, err = run_main(str(SNAPSHOT), "--png", str(png), "--no-search")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert status != 0 and "needs matplotlib" in err and not png.exists()
        return
    assert status == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_capacity() -> None:
    status, out, err = run_main(str(SNAPSHOT), "--capacity", "lots")
    assert status == 2 and "not a size" in err


@pytest.mark.parametrize(
    "text, value",
    [("80GiB", 80 << 30), ("512MiB", 512 << 20), ("512MB", 512 * 10**6), ("1.5GiB", 3 << 29), ("4096", 4096),
     ("2g", 2 << 30)],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert units.parse_bytes(text) == value


def test_cli_dispatches_replay(lib: Path) -> None:
    from torchalloc.cli import dispatch as cli

    out = io.StringIO()
    with redirect_stdout(out):
        status = cli.main(["replay", str(SNAPSHOT), "--json", "--no-search"])
    assert status == 0 and json.loads(out.getvalue())["trace"]["events"] == 13


# ---------------------------------------------------------------------------
# torchalloc logs
# ---------------------------------------------------------------------------


def _record_log(path: Path, ops: list[tuple[Any, ...]], *, open_after: int = 0, policy: str = "caching") -> None:
    """Drive the process allocator (sim backend) through `ops` with the event log on.

    ops: ("alloc", name, size[, stream]), ("free", name), ("begin", phase), ("end", phase).
    open_after: open the log only after that many ops (a log opened mid-run).
    """
    from torchalloc import _lib, phases

    lib = _lib.lib()
    conf = f"backend:sim,sim_capacity:1GiB,warn:0,policy:{policy},expandable:off"  # what `replay POLICY` replays
    _lib.init(conf if open_after else f"{conf},log:{path}")
    live: dict[str, tuple[int, int, int]] = {}
    try:
        for i, op in enumerate(ops):
            if open_after and i == open_after:
                assert lib.torchalloc_log_open(os.fsencode(str(path))) == 0, _lib.last_error()
            if op[0] == "alloc":
                stream = op[3] if len(op) > 3 else 0
                ptr = lib.torchalloc_malloc(op[2], 0, stream or None)
                assert ptr
                live[op[1]] = (ptr, op[2], stream)
            elif op[0] == "free":
                ptr, size, stream = live.pop(op[1])
                lib.torchalloc_free(ptr, size, 0, stream or None)
            elif op[0] == "begin":
                phases.begin(op[1])
            elif op[0] == "end":
                phases.end(op[1])
        lib.torchalloc_log_close()
    finally:
        _lib.teardown()


_LOG_OPS: list[tuple[Any, ...]] = [
    ("begin", "fwd"), ("alloc", "A", 4 * MiB), ("end", "fwd"),
    ("begin", "bwd"), ("alloc", "B", 4 * MiB), ("end", "bwd"),
    ("begin", "fwd"), ("alloc", "C", 14 * MiB), ("end", "fwd"),
    ("alloc", "S", 3 * MiB, 0x5000), ("free", "A"), ("free", "S"), ("alloc", "T", 100),
]


@pytest.fixture
def recorded_log(lib: Path, tmp_path: Path) -> Path:
    from torchalloc import _lib

    if not _lib.has("torchalloc_log_open"):
        pytest.skip("the library has no event log")
    path = tmp_path / "run.talog"
    _record_log(path, _LOG_OPS)
    return path


def test_log_trace_keeps_phases_and_streams(recorded_log: Path) -> None:
    t = trace.load_trace(recorded_log)
    assert t.source == "torchalloc-log" and t.device == 0
    kinds = list(t.events["kind"])
    assert kinds == [PHASE_BEGIN, ALLOC, PHASE_END, PHASE_BEGIN, ALLOC, PHASE_END, PHASE_BEGIN, ALLOC, PHASE_END,
                     ALLOC, FREE, FREE, ALLOC]
    assert t.phase_names[t.events["phase"][1]] == "fwd" and t.phase_names[t.events["phase"][4]] == "bwd"
    assert t.events["phase"][7] == t.events["phase"][1]  # C in fwd again
    assert t.events["stream"][9] == 0x5000
    assert t.unknown_frees == 0 and t.prelude == 0
    assert t.peak_requested == 25 * MiB
    assert t.native_label == "recorded (caching)"
    # caching, as recorded: A, B in one 20 MiB segment, C its own 14 MiB, S on another stream 20 MiB, T 2 MiB.
    assert t.native_peak_reserved == (20 + 14 + 20 + 2) * MiB


def test_log_replay_of_the_recording_policy_reproduces_it(recorded_log: Path) -> None:
    t = trace.load_trace(recorded_log)
    got = {p.policy: p for p in replay.run(t, POLICIES, capacity=0, search=False).policies}
    assert got["caching"].peak_reserved == t.native_peak_reserved
    assert got["caching"].device_allocs == 4
    # phase_arena sees the phases: bwd's B opens its own segment, C fits fwd's (cf. tests/test_replay.c T2).
    assert got["phase_arena"].peak_reserved == (20 + 20 + 20 + 2) * MiB
    assert got["exact"].peak_reserved == 25 * MiB
    status, out, err = run_main(str(recorded_log), "--json", "--no-search")
    doc = json.loads(out)
    assert doc["trace"]["native_peak_reserved"] is None  # not PyTorch's
    assert doc["trace"]["recorded_peak_reserved"] == t.native_peak_reserved
    status, out, err = run_main(str(recorded_log), "--no-search")
    assert "recorded (caching)" in out


def test_log_opened_mid_run(lib: Path, tmp_path: Path) -> None:
    from torchalloc import _lib

    if not _lib.has("torchalloc_log_open"):
        pytest.skip("the library has no event log")
    path = tmp_path / "late.talog"
    ops: list[tuple[Any, ...]] = [("alloc", "A", 8 * MiB), ("alloc", "B", MiB), ("alloc", "C", 4 * MiB),
                                  ("free", "A"), ("free", "B")]
    _record_log(path, ops, open_after=3)
    t = trace.load_trace(path)
    assert t.unknown_frees == 2 and t.prelude == 2
    assert list(t.events["kind"]) == [ALLOC, ALLOC, FREE, FREE]
    assert sorted(t.events["size"][:2]) == [MiB, 8 * MiB]
    assert t.peak_requested == 9 * MiB
    assert any("opened mid-run" in n for n in t.notes)
    bare = trace.load_trace(path, prelude=False)
    assert len(bare) == 2 and bare.unknown_frees == 2 and bare.peak_requested == 0


def test_compressed_log(recorded_log: Path, tmp_path: Path) -> None:
    xz = tmp_path / "run.talog.xz"
    xz.write_bytes(lzma.compress(recorded_log.read_bytes()))
    assert np.array_equal(trace.load_trace(xz).events, trace.load_trace(recorded_log).events)


def test_truncated_log_decodes_up_to_the_cut(recorded_log: Path, tmp_path: Path) -> None:
    raw = recorded_log.read_bytes()
    full = trace.load_trace(recorded_log)
    cut = tmp_path / "cut.talog"
    cut.write_bytes(raw[: len(raw) - 64 * 3 - 17])  # lose the last records and part of one
    t = trace.load_trace(cut)
    assert 0 < len(t) < len(full)
    assert any(str(cut) in n for n in t.notes)  # the decoder's damage warning, naming the file
    header_only = tmp_path / "header.talog"
    header_only.write_bytes(raw[:100])
    with pytest.raises(TraceError, match="header is cut short"):
        trace.load_trace(header_only)


def test_malformed_logs(recorded_log: Path, tmp_path: Path) -> None:
    raw = bytearray(recorded_log.read_bytes())
    bad_version = tmp_path / "v9.talog"
    raw[8:12] = (9).to_bytes(4, "little")
    bad_version.write_bytes(bytes(raw))
    with pytest.raises(TraceError, match="version 9"):
        trace.load_trace(bad_version)
    junk = tmp_path / "junk.talog"
    junk.write_bytes(b"TALOG\0\0\0" + os.urandom(40))
    with pytest.raises(TraceError, match="cut short|not understood|version"):
        trace.load_trace(junk)


def test_the_first_row_names_the_allocator_that_recorded_the_trace(lib: Path, tmp_path: Path) -> None:
    """A snapshot `torchalloc export` wrote is not PyTorch's: its first row says so (issue 25)."""
    traces = [[{"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0},
               {"action": "alloc", "addr": 0, "size": 512, "stream": 0}]]
    for settings, label in (({"torchalloc": True}, "recorded (torchalloc, exported)"), ({}, "recorded (PyTorch)")):
        p = tmp_path / "snap.pickle"
        p.write_bytes(pickle.dumps({"device_traces": traces, "allocator_settings": settings}))
        status, out, err = run_main(str(p), "--policies", "exact")
        assert status == 0, err
        first = next(line for line in out.splitlines() if line.startswith("recorded"))
        assert first.startswith(label + " ") and "512 B req." in first, out
