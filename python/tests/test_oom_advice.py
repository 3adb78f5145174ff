"""OOM advice that is checked, on the simulated device: the figures, a fresh run that follows the first line,
and `torchalloc report`'s replay of the recorded run marking each line.

The workload is transformer_pattern.py's: a Llama-style decoder's requests
(8 layers, AdamW, bf16 autocast) with sequence lengths drawn from 256..2048,
driven through the C API under a 6560 MiB simulated device. `caching` runs
out there by fragmentation; the advice's first line names expandable:reclaim with
the bytes in whole free granules; a fresh process with that setting runs
all 40 steps; the report replays the log up to the failure and confirms it.
(CAP_MIB sits in the middle of the range where that holds: a scan of the
sim gave caching out of memory from 6320 to 6780 MiB, expandable:1
complete from 6380 MiB on.) The phase_arena line appears only where blocks
of another phase pin the fragmented segments; a line that would not have
helped is said to.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchalloc import _lib, last_oom, parse_advice
from torchalloc.analysis import analyze

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "examples"))
import fragmentation_demo as demo  # noqa: E402
import test_oom_diagnosis as diagnosis  # noqa: E402
import transformer_pattern as pattern  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
GRANULE = 2 * MiB
CAP_MIB = 6560
BASE = f"backend:sim,warn:0,oom_report:off,handle:2MiB,sim_capacity:{CAP_MIB}MiB"  # the 2 MiB holes case


def c_size(n: int) -> str:
    """Sizes as the C core writes them (ta_format_size) in the range these tests meet."""
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.2f} MiB" if n >= MiB else f"{n} bytes"


class SegmentInfo(ctypes.Structure):  # torchalloc_segment_info
    _fields_ = [("addr", ctypes.c_uint64), ("size", ctypes.c_uint64), ("stream", ctypes.c_uint64),
                ("pool_id", ctypes.c_uint64 * 2), ("first_block", ctypes.c_uint64), ("nblocks", ctypes.c_uint32),
                ("pool", ctypes.c_uint8), ("policy", ctypes.c_uint8), ("reserved_", ctypes.c_uint8 * 2)]


class BlockInfo(ctypes.Structure):  # torchalloc_block_info
    _fields_ = [("addr", ctypes.c_uint64), ("size", ctypes.c_uint64), ("requested", ctypes.c_uint64),
                ("stack", ctypes.c_uint32), ("phase", ctypes.c_uint16), ("state", ctypes.c_uint8),
                ("reserved_", ctypes.c_uint8)]


def free_granules_now(lib: ctypes.CDLL) -> int:
    """Bytes of free blocks in whole aligned granules, in segments that hold live blocks too: from the
    snapshot, apart from the heap's own pass."""
    ns, nb = ctypes.c_size_t(), ctypes.c_size_t()
    lib.torchalloc_snapshot(0, None, 0, None, 0, ctypes.byref(ns), ctypes.byref(nb))
    segs, blocks = (SegmentInfo * ns.value)(), (BlockInfo * nb.value)()
    assert lib.torchalloc_snapshot(0, segs, ns.value, blocks, nb.value, ctypes.byref(ns), ctypes.byref(nb)) == 0
    total = 0
    for s in segs:
        mine = blocks[s.first_block:s.first_block + s.nblocks]
        if all(b.state == 0 for b in mine):
            continue
        for b in mine:
            if b.state == 0:
                lo, hi = -(-b.addr // GRANULE) * GRANULE, (b.addr + b.size) // GRANULE * GRANULE
                total += max(0, hi - lo)
    return total


def run_child(conf: str, phases: bool = True) -> dict[str, object]:
    """The pattern in a fresh process under `conf`."""
    cmd = [sys.executable, str(HERE / "transformer_pattern.py"), conf, "{}"] + ([] if phases else ["no-phases"])
    env = dict(os.environ)
    env.pop("TORCHALLOC_CONF", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    for line in done.stdout.splitlines():
        if line.startswith(pattern.TAG):
            return json.loads(line[len(pattern.TAG):])
    raise AssertionError(f"child exited {done.returncode}: {done.stderr[-3000:]}")


@pytest.fixture
def clean(library_path: Path):  # type: ignore[no-untyped-def]
    yield
    _lib.teardown()


def test_fragmentation_advice_names_expandable_and_following_it_completes(clean: None, tmp_path: Path) -> None:
    log = tmp_path / "caching.talog"
    _lib.init(f"{BASE},policy:caching,expandable:off,log:{log}")
    seen: list[int] = []
    completed, step = pattern.drive(_lib.lib(), phases=False, at_failure=lambda: seen.append(free_granules_now(_lib.lib())))
    assert not completed, "caching should run out of memory on this pattern under the cap"
    oom = last_oom(0)
    assert oom is not None and oom.verdict == "fragmentation"
    (granules,) = seen

    # The figures: the bytes in whole free granules, as the snapshot has them, cover the request.
    d = oom.detail
    assert d["granule"] == GRANULE and d["free_granules"] == granules and d["pinning_other"] == 0
    headroom = min(oom.device_total, oom.device_free + oom.reserved) - oom.reserved
    want = -(-oom.requested // GRANULE) * GRANULE
    assert granules + d["free_segments"] + headroom >= want  # the line's claim, from the snapshot's bytes
    first = oom.advice[0]
    assert first.setting == "expandable:reclaim" and first.serves is True and first.conf == {"expandable": "reclaim"}
    assert first.text.startswith(f"expandable:reclaim would have served this request: {c_size(granules)} in whole free "
                                 f"2 MiB granules")
    assert f">= {c_size(oom.requested)} requested" in first.text and "[based on the free blocks of" in first.text
    assert all(a.basis for a in oom.advice)  # every line says what it rests on
    assert "phase_arena" not in oom.summary  # one phase: nothing for phase_arena to keep apart
    assert parse_advice(oom.report)[0] == first  # the report file carries the same lines
    _lib.teardown()  # closes the log

    # Followed in a fresh process: the same pattern, the advised setting, all steps.
    conf = f"{BASE},policy:caching," + ",".join(f"{k}:{v}" for k, v in first.conf.items())
    after = run_child(conf, phases=False)
    assert after["completed"] is True and after["step"] == pattern.Config().steps - 1, after
    before = run_child(f"{BASE},policy:caching,expandable:off", phases=False)  # and the child reproduces the failure
    assert before["completed"] is False and before["step"] == step and parse_advice(str(before["summary"]))[0] == first

    # The offline check: the log's numbers give the same line, and the replay confirms it.
    (row,) = analyze(log).ooms()
    assert row.policy == "caching" and row.expandable == 0
    assert row.advice[0].text == first.text
    assert row.advice[0].confirmed is True and row.advice[0].replayed == "caching+reclaim"
    assert row.advice[0].check.startswith("confirmed by replay: caching+reclaim fits in 6.4 GiB, peak reserved ")
    by_policy = {a.policy: a for a in row.alternatives}
    assert not by_policy["caching"].fits and by_policy["caching+reclaim"].fits
    assert row.advice[-1].confirmed is None and "not checked by replay" in row.advice[-1].check


@pytest.mark.parametrize("handle", [0, 4])
def test_the_report_counts_in_the_handles_the_allocator_counted_in(clean: None, tmp_path: Path, handle: int) -> None:
    """With the default `handle` (8 MiB for large requests), or another, the advice counts whole free granules of
    the device's 2 MiB: on the out-of-memory path expandable segments replace a large handle that holds free 2 MiB
    granules, so those go back too. The log's oom_device record carries that size, so the report gives the very
    same line, in one piece or in pieces."""
    log = tmp_path / "handle.talog"
    conf = f"backend:sim,warn:0,oom_report:off,sim_capacity:{CAP_MIB}MiB,policy:caching,expandable:off,log:{log}"
    _lib.init(conf + (f",handle:{handle}MiB" if handle else ""))
    assert not pattern.drive(_lib.lib(), phases=False)[0]
    oom = last_oom(0)
    granule = 2 * MiB
    assert oom.requested > MiB and oom.detail["granule"] == granule  # a large-pool request
    first = oom.advice[0]
    assert first.setting == "expandable:reclaim" and f"in whole free {granule >> 20} MiB granules" in first.text
    _lib.teardown()
    (whole,) = analyze(log).ooms()
    (streamed,) = analyze(log, chunk_records=4096).ooms()
    assert whole.advice[0].text == streamed.advice[0].text == first.text
    assert whole.advice[0].confirmed is True and whole.advice[0].replayed == "caching+reclaim"


def test_the_report_marks_the_advice_in_text_json_and_html(clean: None, tmp_path: Path) -> None:
    log = tmp_path / "caching.talog"
    _lib.init(f"{BASE},policy:caching,expandable:off,log:{log}")
    assert pattern.drive(_lib.lib(), phases=False) == (False, 2)
    _lib.teardown()
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    cli = [sys.executable, "-m", "torchalloc.cli", "report", str(log)]
    text = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=600, check=True).stdout
    assert "Advice for OOM 1, each line checked by replaying the run up to it:" in text
    assert "1. expandable:reclaim would have served this request:" in text
    assert "-> confirmed by replay: caching+reclaim fits in 6.4 GiB" in text
    data = json.loads(subprocess.run(cli + ["--json"], capture_output=True, text=True, env=env, timeout=600,
                                     check=True).stdout)
    advice = data["ooms"][0]["advice"]
    assert advice[0]["setting"] == "expandable:reclaim" and advice[0]["confirmed"] is True
    assert advice[0]["replayed"] == "caching+reclaim" and advice[-1]["confirmed"] is None
    html = tmp_path / "r.html"
    subprocess.run(cli + ["--html", str(html)], capture_output=True, text=True, env=env, timeout=600, check=True)
    page = html.read_text()
    assert '<ol class="advice">' in page and 'class="check confirmed">confirmed by replay: caching+reclaim' in page
    assert '"advice": [{"number": 1' in page or '"advice":[{"number":1' in page  # the page's data, for its OOM box


def test_phase_arena_advice_names_the_phases_that_pin(clean: None, tmp_path: Path) -> None:
    log = tmp_path / "phases.talog"
    _lib.init(f"{BASE},policy:caching,expandable:off,log:{log}")
    assert not pattern.drive(_lib.lib(), phases=True)[0]
    oom = last_oom(0)
    d = oom.detail
    names = {i: _lib.lib().torchalloc_phase_name(i).decode() for i in range(1, _lib.lib().torchalloc_phase_count())}
    assert d["pinning_other"] > 0 and names[d["phase"]] == "forward"
    lines = {a.setting: a for a in oom.advice}
    line = lines["policy:phase_arena"]
    assert line.number == 2  # after expandable:reclaim, whose figures cover the request
    top = [names[p] for p, b in zip(d["other_phases"], d["other_bytes"]) if b]
    assert top[0] == "optimizer"  # AdamW's states, allocated in the first step's free memory
    assert f"allocated in phase '{top[0]}' ({c_size(d['other_bytes'][0])})" in line.text
    assert f"{c_size(d['pinning_other'])} of the {c_size(d['pinning'])} of live blocks pinning" in line.text
    assert "the request in phase 'forward'" in line.text
    _lib.teardown()
    (row,) = analyze(log).ooms()
    checked = {a.setting: a for a in row.advice}["policy:phase_arena"]
    assert checked.text == line.text and checked.replayed == "phase_arena"
    assert checked.confirmed == {a.policy: a for a in row.alternatives}["phase_arena"].fits


@pytest.mark.parametrize("phases", [True, False])
def test_phase_arena_advice_only_when_another_phase_pins(clean: None, phases: bool) -> None:
    """The demo's cache entries (phase "cache") pin the activations' segments (phase "forward"): the line
    appears with phases and names both; without phases every block is the request's phase, and it does not."""
    _lib.init(f"backend:sim,warn:0,oom_report:off,sim_capacity:{diagnosis.CAP},policy:caching,expandable:off")
    assert not diagnosis.run_workload(_lib.lib(), phases)
    oom = last_oom(0)
    assert oom.verdict == "fragmentation"
    settings = [a.setting for a in oom.advice]
    if phases:
        assert settings[:2] == ["expandable:reclaim", "policy:phase_arena"]
        assert "allocated in phase 'cache' (" in oom.advice[1].text
        assert "the request in phase 'forward'" in oom.advice[1].text
    else:
        assert "policy:phase_arena" not in settings and oom.detail["pinning_other"] == 0
        assert "arenas per phase would not keep them apart" in oom.report


def test_a_line_that_would_not_have_helped_is_said_so(clean: None, tmp_path: Path) -> None:
    """A memory fraction of 64 MiB on a 1 GiB device; 6 MiB blocks fill it, every other one is freed (30 MiB
    live pins three 20 MiB segments), then 40 MiB is asked for: held elsewhere (70 MiB needed > 64). The
    advice asks for the fraction that holds 70 MiB -- but caching, its segments pinned, would need 100 MiB:
    the replay at that fraction says the line would not have helped."""
    log = tmp_path / "fraction.talog"
    _lib.init(f"backend:sim,warn:0,oom_report:off,sim_capacity:1GiB,policy:caching,expandable:off,log:{log}")
    lib = _lib.lib()
    lib.torchalloc_set_memory_fraction(64 / 1024, 0)
    blocks = [lib.torchalloc_malloc(6 * MiB, 0, None) for _ in range(9)]  # three to a 20 MiB segment
    assert all(blocks)
    for ptr in blocks[1::2]:
        lib.torchalloc_free(ptr, 6 * MiB, 0, None)
    assert not lib.torchalloc_try_malloc(40 * MiB, 0, None)
    oom = last_oom(0)
    assert oom.verdict == "held elsewhere" and oom.allocated == 30 * MiB and oom.reserved == 60 * MiB
    (first,) = oom.advice
    assert first.setting is None and first.text.startswith("raise the memory fraction to at least 0.07 ")
    assert "it caps torchalloc at 64.00 MiB, 6.00 MiB short of the 70.00 MiB live + requested" in first.text
    for ptr in blocks[::2]:
        lib.torchalloc_free(ptr, 6 * MiB, 0, None)
    _lib.teardown()
    (row,) = analyze(log).ooms()
    (check,) = row.advice
    assert check.replayed == "caching" and check.confirmed is False
    assert check.check == "would not have helped, by replay: caching runs out of memory in 71.7 MiB too"


def test_the_python_mirrors_equal_the_c_sources() -> None:
    """torchalloc_oom_detail field for field, its flags, and the settings the advice names: each one a
    replay variant that checks it (SETTING_VARIANTS), so a new setting in oom_advice.h cannot go unchecked."""
    import re

    from torchalloc.replay.oom_alternatives import SETTING_VARIANTS

    repo = HERE.parents[1]
    header = (repo / "include" / "torchalloc_oom.h").read_text()
    body = re.search(r"typedef struct torchalloc_oom_detail \{(.*?)\} torchalloc_oom_detail;", header, re.S)
    assert body
    c_fields = re.findall(r"^\s*u?int\d+_t (\w+)", body.group(1), re.M)
    assert c_fields == [name for name, _ in _lib.OomDetail._fields_]
    assert ctypes.sizeof(_lib.OomDetail) == 96
    flags = dict(re.findall(r"TORCHALLOC_OOM_(PHASE_ARENAS|FREES_TO_DEVICE|ROUTING) = (\d+)", header))
    assert {k: int(v) for k, v in flags.items()} == {"PHASE_ARENAS": _lib.OOM_PHASE_ARENAS,
                                                     "FREES_TO_DEVICE": _lib.OOM_FREES_TO_DEVICE,
                                                     "ROUTING": _lib.OOM_ROUTING}
    advice_h = (repo / "allocator" / "accounting" / "oom_advice.h").read_text()
    settings = dict(re.findall(r'#define TA_ADVICE_(\w+) "([^"]+)"', advice_h))
    assert settings["EXPANDABLE"] in SETTING_VARIANTS
    assert settings["PHASES"].startswith("policy:")
