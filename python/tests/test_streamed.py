"""Logs of any size in bounded memory: every tool reads every log in pieces, and the pieces change nothing.

The report reads a log in two passes over pieces (analysis/front.py),
replay feeds it to C in pieces (log/trace_stream.py, torchalloc_replay_feed),
export makes two passes (report/export.py); a small log is one piece. Every
check here reads the test logs in pieces of a few records -- so that every
block, phase occurrence, marker and backward span crosses pieces -- and
compares what the tools say with what they say of the same file in one
piece. No check times anything.
"""
from __future__ import annotations

import contextlib
import io
import json
import lzma
import pickle
import random
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from torchalloc.cli import dispatch as cli
from torchalloc.log import chunks as log_chunks
from torchalloc.log import trace_stream
from torchalloc.analysis import analyze
from torchalloc.analysis.sections.lifetimes import EXACT_LIFETIMES, Lifetimes

from torchalloc.report.export import to_snapshot
from torchalloc.log.reader import read_log
from torchalloc.log.chunks import ChunkedLog
from torchalloc.analysis.notes import table_notes
from torchalloc.report.text import render_text
from torchalloc.report.html import render_html

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from report_demo import demo_log  # noqa: E402
from synthfile import write_log as write_synth  # noqa: E402
from synthlog import LINEAR, MODULE, TENSOR, MiB, SynthLog  # noqa: E402
from test_analysis import main, training_log  # noqa: E402
from test_every_log import write_log as write_child  # noqa: E402
from test_log_decode import synth  # noqa: E402
from test_log_integrity import flipped, sealed  # noqa: E402

BUNDLED = HERE.parent / "torchalloc" / "data" / "phases_trace.talog.xz"


# ---------------------------------------------------------------------------
# The logs: hand-made scenarios written as files, logs of the library, the bundled one
# ---------------------------------------------------------------------------


def _reasons() -> SynthLog:
    """Every stack rule, a loop rebinding, saved for backward seen from frames, a lost free, frees of blocks from
    before the log, a double free, a second device, and a fragmentation OOM."""
    L = SynthLog()
    L._row(kind=2, addr=0x900000, size=3 * MiB, block_size=3 * MiB, stack=0)  # allocated before the log
    L.segment(0, 64 * MiB)
    s10 = L.stack(main(10))
    L.alloc(0, MiB, s10)
    L.free(0, s10)  # temporary
    L.alloc(MiB, MiB, L.stack(("/home/u/train.py", 3, "f"), main(12)))
    L.free(MiB, L.stack(main(12)))  # freed when f returned
    s20, s21 = L.stack(main(20)), L.stack(main(21))
    for k in range(3):  # for ...: x = x + 1; y = x * 2
        L.alloc((2 + k) * MiB, MiB, s20)
        L.alloc(8 * MiB, MiB, s21)
        L.free(8 * MiB, s21)
        if k:
            L.free((1 + k) * MiB, s20)
    L.alloc(16 * MiB, 2 * MiB, L.stack((LINEAR, 125, "forward"), (MODULE, 1750, "_call_impl"), main(30)))
    L.alloc(20 * MiB, MiB, L.stack(main(31)))
    L.alloc(20 * MiB, MiB, L.stack(main(32)))  # the free of the first was lost
    L.free(20 * MiB, L.stack(main(33)))
    bw = L.stack((TENSOR, 500, "backward"), main(40))
    L.alloc(24 * MiB, MiB, bw)
    L.free(16 * MiB, 0, tid=2)  # freed by autograd while a Python thread is inside Tensor.backward
    L.free(24 * MiB, bw)
    L._row(kind=2, addr=0x910000, size=MiB, block_size=MiB, stack=0)  # before the log too
    L._row(kind=2, addr=0x910000, size=MiB, block_size=MiB, stack=0)  # and freed twice
    L._row(kind=1, addr=0x5000000, size=MiB, block_size=MiB, stack=s10, device=1)  # another device
    for s in range(3):  # three 20 MiB segments, each 6 + 6 + 6 MiB, the middle block kept
        base = (64 + s * 32) * MiB
        L.segment(base, 20 * MiB)
        for k in range(3):
            L.alloc(base + k * 6 * MiB, 6 * MiB, L.stack(main(50)))
    for s in range(3):
        base = (64 + s * 32) * MiB
        L.free(base, L.stack(main(51)))
        L.free(base + 12 * MiB, L.stack(main(51)))
    L.oom(12 * MiB, 124 * MiB, L.stack(main(52)))
    L.mark("after the oom")
    return L


def _phases_without_stacks() -> SynthLog:
    """Phases that repeat and nest, a workspace-sized block, blocks handed on between phases, no stacks."""
    L = SynthLog()
    L.begin("model")
    L.alloc(0, 4 * MiB)
    L.alloc(4 * MiB, 4 * MiB)
    L.end()
    for step in range(4):
        L.mark(f"step {step}")
        L.begin("forward")
        if step == 0:
            L.alloc(64 * MiB, 32 * MiB)
            L.alloc(96 * MiB, 1 * MiB)
        L.alloc(16 * MiB, (2 + step) * MiB)
        L.begin("attention")
        L.alloc(24 * MiB, MiB)
        L.free(24 * MiB)
        L.end()
        L.end()
        L.begin("backward")
        L.free(16 * MiB)
        L.alloc(32 * MiB, 4 * MiB)
        if step:
            L.free(32 * MiB)
        L.end()
        L.begin("optimizer")
        L.alloc(40 * MiB + step * MiB, MiB)
        L.alloc(48 * MiB, 2 * MiB)
        L.free(48 * MiB)
        L.end()
    return L


def _modules_and_segments() -> SynthLog:
    """Module records (names, current modules, tags: of a block's first byte, inside a block, of a block from before
    the log, of a block tagged again, of nothing) over phases; plain segments, expandable runs unmapped two at
    a time and in part; a plain segment given back while a block in it is never freed."""
    from torchalloc._records import MODULE as MODULE_REC
    from torchalloc._records import MODULE_NAME, MODULE_TAG, SEGMENT_ALLOC, SEGMENT_EXPANDABLE, SEGMENT_FREE

    L = SynthLog()
    for mid, name in ((1, "model"), (2, "model.layers.0"), (3, "model.layers.1")):
        L._row(kind=MODULE_NAME, size=mid, stack=L._string(name), device=-1)

    def use(mid: int) -> None:
        L._row(kind=MODULE_REC, size=mid, device=-1)

    def tag(addr: int, mid: int, role: int) -> None:
        L._row(kind=MODULE_TAG, addr=addr, size=mid, flags=role, device=-1)

    def runs(addr: int, size: int) -> None:
        L._row(kind=SEGMENT_ALLOC, addr=addr, size=size, block_size=size, flags=SEGMENT_EXPANDABLE)

    def unmap(addr: int, size: int) -> None:
        L._row(kind=SEGMENT_FREE, addr=addr, size=size, block_size=size, flags=SEGMENT_EXPANDABLE)

    seg, exp = 64 * MiB, 256 * MiB
    L.segment(seg, 32 * MiB)
    L.begin("init")
    L.alloc(seg, 4 * MiB)
    L.alloc(seg + 4 * MiB, 4 * MiB)
    tag(seg, 2, 1)
    tag(seg + 4 * MiB + 512, 3, 1)  # inside the block
    tag(0x900000 + 4 * MiB, 1, 1)  # a block from before the log
    L.end()
    for step in range(3):
        L.mark(f"step {step}")
        L.begin("forward")
        use(2)
        runs(exp, 2 * MiB)
        runs(exp + 2 * MiB, 2 * MiB)
        L.alloc(exp, MiB)
        L.alloc(exp + 2 * MiB, 2 * MiB)
        use(3)
        L.alloc(seg + 8 * MiB, (3 + step) * MiB)
        use(0)
        L.end()
        L.begin("backward")
        L.free(exp + 2 * MiB)
        L.alloc(seg + 16 * MiB, 4 * MiB)
        tag(seg + 16 * MiB, 2, 2)
        tag(seg + 16 * MiB, 3, 2)  # tagged again: the later tag wins
        tag(0x7000000, 2, 2)  # names no block
        L.free(exp)
        unmap(exp, 4 * MiB)  # both runs at once
        L.free(seg + 8 * MiB)
        L.end()
        L.begin("optimizer")
        runs(exp, 8 * MiB)
        L.alloc(exp + 6 * MiB, MiB)
        unmap(exp, 2 * MiB)  # the first part only: the block stays in the run it was made in
        L.alloc(seg + 24 * MiB, 2 * MiB)
        tag(seg + 24 * MiB, 3, 3)
        L.free(seg + 16 * MiB)
        L.free(exp + 6 * MiB)
        unmap(exp + 2 * MiB, 6 * MiB)
        if step < 2:
            L.free(seg + 24 * MiB)
        L.end()
    L._row(kind=2, addr=0x900000, size=2 * MiB, block_size=2 * MiB)  # frees of blocks from before the log
    L._row(kind=2, addr=0x900000 + 4 * MiB, size=MiB, block_size=MiB)
    L.segment(512 * MiB, 8 * MiB)
    L.alloc(512 * MiB, MiB)  # never freed, in a segment given back
    L.segment_free(512 * MiB, 8 * MiB)
    return L


SCENARIOS = {"training": lambda: training_log(steps=3), "oom_demo": demo_log, "reasons": _reasons,
             "phases": _phases_without_stacks, "empty": SynthLog}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each scenario as a file, logs the library wrote (with and without stacks and phases, closed and killed),
    and the bundled log."""
    d = tmp_path_factory.mktemp("streamed")
    out = {name: write_synth(make(), d / f"{name}.talog", start_ns=10**9) for name, make in SCENARIOS.items()}
    for policy, stacks, phases, mode in (("caching", 1, 1, "exit"), ("phase_arena", 0, 1, "kill"),
                                         ("caching", 1, 0, "kill"), ("exact", 0, 0, "exit")):
        name = f"{policy}_{stacks}{phases}_{mode}"
        out[name] = write_child(d / f"{name}.talog", policy, stacks, phases, mode)
    out["bundled"] = BUNDLED
    out["modules"] = write_synth(_modules_and_segments(), d / "modules.talog", start_ns=10**9)
    out["reclaim"] = HERE / "data" / "reclaim_demo.talog.xz"  # expandable:reclaim, module records, recorded on a GPU
    return out


def _chunk(name: str) -> int:
    """Pieces of a few records; a killed writer's file holds megabytes of zeros, read in larger ones."""
    return 4096 if name == "bundled" else 64 if "kill" in name else 501 if name == "reclaim" else 5


# ---------------------------------------------------------------------------
# The reader
# ---------------------------------------------------------------------------


def _same_as_read_log(source: object, chunk: int) -> None:
    whole = read_log(source)  # type: ignore[arg-type]
    pieces = ChunkedLog(source, chunk)  # type: ignore[arg-type]
    got = [r.copy() for _, r in pieces.chunks()]
    records = np.concatenate(got) if got else whole.records[:0]
    assert records.tobytes() == whole.records.tobytes()
    assert (pieces.strings, pieces.frames, pieces.stacks, pieces.phase_names) == \
           (whole.strings, whole.frames, whole.stacks, whole.phase_names)
    assert (pieces.damage, pieces.truncated, pieces.complete, pieces.writer) == \
           (whole.damage, whole.truncated, whole.complete, whole.writer)


@pytest.mark.parametrize("name", ["training", "reasons", "caching_11_exit", "phase_arena_01_kill", "bundled"])
def test_the_reader_in_pieces_gives_what_read_log_gives(logs: dict[str, Path], name: str) -> None:
    for chunk in (1, 3, 64) if name != "bundled" else (4096,):
        _same_as_read_log(logs[name], chunk if "kill" not in name or chunk > 3 else 64)


def test_the_reader_in_pieces_on_damaged_logs(tmp_path: Path) -> None:
    """Every kind of damage read_log reports, at every piece size: the same records kept, the same notes."""
    rng = random.Random(23)
    v1 = synth(40)
    v2 = sealed(synth(40))
    cases = [v1, v2, v1[:-10], v2[: 128 + 64 * 17 + 30]]
    torn = bytearray(synth(40, status=0))
    torn[-1] = 0  # the end record never got its kind
    cases.append(bytes(torn) + bytes(64 * 50))
    hole = bytearray(v2)
    hole[128 + 64 * 9: 128 + 64 * 10] = bytes(64)  # reserved, never written
    cases.append(bytes(hole))
    for field, value in ((slice(8, 16), struct.pack("<Q", 999)), (slice(63, 64), b"\xc8")):
        bad = bytearray(v1)
        bad[128 + 64 * 30 + field.start: 128 + 64 * 30 + field.stop] = value
        cases.append(bytes(bad))
    cases += [flipped(v2, rng.randrange(128 * 8, len(v2) * 8)) for _ in range(12)]
    short = bytearray(synth(40, status=1))
    short[64:72] = struct.pack("<Q", len(short) + 640)  # the header says the writer wrote more
    cases.append(bytes(short))
    extra = bytearray(synth(40, status=1)) + bytes(64) * 3  # bytes after the end the writer declared
    cases.append(bytes(extra))
    for k, data in enumerate(cases):
        for chunk in (1, 2, 7, 1 << 10):
            _same_as_read_log(data, chunk)
        path = tmp_path / f"case{k}.talog"
        path.write_bytes(data)
        _same_as_read_log(path, 3)
    packed = tmp_path / "v2.talog.xz"
    packed.write_bytes(lzma.compress(v2))
    _same_as_read_log(packed, 4)


def test_the_tail_probe_finds_the_last_event(logs: dict[str, Path]) -> None:
    for name in ("training", "caching_11_exit", "phase_arena_01_kill"):
        whole = read_log(logs[name])
        assert ChunkedLog(logs[name]).last_event_time(None) == int(whole.records["time_ns"][-1])


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SCENARIOS) + ["caching_11_exit", "phase_arena_01_kill", "caching_10_kill",
                                                    "exact_00_exit", "bundled", "modules", "reclaim"])
def test_the_report_in_pieces_is_the_report(logs: dict[str, Path], name: str) -> None:
    """Text, JSON and the HTML page, byte for byte (every section: reserved memory and each policy's replay,
    memory by module, the page's fragmentation band and module blocks), and the same answers about other
    moments."""
    path = logs[name]
    whole = analyze(path)
    streamed = analyze(path, chunk_records=_chunk(name), page=True)
    assert json.dumps(streamed.to_dict()) == json.dumps(whole.to_dict())
    assert render_text(streamed) == render_text(whole)
    assert render_html(streamed) == render_html(whole)
    for at in ("peak_reserved", "end", 0.0, "1e-3", "step 1"):
        try:
            expected = whole.anatomy(at)
        except ValueError as e:
            with pytest.raises(ValueError, match=str(e)[:20]):
                streamed.anatomy(at)
            continue
        assert streamed.anatomy(at) == expected  # not named in advance: one more pass


def test_moments_named_in_advance_need_no_more_pass(logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = logs["training"]
    at = ["after forward 1", 2.5e-5, "peak_reserved"]
    whole = analyze(path)
    expected = [whole.anatomy(x) for x in at]  # not named in advance: a pass each
    streamed = analyze(path, chunk_records=5, at=at)
    from torchalloc.analysis import front as module

    def no_pass(*args: object, **kwargs: object) -> None:
        raise AssertionError("a moment named in advance needed another pass")

    monkeypatch.setattr(module, "run_pass", no_pass)
    monkeypatch.setattr(module, "scan", no_pass)
    assert [streamed.anatomy(x) for x in at] == expected


def test_the_cli_says_the_same_in_pieces_of_a_few_records(logs: dict[str, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`torchalloc report`, `replay` and `export` print and write the same with every log read in pieces of 7
    records as with the default pieces (the test log is one of those)."""
    path = logs["training"]

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(list(argv))
            except SystemExit as e:
                status = int(e.code or 0)
        return status, out.getvalue(), err.getvalue()

    args = [("report", str(path), "--at", "step 1", "--at", "2e-5"), ("report", str(path), "--json"),
            ("report", str(path), "--html", str(tmp_path / "r.html")),
            ("replay", str(path), "--policies", "caching,phase_arena+expandable"),
            ("export", str(path), "-o", str(tmp_path / "s.pickle"), "--max-entries", "10")]
    before = [run(*a) for a in args]
    page = (tmp_path / "r.html").read_text()
    snap = (tmp_path / "s.pickle").read_bytes()
    sizes = []
    real = log_chunks.ChunkedLog.__init__

    def in_small_pieces(self: ChunkedLog, source: Any, chunk_records: int = 0, *rest: Any, **kw: Any) -> None:
        sizes.append(chunk_records)
        real(self, source, 7, *rest, **kw)

    monkeypatch.setattr(log_chunks.ChunkedLog, "__init__", in_small_pieces)
    after = [run(*a) for a in args]
    assert sizes  # every tool read the log through ChunkedLog
    for (s0, o0, e0), (s1, o1, e1) in zip(before, after):
        assert (s1, e1) == (s0, e0)
        if not o0.startswith("trace:"):
            assert o1 == o0
        else:  # replay: the same table (its speed line measures this run)
            assert [line for line in o1.splitlines() if "speed" not in line] == \
                   [line for line in o0.splitlines() if "speed" not in line]
    assert (tmp_path / "r.html").read_text() == page
    assert (tmp_path / "s.pickle").read_bytes() == snap


def test_a_lifetime_median_from_the_histogram_is_within_its_bin() -> None:
    rng = np.random.default_rng(7)
    for values in (rng.integers(0, 5000, 3 * EXACT_LIFETIMES), rng.lognormal(12, 3, 2 * EXACT_LIFETIMES + 1),
                   np.full(EXACT_LIFETIMES + 5, 123456789)):
        ns = np.asarray(values, dtype=np.int64)
        lives = Lifetimes()
        for part in np.array_split(ns, 7):
            lives.add(part)
        assert lives.hist  # past EXACT_LIFETIMES: the histogram
        exact = float(np.median(ns / 1e9))
        assert abs(lives.median_s() - exact) <= exact * 2.0 ** -9 + 1e-9
    small = Lifetimes()
    small.add(np.array([5, 1, 9, 3], dtype=np.int64))
    assert small.median_s() == float(np.median(np.array([5, 1, 9, 3]) / 1e9))


# ---------------------------------------------------------------------------
# Replay and export
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["training", "reasons", "caching_10_kill", "bundled"])
def test_a_trace_in_pieces_replays_as_the_whole_one(logs: dict[str, Path], name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from torchalloc.replay.engine import report_json, run
    from torchalloc.log.trace import load_trace

    whole = load_trace(logs[name])  # one piece, its events in memory
    assert whole.chunks is None and whole.events.dtype == trace_stream.EVENT_DTYPE
    monkeypatch.setattr(trace_stream, "IN_MEMORY_EVENTS", 16)  # a temporary file from 16 events on
    pieces = trace_stream.load_log(logs[name], chunk_records=_chunk(name))
    spill = pieces.chunks.path
    for field in ("device", "peak_requested", "peak_rounded", "unknown_frees", "replaced_allocs", "prelude",
                  "native_peak_reserved", "native_label", "native_ooms", "notes", "rank", "phase_names"):
        assert getattr(pieces, field) == getattr(whole, field), field
    assert np.array_equal(pieces.native_pos, whole.native_pos)
    assert all(np.array_equal(pieces.chunks.array()[f], whole.events[f]) for f in whole.events.dtype.names)
    policies = ["caching", "phase_arena+compact", "exact"]
    assert report_json(run(pieces, policies, 64 << 20, series_len=50)) == \
           report_json(run(whole, policies, 64 << 20, series_len=50))
    assert spill is not None and Path(spill).exists()
    pieces.chunks.close()
    assert not Path(spill).exists()


def test_replay_takes_any_number_of_stream_pool_pairs() -> None:
    """5000 (stream, pool) pairs each get an expandable segment reserving 1 TiB of addresses: the simulated
    device used to run out of them at the 4096th (every +expandable and +compact run aborted)."""
    from torchalloc.replay.engine import replay_once
    from torchalloc.log.trace import from_arrays

    pairs = 5000
    s = np.arange(pairs)
    kind = np.concatenate((np.full(pairs, 1), np.full(pairs, 2)))
    addr = np.concatenate((s, s)) * 4096 + 4096
    size = np.concatenate((np.where(s % 2, 512, 4 * MiB), np.zeros(pairs)))
    trace = from_arrays(kind, addr, size, stream=np.concatenate((s // 2, s // 2)))
    for policy in ("caching+expandable", "phase_arena+compact"):
        result, _ = replay_once(trace, policy, 0)
        assert not result["oom"] and result["events"] == 2 * pairs
        assert result["peak_requested"] == (pairs // 2) * (4 * MiB + 512)


@pytest.mark.parametrize("name", ["training", "reasons", "phase_arena_01_kill", "bundled"])
def test_export_in_pieces_is_the_export(logs: dict[str, Path], name: str) -> None:
    """The snapshot of a log read in pieces of a few records is the one it gives in one piece; with a cap, each
    device's trace is the last entries of the whole one, the segments the same; the notes are the log's own."""
    everything, _, all_totals = to_snapshot(logs[name], 0)
    assert all_totals == [len(trace) for trace in everything["device_traces"]]
    for cap in (0, 9, 100_000):
        snap, notes, totals = to_snapshot(logs[name], cap)
        streamed, s_notes, s_totals = to_snapshot(logs[name], cap, chunk_records=_chunk(name))
        assert pickle.dumps(streamed) == pickle.dumps(snap)
        assert (s_notes, s_totals) == (notes, totals) and totals == all_totals
        assert snap["device_traces"] == [trace[-cap:] if cap else trace for trace in everything["device_traces"]]
        assert snap["segments"] == everything["segments"]
        read = ChunkedLog(logs[name])
        for _ in read.chunks():  # a whole pass: the log's own notes (its damage, how it ended) are known after one
            pass
        log_notes = table_notes(read)
        assert notes[:len(log_notes)] == log_notes


def test_export_keeps_the_last_entries_and_says_so(logs: dict[str, Path], tmp_path: Path) -> None:
    """--max-entries N keeps each device's last N trace entries, as PyTorch's ring buffer does; the segments and
    blocks at the end stay complete; 0 keeps everything."""
    from torchalloc.report.export import check_snapshot

    path = logs["caching_11_exit"]
    out = tmp_path / "s.pickle"

    def export(*extra: str) -> tuple[dict, str]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert cli.main(["export", str(path), "-o", str(out), *extra]) == 0
        return pickle.loads(out.read_bytes()), err.getvalue()

    everything, said = export("--max-entries", "0")
    total = len(everything["device_traces"][0])
    assert f": {total} trace entries," in said and "the last" not in said
    cut, said = export("--max-entries", "10")
    assert cut["device_traces"][0] == everything["device_traces"][0][-10:]
    assert f"the last 10 of {total} trace entries" in said and "ring buffer" in said
    assert cut["segments"] == everything["segments"] and check_snapshot(cut) == []
    default, said = export()
    assert len(default["device_traces"][0]) == min(total, 100_000)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        cli.main(["export", str(path), "-o", str(out), "--max-entries", "-1"])
    assert "--max-entries -1" in err.getvalue()
