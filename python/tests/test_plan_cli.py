"""`torchalloc plan` as a user runs it: on the bundled data, with its JSON, within the terminal's width, taking the
capacity from the log when the log says it, and refusing bad input with one line and exit 2."""
from __future__ import annotations

import ctypes
import json
import sys
from typing import Any, Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import cli  # noqa: E402
from plan_runs import training, write  # noqa: E402

from torchalloc.replay.engine import DEFAULT_POLICIES, INSTALL_DEFAULT  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "torchalloc" / "data"
DEMO, PHASES = str(DATA / "demo_trace.talog.xz"), str(DATA / "phases_trace.talog.xz")
GiB = 1 << 30


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan_cli")


def one_line_exit_2(status: int, out: str, err: str) -> str:
    assert status == 2 and out == "", (status, out)
    assert err.count("\n") == 1 and err.startswith("torchalloc plan: error: "), err
    return err


def test_the_bundled_demo_every_policy_and_the_recorded_run(library_path: Path) -> None:
    status, out, err = cli("plan", "--capacity", "4GiB", "--batch", "3x")
    assert status == 0, err
    assert " ".join(out.split()).startswith(f"torchalloc plan: {DEMO} -- device 0, at 3x the recorded batch")
    lines = out.splitlines()
    for policy in DEFAULT_POLICIES:
        assert any(line.startswith(policy + (" *" if policy == INSTALL_DEFAULT else "") + " ") for line in lines), policy
    assert any(line.startswith("recorded (caching), at 1x") for line in lines)
    assert "The setting that fits the most in 4 GiB: TORCHALLOC_CONF=" in " ".join(out.split())
    for limit in ("Steps: 5 complete", "Algorithms: assumed the same at 3x", "Attributed at the recorded peak"):
        assert limit in " ".join(out.split()), limit


def test_json_on_the_phases_trace(library_path: Path) -> None:
    status, out, err = cli("plan", PHASES, "--capacity", "16GiB", "--batch", "48", "--recorded", "16", "--json",
                           "--policies", f"caching,{INSTALL_DEFAULT}")
    assert status == 0, err
    data = json.loads(out)
    assert data["multiple"] == 3.0 and data["batch"] == 48 and data["recorded_batch"] == 16
    assert data["capacity"] == 16 * GiB and data["capacity_from"] == "--capacity"
    assert set(data["policies"]) == {"caching", INSTALL_DEFAULT}
    default = data["policies"][INSTALL_DEFAULT]
    assert default["default"] and not data["policies"]["caching"]["default"] and data["policies"]["caching"]["pytorch"]
    assert default["peak_allocated"] > data["recorded"]["peak_allocated"] * 2
    assert default["largest_batch"] == round(default["largest_multiple"] * 16)
    assert data["best"]["setting"].startswith("policy:caching")
    assert data["steps"]["by"] == "the end of each optimizer phase" and data["steps"]["complete"] == 200
    assert set(data["limits"]) >= {"order", "steps", "algorithms", "unattributed"}
    assert "apart" in data["limits"]["steps"]  # its batch and length were drawn per step


def test_two_logs_at_two_sequence_lengths(folder: Path, library_path: Path) -> None:
    a, b = write(training(2, 128), folder, "s128.talog"), write(training(2, 256), folder, "s256.talog")
    status, out, err = cli("plan", str(a), str(b), "--capacity", "1GiB", "--batch", "1024", "--recorded", "128,256")
    assert status == 0, err
    text = " ".join(out.split())
    assert "at batch 1024 (8x the recorded 128)" in text
    assert "two runs, the second 2x the first: each allocation's law measured allocation by allocation" in text
    assert "quadratic" in text and "linear" in text


@pytest.mark.parametrize("said,capacity,source", [
    ({"device_memory": (24 * GiB, 0)}, 24 * GiB, "the recording GPU's (from the log)"),
    ({"device_memory": (24 * GiB, 12 * GiB)}, 12 * GiB, "the recording GPU's memory fraction (from the log)"),
    ({"oom_device": 20 * GiB}, 20 * GiB, "the recording GPU's (from its OOM record)"),
])
def test_the_capacity_comes_from_the_log_when_it_says_it(said: dict[str, object], capacity: int, source: str,
                                                         folder: Path, library_path: Path) -> None:
    path = write(training(4, **said), folder, f"said{len(source)}.talog")  # type: ignore[arg-type]
    status, out, err = cli("plan", str(path), "--json", "--no-search")
    assert status == 0, err
    data = json.loads(out)
    assert data["capacity"] == capacity and data["capacity_from"] == source


def test_no_search_says_the_largest_was_not_searched(folder: Path, library_path: Path) -> None:
    """--no-search leaves the largest multiple unknown: never 'none' nor 'no setting fits' (which it once said
    of a run that fitted 24 times over)."""
    path = write(training(4), folder, "nosearch.talog")
    status, out, err = cli("plan", str(path), "--capacity", "80GiB", "--no-search")
    assert status == 0, err
    text = " ".join(out.split())
    assert "largest that fits: not searched." in text and "No setting fits" not in text
    rows = [line.split() for line in out.splitlines() if line.startswith(("caching", "exact", "phase_arena"))]
    assert rows and all(r[-1] == "-" and "yes" in r for r in rows), rows
    status, out, err = cli("plan", str(path), "--capacity", "80GiB", "--no-search", "--json")
    data = json.loads(out)
    assert data["best"] is None and not any(p["largest_searched"] for p in data["policies"].values())


def test_a_multiple_past_any_device_still_searches_the_largest_that_fits(library_path: Path) -> None:
    """At 100000x the demo's blocks are past any device; the largest multiple that fits 4 GiB is still found (it
    once said 'none' and 'No setting fits 4 GiB at any multiple of the batch' of a trace that fits at 1x)."""
    status, out, err = cli("plan", DEMO, "--capacity", "4GiB", "--batch", "100000x", "--policies", "caching+reclaim",
                           "--json")
    assert status == 0, err
    row = json.loads(out)["policies"]["caching+reclaim"]
    assert row["too_large"] and row["fits"] is False and row["largest_searched"]
    assert row["largest_multiple"] is not None and 1.0 <= row["largest_multiple"] < 100000
    status, out, err = cli("plan", DEMO, "--capacity", "4GiB", "--batch", "100000x", "--policies", "caching+reclaim")
    assert status == 0, err
    assert "No setting fits" not in " ".join(out.split())


def test_a_log_the_library_wrote_says_its_devices_memory(sim: object, tmp_path: Path) -> None:
    """The library's log says the (simulated) device's 1 GiB before its first segment, and a memory fraction
    when it is set: what plan takes for the capacity when none is given."""
    from torchalloc import _lib
    from torchalloc.analysis import analyze

    lib = _lib.lib()
    path = tmp_path / "sim.talog"
    assert lib.torchalloc_log_open(str(path).encode()) == 0
    block = lib.torchalloc_malloc(4 << 20, 0, None)
    assert block
    assert analyze_closed(lib, path, analyze) == (GiB, 0)
    assert lib.torchalloc_log_open(str(path).encode()) == 0
    lib.torchalloc_set_memory_fraction(ctypes.c_double(0.5), 0)
    lib.torchalloc_free(block, 4 << 20, 0, None)
    assert analyze_closed(lib, path, analyze) == (GiB, GiB // 2)


def analyze_closed(lib: ctypes.CDLL, path: Path, analyze: Callable[[Path], Any]) -> tuple[int, int] | None:
    lib.torchalloc_log_close()
    return analyze(path).scan.device_memory  # type: ignore[no-any-return]


@pytest.mark.parametrize("args,says", [
    (("--batch", "abc"), "--batch 'abc': not a positive number"),
    (("--batch", "0x"), "--batch '0': not a positive number"),
    (("--batch", "-2x"), "--batch '-2': not a positive number"),
    (("--batch", "nanx"), "--batch 'nan': not a positive number"),
    (("--batch", "2y"), "--batch '2y': not a positive number"),
    (("--batch", "96"), "--batch 96: a batch size needs the one the log was recorded at"),
    (("--batch", "96", "--recorded", "none"), "--recorded 'none': not a positive number"),
    (("--capacity", "lots"), "--capacity:"),
])
def test_a_batch_or_size_that_is_not_a_number(args: tuple[str, ...], says: str, library_path: Path) -> None:
    err = one_line_exit_2(*cli("plan", *args))
    assert says in err


def test_a_log_with_no_complete_step(folder: Path, library_path: Path) -> None:
    path = write(training(2, cut_after="backward"), folder, "cut.talog")
    err = one_line_exit_2(*cli("plan", str(path), "--capacity", "1GiB"))
    assert "no complete step" in err and "markers like" not in err  # one marker: the steps are the phases'


def test_a_log_with_no_block_that_scales(folder: Path, library_path: Path) -> None:
    from synthlog import SynthLog

    L = SynthLog()
    L.alloc(1 << 32, 1 << 20)
    path = write(L, folder, "flat.talog")
    err = one_line_exit_2(*cli("plan", str(path), "--capacity", "1GiB"))
    assert "no block whose size scales with the batch" in err


def test_a_log_that_does_not_say_its_gpus_memory_needs_a_capacity(library_path: Path) -> None:
    err = one_line_exit_2(*cli("plan", DEMO))
    assert "does not say how much memory its GPU had" in err and "--capacity 80GiB" in err


def test_three_logs_or_a_snapshot_are_refused(library_path: Path) -> None:
    one_line_exit_2(*cli("plan", DEMO, DEMO, DEMO, "--capacity", "1GiB"))
    err = one_line_exit_2(*cli("plan", str(DATA / "default_trace.pickle.xz"), "--capacity", "1GiB"))
    assert "snapshot" in err


@pytest.mark.parametrize("width", [60, 80, 100])
def test_every_line_fits_the_terminal(width: int, folder: Path, monkeypatch: pytest.MonkeyPatch,
                                      library_path: Path) -> None:
    write(training(4), folder, "w.talog")
    monkeypatch.chdir(folder)
    monkeypatch.setenv("COLUMNS", str(width))
    status, out, err = cli("plan", "w.talog", "--capacity", "1GiB", "--recorded", "4", "--batch", "10")
    assert status == 0, err
    wide = [line for line in out.splitlines() if len(line) > width]
    assert not wide, "\n".join(wide)


def test_progress_goes_to_stderr_on_a_terminal(capsys: pytest.CaptureFixture[str], folder: Path,
                                               library_path: Path) -> None:
    """On a terminal the plan says what it does on one line of stderr, rewritten in place and cleared at the
    end; in a pipe (the tests above), nothing."""
    from torchalloc.plan import Progress, make_plan, one_run, read_run

    model = one_run(read_run(write(training(4), folder, "progress.talog")))
    progress = Progress(enabled=True)
    make_plan(model, 2.0, 1 << 30, policies=[INSTALL_DEFAULT], progress=progress)
    progress.close()
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.split("\r\033[K")
    assert lines[0] == "" and lines[-1] == ""  # each rewrites the line; the last clears it
    assert lines[1].startswith("torchalloc plan: replaying 2x under 1 policy 0/")
    done, total = lines[-2].split()[-2].split("/")
    assert done == total and int(done) > 2  # the count ends where the search did
    assert Progress().enabled is False  # stderr is not a terminal here
