"""What replay says, reproducibly (issue 50): `--handle SIZES` and `--run SIZES` replay the sizes that
TORCHALLOC_CONF's `handle` and `run` keys set, side by side, so that the README's rows are what the tool prints
(the quotes replay-handle and replay-run); and its count of events says what it counts, beside the report's count
of the same log."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_in_process import cli
from torchalloc._lib import ReplayError
from torchalloc import _records as R
from torchalloc.log.reader import read_log
from torchalloc.log.trace import load_trace
from torchalloc.replay import engine


def test_each_handle_size_is_a_row_and_matches_the_library_under_that_setting(library_path: Path) -> None:
    status, out, err = cli("replay", "--json", "--no-search", "--policies", "caching,caching+reclaim",
                           "--handle", "2MiB,16MiB")
    assert status == 0, err
    rows = json.loads(out)["policies"]
    assert list(rows) == ["caching", "caching+reclaim,handle:2MiB", "caching+reclaim,handle:16MiB"]
    trace = load_trace(engine.default_trace_path())
    for name in ("caching+reclaim,handle:2MiB", "caching+reclaim,handle:16MiB"):
        result, _ = engine.replay_once(trace, name)
        assert rows[name]["peak_reserved"] == result["peak_reserved"]
    assert rows["caching+reclaim,handle:2MiB"]["peak_reserved"] < rows["caching+reclaim,handle:16MiB"]["peak_reserved"]


def test_a_bad_size_or_no_expandable_policy_is_one_clear_line(library_path: Path) -> None:
    status, out, err = cli("replay", "--policies", "caching+reclaim", "--handle", "3MiB")
    assert status != 0 and not out and err.count("\n") == 1
    assert "handle" in err and "multiple of 2 MiB" in err
    status, out, err = cli("replay", "--policies", "caching,exact", "--handle", "4MiB")
    assert status == 2 and err.count("\n") == 1 and "+reclaim" in err
    with pytest.raises(ReplayError, match="policy 'caching,nonsense:1'"):
        engine.replay_once(load_trace(engine.default_trace_path()), "caching,nonsense:1")


def test_replay_and_report_count_the_same_log_each_saying_what_it_counts(library_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    log = str(Path(engine.DATA_DIR) / "phases_trace.talog.xz")
    kinds = read_log(log).records["kind"]
    replayed = int(sum((kinds == k).sum() for k in (R.ALLOC, R.FREE, R.PHASE_BEGIN, R.PHASE_END)))
    assert replayed < len(kinds)  # the log has segment records (and an END) too
    status, out, err = cli("replay", log, "--policies", "caching", "--no-search")
    assert status == 0, err
    said = re.search(r"([\d,]+) allocations, frees and phase changes replayed; a report counts the log's other "
                     r"records too", out)
    assert said and int(said.group(1).replace(",", "")) == replayed, out.splitlines()[0]
    status, out, err = cli("report", log)
    assert status == 0, err
    assert f" {len(kinds)} events," in out.splitlines()[0]


def test_each_run_size_is_a_row_beside_handle_sizes(library_path: Path) -> None:
    status, out, err = cli("replay", "--json", "--no-search", "--policies", "caching,caching+reclaim",
                           "--handle", "8MiB", "--run", "0,32MiB,64MiB")
    assert status == 0, err
    rows = json.loads(out)["policies"]
    assert list(rows) == ["caching", "caching+reclaim,handle:8MiB,run:0", "caching+reclaim,handle:8MiB,run:32MiB",
                          "caching+reclaim,handle:8MiB,run:64MiB"]
    trace = load_trace(engine.default_trace_path())
    default, _ = engine.replay_once(trace, "caching+reclaim")
    none, _ = engine.replay_once(trace, "caching+reclaim,run:0")
    runs, _ = engine.replay_once(trace, "caching+reclaim,run:64MiB")
    for name, replayed in (("run:0", none), ("run:32MiB", default), ("run:64MiB", runs)):  # 32 MiB: the default
        row = rows[f"caching+reclaim,handle:8MiB,{name}"]
        assert (row["peak_reserved"], row["handles_moved"]) == (replayed["peak_reserved"],
                                                                replayed["handles_moved"]), name
    assert runs["handles_created"] <= default["handles_created"] < none["handles_created"]  # fewer, larger handles
    status, out, err = cli("replay", "--policies", "caching+reclaim", "--run", "3MiB")
    assert status != 0 and not out and err.count("\n") == 1 and "run" in err and "multiple of 2 MiB" in err
    status, out, err = cli("replay", "--policies", "caching", "--run", "64MiB")
    assert status == 2 and err.count("\n") == 1 and "+reclaim" in err
