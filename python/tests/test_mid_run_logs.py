"""Logs opened mid-run (issue 23, findings 2 and 4): a log that sees frees of blocks allocated before it began.

Every %p child log and every log opened after the first allocation is one.
Written here by the C library on the simulated device (torchalloc_log_open
after some allocations), then put through the three tools as a user runs
them: `replay` once crashed on every such log under numpy 2 (np.concatenate
dropped the replay event dtype's padding), and `report` gave a peak that
left out the blocks the log only saw freed.
"""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_in_process import cli  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30


def record_mid_run(path: Path, before: list[int], after: list[tuple[str, Any]]) -> None:
    """Allocate `before` (sizes) with no log, open the log at `path`, then run `after`:
    ("free", k) frees the k-th block of `before`, ("alloc", size) allocates."""
    from torchalloc import _lib

    if not _lib.has("torchalloc_log_open"):
        pytest.skip("the library has no event log")
    lib = _lib.lib()
    _lib.init("backend:sim,sim_capacity:64GiB,warn:0,oom_report:off")
    try:
        early = [lib.torchalloc_malloc(size, 0, None) for size in before]
        assert all(early), _lib.last_error()
        assert lib.torchalloc_log_open(os.fsencode(str(path))) == 0, _lib.last_error()
        for op, arg in after:
            if op == "free":
                lib.torchalloc_free(early[arg], before[arg], 0, None)
            else:
                assert lib.torchalloc_malloc(arg, 0, None), _lib.last_error()
        lib.torchalloc_log_close()
    finally:
        _lib.teardown()




@pytest.fixture
def mid_run_log(library_path: Path, tmp_path: Path) -> Path:
    path = tmp_path / "late.talog"
    record_mid_run(path, [8 * MiB, MiB, 4 * MiB], [("free", 0), ("alloc", 2 * MiB), ("free", 1)])
    return path


def test_replay_report_and_export_read_a_log_opened_mid_run(mid_run_log: Path, tmp_path: Path) -> None:
    from torchalloc.log import trace
    from torchalloc.log.trace import EVENT_DTYPE

    t = trace.load_trace(mid_run_log)
    assert t.prelude == 2 and t.events.dtype == EVENT_DTYPE  # numpy 2 once gave a packed dtype here
    status, out, err = cli("replay", str(mid_run_log), "--json", "--no-search")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["trace"]["events"] == 5 and set(doc["policies"]) >= {"caching", "exact"}
    assert "internal error" not in err
    status, out, err = cli("report", str(mid_run_log))
    assert status == 0 and "2 blocks were allocated before the log began" in out, err
    status, out, err = cli("report", str(mid_run_log), "--json")
    assert status == 0 and json.loads(out)["peak_allocated"] == 9 * MiB, err
    snap = tmp_path / "late.pickle"
    status, out, err = cli("export", str(mid_run_log), "-o", str(snap))
    assert status == 0, err
    frees = [e for e in pickle.loads(snap.read_bytes())["device_traces"][0] if e["action"] == "free_completed"]
    assert sorted(e["size"] for e in frees) == [MiB, 8 * MiB]


def test_the_peak_counts_blocks_allocated_before_the_log(library_path: Path, tmp_path: Path) -> None:
    """A 20 GiB block allocated before the log, freed after it opened, then 1 MiB allocated:
    the peak is 20 GiB (at the log's opening), not 1 MiB."""
    from torchalloc.analysis import analyze

    path = tmp_path / "big-before.talog"
    record_mid_run(path, [20 * GiB], [("free", 0), ("alloc", MiB)])
    a = analyze(path)
    assert a.timeline.peak_allocated == 20 * GiB
    assert a.timeline.peak_t == 0.0
    peak = a.anatomy("peak")
    assert peak.allocated == 20 * GiB and sum(r.bytes for r in peak.rows) == 20 * GiB
    assert [r.phase for r in peak.rows] == ["(before the log began)"]
    status, out, err = cli("report", str(path))
    assert status == 0, err
    assert "peak allocated 20.0 GiB" in out
    assert "lower bound" in out  # blocks allocated and freed before the log are not seen
    status, out, err = cli("report", str(path), "--json")
    doc = json.loads(out)
    assert doc["peak_allocated"] == 20 * GiB and doc["peak_anatomy"]["allocated"] == 20 * GiB
    assert any("lower bound" in n for n in doc["notes"])


def test_a_log_opened_before_any_allocation_has_no_lower_bound_note(library_path: Path, tmp_path: Path) -> None:
    from torchalloc.analysis import analyze

    path = tmp_path / "whole.talog"
    record_mid_run(path, [], [("alloc", MiB), ("alloc", 3 * MiB)])
    a = analyze(path)
    from torchalloc.log import read_log

    # no opening row: the analysis numbers the log's records alone
    assert a.timeline.peak_allocated == 4 * MiB and a.blocks.before_log == 0
    assert len(a.table) == len(read_log(path).records)
    assert not any("lower bound" in n for n in a.notes)

