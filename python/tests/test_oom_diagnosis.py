"""OOM diagnosis on the simulated device: the verdict, the blocks to blame, and the replay that checks the advice.

The fragmentation case is examples/fragmentation_demo.py's workload (a
sequence-length curriculum with a rolling cache), driven through the C
entry points on a 150 MiB simulated device: `caching` fails with live
memory far below the device, the report blames the cache entries, and the
replay says phase_arena fits -- which it then does.
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from torchalloc import _lib, last_oom
from torchalloc.analysis import analyze
from torchalloc.log.reader import read_log
from torchalloc.replay.engine import min_capacity, replay_once
from torchalloc.log.trace import load_trace
from torchalloc.log.trace_events import ALLOC, EVENT_DTYPE, live_peaks

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import fragmentation_demo as demo  # noqa: E402

MiB = 1 << 20
CAP = 150 * MiB
HERE = Path(__file__).name


def alloc_activation(lib: ctypes.CDLL, size: int) -> int | None:
    return lib.torchalloc_malloc(size, 0, None)  # activation site


def alloc_cache_entry(lib: ctypes.CDLL, size: int) -> int | None:
    return lib.torchalloc_malloc(size, 0, None)  # cache-entry site


def run_workload(lib: ctypes.CDLL, phases: bool = True) -> bool:
    """The demo's workload on the configured device; True when it completes, False at the first failure."""
    live: dict[int, tuple[int, int]] = {}
    for op, key, size, name in demo.workload():
        if op == "free":
            ptr, n = live.pop(key)
            lib.torchalloc_free(ptr, n, 0, None)
            continue
        if phases:
            assert lib.torchalloc_phase_begin(name.encode()) >= 0
        ptr = alloc_cache_entry(lib, size) if name == "cache" else alloc_activation(lib, size)
        if phases:
            assert lib.torchalloc_phase_end(name.encode()) == 0
        if not ptr:
            return False
        live[key] = (ptr, size)
    for ptr, n in live.values():
        lib.torchalloc_free(ptr, n, 0, None)
    return True


def logged_run(tmp_path: Path, policy: str, extra: str = "", phases: bool = True) -> tuple[bool, Path]:
    log = tmp_path / f"{policy}.talog"
    # Ordinary segments: the workload fragments them (the default mode does not run out: test_reclaim.py).
    _lib.init(f"backend:sim,warn:0,oom_report:off,sim_capacity:{CAP},policy:{policy},log:{log},expandable:off{extra}")
    done = run_workload(_lib.lib(), phases)
    return done, log


@pytest.fixture
def clean(library_path: Path):  # type: ignore[no-untyped-def]
    yield
    _lib.teardown()


def test_fragmentation_is_diagnosed_blamed_and_fixed(clean: None, tmp_path: Path) -> None:
    assert demo.live_peak() < CAP * 0.75  # live memory stays well below the device
    completed, log = logged_run(tmp_path, "caching", ",stacks:1")
    assert not completed, "caching should run out on this workload"
    oom = last_oom(0)
    assert oom is not None and oom.verdict == "fragmentation"
    assert oom.allocated + oom.requested < CAP * 0.9 and oom.reserved - oom.allocated >= oom.requested
    assert "Live blocks pinning" in oom.report and "alloc_cache_entry" in oom.report  # the C report's blame
    _lib.teardown()  # closes the log

    (row,) = analyze(log).ooms()
    assert row.verdict == "fragmentation" and row.verdict_from == "the allocator, at the failure"
    assert row.device_total == CAP and row.usable == CAP
    assert row.blockers and all(b.site.startswith(HERE) for b in row.blockers)
    assert any(f"{HERE}:" in b.site for b in row.blockers)
    cache_line = alloc_cache_entry.__code__.co_firstlineno + 1
    assert sum(b.site == f"{HERE}:{cache_line} alloc_cache_entry" for b in row.blockers) >= len(row.blockers) // 2
    by_policy = {a.policy: a for a in row.alternatives}
    assert not by_policy["caching"].fits and by_policy["phase_arena"].fits
    assert by_policy["phase_arena"].needed < by_policy["caching"].needed
    assert f"phase_arena {'would have ' if row.alternatives[0].policy == 'phase_arena' else ''}needed" in row.explanation
    assert "caching needed" in row.explanation and "does not fit" in row.explanation

    # The replay's numbers are those of a direct replay of the same run, the failed request included.
    events = load_trace(log).events
    direct = np.zeros(len(events) + 1, dtype=EVENT_DTYPE)
    direct[:-1] = events
    direct["kind"][-1], direct["addr"][-1], direct["size"][-1] = ALLOC, int(events["addr"].max()) + MiB, row.requested
    direct["phase"][-1] = events["phase"][-1]
    _, floor = live_peaks(direct)
    for policy, alt in by_policy.items():
        free_run, _ = replay_once(direct, policy, 0)
        assert alt.peak_reserved == free_run["peak_reserved"]
        assert alt.needed == min_capacity(direct, policy, floor, int(free_run["peak_reserved"]))
        assert alt.fits == (not replay_once(direct, policy, CAP)[0]["oom"])

    # And the advice holds: phase_arena completes the same workload on the same device.
    completed, _ = logged_run(tmp_path, "phase_arena")
    assert completed


def test_a_log_without_stacks_or_phases_still_gets_a_verdict(clean: None, tmp_path: Path) -> None:
    completed, log = logged_run(tmp_path, "caching", phases=False)
    assert not completed
    _lib.teardown()
    (row,) = analyze(log).ooms()
    assert row.verdict == "fragmentation"
    assert any("sites" in u for u in row.unknown)  # it says what it could not know
    assert row.alternatives  # the replay needs no stacks


def test_a_log_cut_at_the_oom_gets_a_verdict_from_its_numbers(clean: None, tmp_path: Path) -> None:
    completed, log = logged_run(tmp_path, "caching")
    assert not completed
    path = _lib.lib().torchalloc_log_path().decode()
    _lib.teardown()
    data = Path(path).read_bytes()
    decoded = read_log(data, warn=False)
    cut_after = int(decoded.of_kind("oom")[0]["seq"]) + 1  # the oom record stays, its oom_device does not
    cut = data[:128 + 64 * cut_after]
    (tmp_path / "cut.talog").write_bytes(cut)
    (row,) = analyze(tmp_path / "cut.talog").ooms()
    assert row.verdict == "fragmentation" and row.verdict_from == "the numbers in the log"
    assert row.device_total is None and not row.alternatives
    assert any("device" in u for u in row.unknown)


@pytest.mark.parametrize("extra,verdict", [
    (",sim_capacity:64MiB", "capacity"),
    (",sim_capacity:64MiB,sim_held_elsewhere:40MiB", "held elsewhere"),
])
def test_each_verdict_reaches_the_report(clean: None, tmp_path: Path, extra: str, verdict: str) -> None:
    log = tmp_path / "v.talog"
    _lib.init(f"backend:sim,warn:0,oom_report:off,log:{log}{extra}")
    lib = _lib.lib()
    keep = lib.torchalloc_malloc(16 * MiB, 0, None) if verdict == "capacity" else None
    assert not lib.torchalloc_malloc(60 * MiB if verdict == "capacity" else 30 * MiB, 0, None)
    assert last_oom(0).verdict == verdict
    if keep:
        lib.torchalloc_free(keep, 16 * MiB, 0, None)
    _lib.teardown()
    (row,) = analyze(log).ooms()
    assert row.verdict == verdict
    assert verdict in row.explanation
    if verdict == "held elsewhere":
        assert row.held_elsewhere == 40 * MiB


def test_last_oom_is_none_before_any_failure(clean: None) -> None:
    _lib.init("backend:sim,warn:0,oom_report:off")
    assert last_oom(0) is None
    os.environ.pop("TORCHALLOC_CONF", None)
