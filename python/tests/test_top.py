"""`torchalloc top`'s live state and its `--once` frame, against a job's own figures.

A writer process (top_writer.py) runs batches of steps on the simulated
device and prints its own allocated and reserved (torchalloc.stats) after
each; the state, refreshed between batches from the records appended since,
must say the same. A log grown by hand, cut inside records, shows that a
half-written record waits for the next refresh.
"""
from __future__ import annotations

import fcntl
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from cli_in_process import cli

from torchalloc.analysis.sections.leaks import MIN_STEPS
from torchalloc.cli.top_frame import MIN_COLUMN, frame, sparkline
from torchalloc.cli.top_reader import RESTARTED, LiveReader
from torchalloc.cli.top_state import SPARK_COLUMNS, SPARK_WIDEST_NS, LiveState, Sparkline
from torchalloc.log.reader import read_log
from torchalloc.units import fmt_bytes

HERE = Path(__file__).resolve().parent
WRITER = HERE / "top_writer.py"
MiB = 1 << 20


class Writer:
    """top_writer.py as a child process: `figures()` waits for its next batch's line."""

    def __init__(self, log: Path, per_batch: int, library: Path, keep_every: int = 2) -> None:
        env = dict(os.environ, PYTHONPATH=str(HERE.parent), TORCHALLOC_LIB=str(library))
        self.proc = subprocess.Popen([sys.executable, str(WRITER), str(log), str(per_batch), str(keep_every)],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def figures(self) -> dict[str, int]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the writer ended early (status {self.proc.wait(timeout=60)})"
        return json.loads(line)

    def say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        self.say("quit")
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)


@pytest.fixture
def writer(tmp_path: Path, library_path: Path) -> Iterator[tuple[Writer, Path]]:
    log = tmp_path / "job.talog"
    w = Writer(log, 3, library_path)
    try:
        yield w, log
    finally:
        w.kill()


def _same_figures(state: LiveState, figures: dict[str, Any]) -> None:
    assert (state.allocated, state.reserved) == (figures["allocated"], figures["reserved"])
    assert (state.peak_allocated, state.peak_reserved) == (figures["peak_allocated"], figures["peak_reserved"])


def test_the_state_follows_the_writer_refresh_by_refresh(writer: tuple[Writer, Path]) -> None:
    w, log = writer
    figures = w.figures()
    state = LiveState(LiveReader(str(log)))
    seen = []
    for batch in range(3):
        if batch:
            w.say("more")
            figures = w.figures()
        before = state.reader.next_slot
        state.refresh()
        assert state.writer == "running"
        assert state.reader.next_slot > before  # only what was appended was read
        _same_figures(state, figures)
        seen.append(state.records)
        # every odd step keeps its 3 MiB gradient: the writer's allocation site holds them, made in backward
        kept = figures["steps"] // 2
        site = next(s for s in state.by_site() if s.startswith("top_writer.py:"))
        assert state.by_site()[site] == (kept * 3 * MiB, kept)
        assert state.site_phases()[site] == "backward"
        # made while "model.head" was current, the kept gradients are tagged as the encoder's: the tag wins
        assert state.by_module() == {"model.encoder": (kept * 3 * MiB, kept)}
        assert state.by_phase() == {"backward": (kept * 3 * MiB, kept)}
        assert state.markers[-1].label == f"step {figures['steps'] - 1}"
        assert len(state.carry) == kept  # the state holds the live blocks, not the history
    assert seen == sorted(seen) and len(set(seen)) == 3
    assert w.finish() == 0
    state.refresh()
    assert state.writer == "closed"
    _same_figures(state, figures)
    # the whole log read at once says the same as the refreshes did
    once = LiveState(LiveReader(str(log)))
    once.refresh()
    assert (once.records, once.by_site(), once.peak_allocated_ns) == (state.records, state.by_site(),
                                                                     state.peak_allocated_ns)
    assert once.records == len(read_log(log).records)


def test_grew_between_markers_names_the_site_that_keeps_growing(writer: tuple[Writer, Path]) -> None:
    w, log = writer
    w.figures()
    w.finish()
    state = LiveState(LiveReader(str(log)))
    state.refresh()
    text = "\n".join(frame([state], 100))
    # steps 0..2: step 1 kept its gradient, step 2 did not: from 'step 1' to 'step 2' nothing grew, and from
    # 'step 0' to 'step 1' the writer's site grew by one gradient
    assert "Grew from 'step 1' to 'step 2': nothing" in text
    before, after = state.markers[0], state.markers[1]
    grown = {s: after.sites.get(s, 0) - before.sites.get(s, 0) for s in after.sites}
    assert [b for b in grown.values() if b] == [3 * MiB]


def test_a_site_that_keeps_bytes_is_named_a_leak_while_the_job_runs(tmp_path: Path, library_path: Path) -> None:
    """The writer keeps one 3 MiB gradient per step: before MIN_STEPS step markers the frame says the rule has too
    few; once it has them, analysis/sections/leaks.py names the site, in its words, and keeps naming it as the job goes on.
    Keeping one every other step (the issue's first missed leak) is named too."""
    log = tmp_path / "leak.talog"
    w = Writer(log, MIN_STEPS - 2, library_path, keep_every=1)
    try:
        w.figures()
        state = LiveState(LiveReader(str(log)))
        state.refresh()
        assert state.leaks() == []
        text = "\n".join(frame([state], 200))
        assert (f"Leaks: {MIN_STEPS - 2} step markers like 'step N', fewer than the {MIN_STEPS} the leak rule needs: "
                "no leak looked for yet") in text
        for batch in (1, 2):
            w.say("more")
            w.figures()
            state.refresh()
            markers = (batch + 1) * (MIN_STEPS - 2)
            (leak,) = state.leaks()
            assert leak.site.startswith("top_writer.py:")
            # a gradient's block may be a little more than the 3 MiB asked (a cached block not split): the bytes
            # are the blocks', as the site's live bytes at the last marker say
            # (the first marker, 'step 0', comes after the first kept gradient: the site's fewest bytes)
            if batch == 1:
                first = state.markers[0].sites[leak.site]
            last = state.markers[-1].sites[leak.site]
            assert (leak.since, leak.steps, leak.live, leak.grown, leak.last) == (
                "step 0", markers - 1, last, last - first, f"step {markers - 1}")
            assert leak.per_step == (last - first) // (markers - 1) >= 3 * MiB
            assert leak.words() in "\n".join(frame([state], 250))
    finally:
        w.kill()
    other = tmp_path / "every_other.talog"
    w = Writer(other, 2 * MIN_STEPS, library_path)
    try:
        w.figures()
        state = LiveState(LiveReader(str(other)))
        state.refresh()
        assert state.step_kind() == "step N"
        (leak,) = state.leaks()
        assert leak.site.startswith("top_writer.py:") and leak.since == "step 0"  # the last marker before a kept one
        assert leak.words() in "\n".join(frame([state], 250))
    finally:
        w.kill()


def _write_log(script: str, log: Path, library_path: Path) -> None:
    """Run `script` (the library on the simulated device, the log's path in sys.argv[1]) in a process of its own."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), TORCHALLOC_LIB=str(library_path))
    subprocess.run([sys.executable, "-c", script, str(log)], check=True, env=env, timeout=120)


def test_the_last_oom_and_its_verdict(tmp_path: Path, library_path: Path) -> None:
    """A job asks for more than the simulated device has: the frame names the OOM, what was asked, the
    allocator's verdict (capacity) in the report's words, and the first line of advice the report gives."""
    log = tmp_path / "oom.talog"
    child = ("import sys; from torchalloc import _lib\n"
             "_lib.init(f'backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,expandable:off,log:{sys.argv[1]}')\n"
             "lib = _lib.lib(); keep = lib.torchalloc_malloc(256 << 20, 0, None)\n"
             "assert not lib.torchalloc_malloc(2 << 30, 0, None)\n")
    _write_log(child, log, library_path)
    state = LiveState(LiveReader(str(log)))
    state.refresh()
    assert state.oom is not None and (state.oom.requested, state.oom.verdict) == (2 << 30, "capacity")
    assert state.oom.allocated == 256 << 20
    text = "\n".join(frame([state], 200))
    assert "Last OOM at t=" in text and "asked 2.0 GiB" in text
    assert "verdict: capacity: live tensors (256.0 MiB) and the 2.0 GiB asked for exceed the device's 1.0 GiB" in text
    status, out, _ = cli("report", "--json", str(log))
    assert status == 0
    advice = json.loads(out)["summary"]["oom"]["advice"]
    assert advice.startswith("shrink live tensors") and state.oom.advice == f"1. {advice}"
    assert " ".join(line.strip() for line in text.splitlines()).count(f"advice: 1. {advice}") == 1  # wrapped whole


def test_blocks_from_before_the_log_are_not_counted_and_it_says_so(tmp_path: Path, library_path: Path) -> None:
    """A log opened mid-run: a block allocated before it and freed after takes nothing off allocated (it was never
    counted), and the frame says how many such frees it saw."""
    log = tmp_path / "late.talog"
    child = ("import sys; from torchalloc import _lib\n"
             "_lib.init('backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,expandable:off')\n"
             "lib = _lib.lib(); early = lib.torchalloc_malloc(64 << 20, 0, None)\n"
             "assert lib.torchalloc_log_open(sys.argv[1].encode()) == 0\n"
             "lib.torchalloc_free(early, 64 << 20, 0, None); late = lib.torchalloc_malloc(32 << 20, 0, None)\n")
    _write_log(child, log, library_path)
    state = LiveState(LiveReader(str(log)))
    state.refresh()
    assert (state.allocated, state.before_log_frees) == (32 << 20, 1)
    assert "(1 frees of blocks allocated before the log began" in "\n".join(frame([state], 200))


def test_a_log_reused_by_another_run_ends_what_was_followed(writer: tuple[Writer, Path]) -> None:
    """A log path is reused by emptying the file: the run top followed is gone, and it says so rather than read
    the new run's records as more of the old one's."""
    w, log = writer
    figures = w.figures()
    assert w.finish() == 0
    state = LiveState(LiveReader(str(log)))
    state.refresh()
    data = bytearray(log.read_bytes())
    struct.pack_into("<I", data, 40, 1)  # another pid
    log.write_bytes(bytes(data))
    state.refresh()
    assert state.writer == RESTARTED
    _same_figures(state, figures)  # what was read stays
    log.write_bytes(b"")
    state.refresh()
    assert state.writer == RESTARTED


def _open_header(data: bytes) -> bytes:
    """A finished log's header as its writer's while it ran: status open, no end offset (checksum redone)."""
    head = bytearray(data[:128])
    struct.pack_into("<I", head, 56, 0)
    struct.pack_into("<Q", head, 64, 0)
    head[60] = 0
    head[60] = int(np.bitwise_xor.reduce(np.frombuffer(bytes(head), np.uint8)))
    return bytes(head)


def test_a_half_written_record_waits_for_the_next_refresh(writer: tuple[Writer, Path], tmp_path: Path) -> None:
    w, log = writer
    figures = w.figures()
    assert w.finish() == 0
    data = log.read_bytes()
    slots = (len(data) - 128) // 64
    growing = tmp_path / "growing.talog"
    growing.write_bytes(_open_header(data))
    fd = os.open(growing, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as the writer does while the log is open: the reader sees it running
    try:
        state = LiveState(LiveReader(str(growing)))
        written = 128
        # cut inside a record, at a record's boundary, a byte short of a slot, then a whole slot but its kind
        for cut in (128 + 64 * 7 + 30, 128 + 64 * 20, 128 + 64 * 33 - 1, 128 + 64 * (slots // 2) + 63):
            with open(growing, "ab") as f:
                f.write(data[written:cut])
            written = cut
            state.refresh()
            assert state.writer == "running"
            assert state.reader.next_slot == (cut - 128) // 64  # complete slots only
        # the kind byte of the last slot lands, and the rest of the log
        with open(growing, "ab") as f:
            f.write(data[written:])
        state.refresh()
        assert state.reader.next_slot == slots
        _same_figures(state, figures)
    finally:
        os.close(fd)


def test_a_torn_slot_is_skipped_once_the_writer_is_gone(writer: tuple[Writer, Path], tmp_path: Path) -> None:
    """A killed writer can leave a slot never finished between complete ones: while the writer runs it may
    still be finished, so the reader waits at it; once no one holds the log, it is skipped."""
    w, log = writer
    w.figures()
    assert w.finish() == 0
    data = bytearray(log.read_bytes())
    torn = 128 + 64 * 40
    data[torn + 63] = 0  # the kind byte never written
    growing = tmp_path / "killed.talog"
    # sized as a running writer sizes its file (whole 2 MiB steps; another size says it was cut)
    growing.write_bytes((_open_header(bytes(data)) + bytes(data[128:])).ljust(2 << 20, b"\0"))
    fd = os.open(growing, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    state = LiveState(LiveReader(str(growing)))
    state.refresh()
    assert state.reader.next_slot == 40
    os.close(fd)  # the writer is gone
    state.refresh()
    assert state.writer == "killed"
    assert state.reader.skipped == 1
    assert state.reader.next_slot == (len(data) - 128) // 64


def test_once_prints_the_writers_figures_within_the_width(writer: tuple[Writer, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    w, log = writer
    figures = w.figures()
    monkeypatch.setenv("COLUMNS", "100")
    status, out, err = cli("top", "--once", str(log))
    assert (status, err) == (0, "")
    assert f"allocated {fmt_bytes(figures['allocated'])} (peak {fmt_bytes(figures['peak_allocated'])} at" in out
    assert f"reserved {fmt_bytes(figures['reserved'])} (peak {fmt_bytes(figures['peak_reserved'])} at" in out
    assert "writer running" in out and "phase default" in out and "marker 'step 2'" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    w.finish()
    other = tmp_path / "rank1.talog"
    other.write_bytes(log.read_bytes())
    # two logs: side by side where each gets MIN_COLUMN characters, else one below the other
    monkeypatch.setenv("COLUMNS", str(2 * MIN_COLUMN + 5))
    status, out, _ = cli("top", "--once", str(log), str(other))
    assert status == 0 and out.splitlines()[0].count("job.talog") == 1 and "rank1.talog" in out.splitlines()[0]
    assert all(len(line) <= 2 * MIN_COLUMN + 5 for line in out.splitlines())
    monkeypatch.setenv("COLUMNS", str(2 * MIN_COLUMN))
    status, out, _ = cli("top", "--once", str(tmp_path / "*.talog"))
    lines = out.splitlines()
    assert status == 0 and "rank1.talog" not in lines[0] and sum("writer closed" in line for line in lines) == 2


@pytest.mark.parametrize("args, message", [
    (["nowhere.talog"], "nowhere.talog: no such file"),
    (["'run.*.talog'"], "no file matches this pattern"),
    (["--once", "notalog.txt"], "not a torchalloc log"),
    (["--interval", "0", "x.talog"], "--interval must be more than 0 seconds"),
    (["--interval", "inf", "x.talog"], "--interval must be more than 0 seconds and at most 3600"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "notalog.txt").write_text("hello\n")
    (tmp_path / "x.talog").write_bytes(b"")
    status, out, err = cli("top", *[a.strip("'") for a in args])
    assert status == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


def test_without_a_terminal_it_says_to_use_once(writer: tuple[Writer, Path]) -> None:
    w, log = writer
    w.figures()
    status, _, err = cli("top", str(log))  # pytest's stdin and captured stdout are no terminal
    assert status == 2 and "--once prints one frame as plain text" in err


def test_the_sparkline_stays_bounded_however_long_the_run() -> None:
    spark = Sparkline(0)
    spark.add(np.array([0, 5_000_000]), np.array([1, 2]))
    assert spark.columns().tolist() == [2]  # 10 ms columns: both in the first
    hour = 3600 * 10**9
    times = np.arange(0, hour, 10**8)
    spark.add(times, times // 10**8)
    assert spark.values.size == SPARK_COLUMNS and spark.width == SPARK_WIDEST_NS
    cols = spark.columns()
    assert cols.size == SPARK_COLUMNS and cols[-1] == times[-1] // 10**8  # the last 2 minutes, 1 s a column
    assert sparkline([0, 4, 8], 10) == "▁▅█" and sparkline([0, 4, 8], 2) == "▅█"


def test_a_sites_freed_blocks_say_how_its_live_ones_will_go_as_the_report_says(library_path: Path) -> None:
    """The live view has not seen the live blocks' frees, but it has seen the site's earlier ones: per site, the
    reason of most of its bytes freed so far is the one the report gives those blocks (the bundled demo, with
    stacks, read piece by piece as top reads it)."""
    from torchalloc.analysis import analyze

    demo = Path(__file__).resolve().parents[1] / "torchalloc" / "data" / "demo_trace.talog.xz"
    state = LiveState(LiveReader(str(demo)))
    state.refresh()
    live = state.site_reasons()
    report: dict[str, dict[str, int]] = {}
    for row in analyze(demo).lifetimes():
        if row.typical_lifetime_s >= 0 and row.reason != "persistent":  # freed by the end of the log
            counts = report.setdefault(row.site, {})
            counts[row.reason] = counts.get(row.reason, 0) + row.bytes
    stack_rules = {"temporary", "freed when its function returned", "freed on rebinding", "saved for backward"}
    compared = [site for site, counts in report.items()
                if site in live and max(counts, key=lambda r: counts[r]) in stack_rules]
    assert len(compared) >= 10, (report, live)
    differ = {site: (live[site], report[site]) for site in compared
              if live[site] != max(report[site], key=lambda r: report[site][r])}
    # The view applies the stack rules to each free; the report also calls a block whose line allocated again
    # before its free "freed on rebinding" rather than temporary (the line ran again): only that may differ.
    assert all(view == "temporary" and "freed on rebinding" in counts for view, counts in differ.values()), differ
    assert len(differ) * 5 <= len(compared), differ
    assert {"temporary", "freed when its function returned", "saved for backward"} <= {live[s] for s in compared}
