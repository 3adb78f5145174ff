"""Every tool on every log: report (text, --json, --html), replay and export on logs written with and
without stacks, with and without phases, by every policy, by a process that exited normally and by one
SIGKILLed mid-run, cut at several points, and on a log with nothing in it.

Each log is written by log_child.py in its own process on the simulated
device. A tool either succeeds (exit 0) or fails with one line
"torchalloc VERB: error: ..." and a non-zero status: never a traceback,
never a Python `warnings` line. On the whole logs the report's peak equals
the peak worked out from what log_child.py does, killed or not: no completed
record is lost.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from torchalloc.cli import dispatch as cli
from torchalloc.log.reader import read_log

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
STEPS = 6
POLICIES = ("caching", "exact", "phase_arena")


def expected_peak(steps: int) -> int:
    """log_child.py's live peak: step i holds four activations (1 + (i + k) % 5 MiB), its gradient, and from
    step 1 on the first step's gradient (3 MiB each)."""
    return max(sum((1 + (i + k) % 5) * MiB for k in range(4)) + 3 * MiB + (3 * MiB if i else 0)
               for i in range(steps))


def write_log(path: Path, policy: str, stacks: int, phases: int, mode: str, steps: int = STEPS) -> Path:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    args = [sys.executable, str(HERE / "log_child.py"), str(path), policy, str(stacks), str(phases), str(steps), mode]
    if mode == "exit":
        subprocess.run(args, env=env, check=True, timeout=60)
        return path
    child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "READY"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    return path


def run_tool(*argv: str) -> tuple[int, str, str]:
    """cli.main in this process (as the console script runs it): status, stdout, stderr; warnings are errors."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            status = cli.main(list(argv))
        except SystemExit as e:  # argparse and the tools' one-line errors exit
            status = e.code if isinstance(e.code, int) else 1
    return status, out.getvalue(), err.getvalue()


def tools(log: Path, tmp: Path) -> list[tuple[str, ...]]:
    return [
        ("report", str(log)),
        ("report", str(log), "--json"),
        ("report", str(log), "--html", str(tmp / "r.html")),
        ("replay", str(log), "--no-search", "--policies", "caching,exact"),
        ("replay", str(log), "--no-search", "--json"),
        ("export", str(log), "-o", str(tmp / "s.pickle")),
    ]


def check_every_tool(log: Path, tmp: Path) -> dict[tuple[str, ...], tuple[int, str, str]]:
    results = {}
    for argv in tools(log, tmp):
        status, out, err = run_tool(*argv)
        assert "Traceback (most recent" not in err and "Warning" not in err, (argv, err)
        if status != 0:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"torchalloc {argv[0]}: error: "), (argv, err)
        results[argv] = (status, out, err)
    return results


@pytest.fixture(scope="module")
def logs(library_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, int, str], Path]:
    """One log per (policy, stacks, phases, exit|kill): 24 processes."""
    root = tmp_path_factory.mktemp("every_log")
    made = {}
    for policy, stacks, phases, mode in itertools.product(POLICIES, (0, 1), (0, 1), ("exit", "kill")):
        key = (policy, stacks, phases, mode)
        made[key] = write_log(root / f"{policy}-s{stacks}-p{phases}-{mode}.talog", *key)
    return made


def test_every_tool_on_every_whole_log(logs: dict[tuple[str, int, int, str], Path], tmp_path: Path) -> None:
    peak = expected_peak(STEPS)
    for (policy, stacks, phases, mode), log in logs.items():
        # A normal exit closes the log (and trims its preallocation); a SIGKILL leaves it unclosed and unlocked.
        assert read_log(log).writer == ("closed" if mode == "exit" else "killed"), log.name
        if mode == "exit":
            assert log.stat().st_size < 1 << 20, log.name
        results = check_every_tool(log, tmp_path)
        assert all(status == 0 for status, _, _ in results.values()), (log.name, results)
        doc = json.loads(results[("report", str(log), "--json")][1])
        replayed = json.loads(results[("replay", str(log), "--no-search", "--json")][1])
        # Requested bytes: the trace's peak. Block bytes (rounded and unsplit remainders, as
        # torch.cuda.memory_allocated counts them): the report's, equal to a replay by the recording policy.
        assert replayed["trace"]["peak_allocated"] == peak, log.name
        assert doc["peak_allocated"] == replayed["policies"][policy]["peak_allocated"], log.name
        if policy == "exact":
            assert doc["peak_allocated"] == peak
        assert doc["has_stacks"] == bool(stacks)
        assert [m["at"] for m in doc["markers"]] == [f"marker 'step {i}'" for i in range(STEPS)], log.name
        # Live at each step's end: the first step's gradient, 3 MiB requested, and nothing else.
        assert [r["requested"] for m in doc["markers"] for r in m["rows"]] == [3 * MiB] * STEPS, log.name
        phase_names = {row["phase"] for row in doc["phases"]}
        assert ({"forward", "backward"} <= phase_names) == bool(phases), (log.name, phase_names)
        assert replayed["trace"]["recorded_peak_reserved"] == replayed["policies"][policy]["peak_reserved"], \
            log.name  # replaying the recording policy reproduces what it reserved
        text = results[("report", str(log))][1]
        assert "== Timeline" in text and "Nothing to report" not in text
        assert (tmp_path / "r.html").stat().st_size > 0 and (tmp_path / "s.pickle").stat().st_size > 0


def test_every_tool_on_logs_cut_short(logs: dict[tuple[str, int, int, str], Path], tmp_path: Path) -> None:
    """Cut inside the header, at a third, in the middle of the last records: each tool reads what is there
    or says in one line why it cannot."""
    for key in (("caching", 1, 1, "exit"), ("phase_arena", 0, 1, "kill"), ("exact", 1, 0, "exit")):
        data = logs[key].read_bytes().rstrip(b"\0")  # a killed log keeps its zero-filled preallocation
        for cut in (0, 7, 40, len(data) // 3, len(data) - 5, len(data) - 1):
            log = tmp_path / f"cut-{'-'.join(map(str, key))}-{cut}.talog"
            log.write_bytes(data[:cut])
            results = check_every_tool(log, tmp_path)
            if cut == 0:
                assert all(status != 0 for status, _, _ in results.values()), results  # an empty file is no log
            if cut >= len(data) // 3:  # records survive: every tool reads them, and says the end is cut
                assert all(status == 0 for status, _, _ in results.values()), (log.name, results)
                report_text = results[("report", str(log))][1] + results[("report", str(log))][2]
                assert "note:" in report_text, report_text[:2000]


def test_a_log_with_nothing_in_it_says_so(library_path: Path, tmp_path: Path) -> None:
    log = write_log(tmp_path / "empty.talog", "caching", 0, 0, "exit", steps=0)
    results = check_every_tool(log, tmp_path)
    assert all(status == 0 for status, _, _ in results.values()), results
    assert "Nothing to report: the log holds no allocation" in results[("report", str(log))][1]
    assert "nothing to replay" in results[("replay", str(log), "--no-search", "--policies", "caching,exact")][2]


def test_tool_errors_are_one_line(library_path: Path, tmp_path: Path) -> None:
    """Bad paths and non-logs, for every verb: one line, the verb named, a status other than 0."""
    snapshot = tmp_path / "snap.pickle"
    snapshot.write_bytes(b"\x80\x04\x95" + b"\0" * 8 + b"}" + b"\0" * 23)  # starts a pickled dict, as a snapshot does
    cases = [
        (("report", str(tmp_path)), "is a directory"),
        (("report", str(tmp_path / "absent.talog")), "no such file"),
        (("report", str(snapshot)), "PyTorch memory snapshot (a pickle), not a torchalloc log"),
        (("export", str(snapshot), "-o", str(tmp_path / "x.pickle")), "`torchalloc replay"),
        (("export", str(tmp_path / "absent.talog"), "-o", str(tmp_path / "x.pickle")), "no such file"),
        (("replay", "--policies", "cachng"), "expected caching, exact or phase_arena"),
        (("replay", "--capacity", "lots"), "--capacity"),
        (("replay", str(tmp_path)), "is a directory"),
    ]
    log = write_log(tmp_path / "ok.talog", "caching", 0, 0, "exit", steps=1)
    cases += [
        (("report", str(log), "--html", str(tmp_path / "no" / "r.html")), "does not exist"),
        (("report", str(log), "--png", str(tmp_path)), "is a directory"),
        (("export", str(log), "-o", str(tmp_path / "no" / "s.pickle")), "does not exist"),
        (("report", str(log), "--at", "no such marker"), "no marker"),
    ]
    for argv, fragment in cases:
        status, _, err = run_tool(*argv)
        lines = err.strip().splitlines()
        assert status != 0 and len(lines) == 1, (argv, err)
        assert lines[0].startswith(f"torchalloc {argv[0]}: error: ") and fragment in lines[0], (argv, err)
    assert not (tmp_path / "no").exists()


def test_an_unexpected_exception_is_one_line_that_asks_for_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(argv: list[str]) -> int:
        raise KeyError("boom")

    monkeypatch.setitem(cli.COMMANDS, "broken", cli.Command("cli.dispatch", "_broken", "test"))
    monkeypatch.setattr(cli, "_broken", broken, raising=False)
    monkeypatch.delenv("TORCHALLOC_DEBUG", raising=False)
    status, _, err = run_tool("broken")
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert "internal error (KeyError: 'boom')" in err and "TORCHALLOC_DEBUG=1" in err
    monkeypatch.setenv("TORCHALLOC_DEBUG", "1")
    status, _, err = run_tool("broken")
    assert status == 1 and "Traceback" in err  # on request
