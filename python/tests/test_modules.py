"""Memory by module (analysis/sections/modules.py): a log written through the C API on the simulated device, with
module records around allocations of known sizes, checked against hand-computed bytes per module."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from torchalloc import analysis as A
from torchalloc.log import read_log

MiB = 1 << 20
KiB = 1 << 10
MODEL, L0, L1 = 1, 2, 3
PARAMETER, GRADIENT, STATE = 1, 2, 3


def _write(lib: ctypes.CDLL, path: Path) -> dict[str, int]:
    """A two-layer step: parameters, forward (activations saved, a temporary), backward (gradients), optimizer."""
    from torchalloc import _lib, phases

    _lib.init(f"backend:sim,sim_capacity:256MiB,policy:exact,warn:0,log:{path}")
    malloc, free, use, tag = lib.torchalloc_malloc, lib.torchalloc_free, lib.torchalloc_module_set, \
        lib.torchalloc_module_tag
    ptr: dict[str, int] = {}
    try:
        for mid, name in ((MODEL, b"model"), (L0, b"model.layers.0"), (L1, b"model.layers.1")):
            assert lib.torchalloc_module_name(mid, name) == 0
        with phases.phase("init"):
            ptr["p0"], ptr["p1"] = malloc(4 * MiB, 0, None), malloc(4 * MiB, 0, None)
        assert tag(ptr["p0"], L0, PARAMETER) == 0 and tag(ptr["p1"] + 1024, L1, PARAMETER) == 0  # inside the block
        with phases.phase("forward"):
            use(L0)
            ptr["a0"] = malloc(2 * MiB, 0, None)
            t0 = malloc(1 * MiB, 0, None)
            free(t0, 1 * MiB, 0, None)
            use(L1)
            ptr["a1"] = malloc(3 * MiB, 0, None)
            use(MODEL)
            ptr["out"] = malloc(512 * KiB, 0, None)
            use(0)
        with phases.phase("backward"):
            use(L1)
            ptr["g1"] = malloc(4 * MiB, 0, None)
            tag(ptr["g1"], L1, GRADIENT)
            free(ptr["a1"], 3 * MiB, 0, None)
            use(L0)
            ptr["g0"] = malloc(4 * MiB, 0, None)
            tag(ptr["g0"], L0, GRADIENT)
            free(ptr["a0"], 2 * MiB, 0, None)
            free(ptr["out"], 512 * KiB, 0, None)
            use(0)
        with phases.phase("optimizer"):
            ptr["s0"], ptr["s1"] = malloc(4 * MiB, 0, None), malloc(4 * MiB, 0, None)
            tag(ptr["s0"], L0, STATE)
            tag(ptr["s1"], L1, STATE)
        assert all(ptr.values())
    finally:
        _lib.teardown()  # closes the log
    return ptr


@pytest.fixture
def analysis(sim: ctypes.CDLL, tmp_path: Path) -> A.Analysis:
    from torchalloc import _lib

    if not _lib.has("torchalloc_module_set"):
        pytest.skip("this libtorchalloc has no module records")
    _lib.teardown()
    path = tmp_path / "modules.talog"
    _write(sim, path)
    return A.analyze(path)


def test_module_records_decode(analysis: A.Analysis) -> None:
    log = read_log(analysis.table.path)
    names = {int(r["size"]): log.label(r) for r in log.of_kind("module_name")}
    assert names == {MODEL: "model", L0: "model.layers.0", L1: "model.layers.1"}
    assert [int(r["size"]) for r in log.of_kind("module")] == [L0, L1, MODEL, 0, L1, L0, 0]
    assert sorted(int(r["flags"]) for r in log.of_kind("module_tag")) == [1, 1, 2, 2, 3, 3]


def test_bytes_per_module_at_the_peak_and_each_phase_peak(analysis: A.Analysis) -> None:
    m, sentences = analysis.modules()
    rows = {r.module: r for r in m.rows}
    # The peak is the end: 8 MiB parameters + 8 MiB gradients + 8 MiB optimizer state.
    assert analysis.timeline.peak_allocated == 24 * MiB
    for name in ("model.layers.0", "model.layers.1"):
        assert rows[name].at_peak == 12 * MiB and rows[name].blocks_at_peak == 3
        assert rows[name].what_at_peak == {"gradients": 4 * MiB, "parameters": 4 * MiB, "optimizer state": 4 * MiB}
    # forward's peak (13.5 MiB, when `out` is made): p0 + a0, p1 + a1, out
    assert rows["model.layers.0"].by_phase["forward"] == 6 * MiB
    assert rows["model.layers.1"].by_phase["forward"] == 7 * MiB
    assert rows["model"].by_phase["forward"] == 512 * KiB
    # backward's peak (18.5 MiB, when g0 is made): p0 + a0 + g0, p1 + g1, out
    assert rows["model.layers.0"].by_phase["backward"] == 10 * MiB
    assert rows["model.layers.1"].by_phase["backward"] == 8 * MiB
    assert rows["model"].by_phase["backward"] == 512 * KiB
    assert rows["model"].at_peak == 0 and m.tags_unmatched == 0
    assert any("model.layers.0 holds the most: 12.0 MiB (50% of the 24.0 MiB" in s for s in sentences), sentences


def test_what_each_block_is(analysis: A.Analysis) -> None:
    """Per block, as the HTML page lists them (every block of this short log is live at one of its samples): its
    module and what it is to it."""
    from torchalloc.report.data import page_data

    d = page_data(analysis)
    b = d["blocks"]
    assert len(b["id"]) == len(analysis.blocks) == 10  # p0, p1, a0, t0, a1, out, g1, g0, s0, s1
    module = [d["module_names"][m] if m >= 0 else None for m in b["module"]]
    what = {size: d["module_what"][w] for size, w in zip(b["size"], b["module_what"]) if size in (2 * MiB, 3 * MiB, MiB)}
    assert what[2 * MiB] == "activations saved for backward"
    assert what[3 * MiB] == "activations saved for backward"
    assert what[MiB] == "temporaries"
    assert module.count("model.layers.0") == 5  # p0 (tag), a0, t0, g0, s0 (tag)


def test_the_section_in_text_and_json(analysis: A.Analysis) -> None:
    from torchalloc.report.text import render_text

    data = analysis.to_dict()
    mods = {r["module"]: r for r in data["modules"]["modules"]}
    assert mods["model.layers.1"]["at_peak"] == 12 * MiB
    assert set(data["modules"]["phase_peaks"]) >= {"forward", "backward", "optimizer"}
    text = render_text(analysis, width=200)  # wide enough for the headers not to wrap
    assert "Memory by module" in text and "model.layers.0" in text and "at forward's peak" in text


def test_a_log_without_module_records_has_no_section(sim: ctypes.CDLL, tmp_path: Path) -> None:
    from torchalloc import _lib

    _lib.teardown()
    path = tmp_path / "plain.talog"
    _lib.init(f"backend:sim,sim_capacity:64MiB,warn:0,log:{path}")
    try:
        p = sim.torchalloc_malloc(MiB, 0, None)
        sim.torchalloc_free(p, MiB, 0, None)
    finally:
        _lib.teardown()
    a = A.analyze(path)
    assert a.modules()[0].rows == [] and a.to_dict()["modules"] == []


def test_bad_arguments_are_refused(sim: ctypes.CDLL) -> None:
    from torchalloc import _lib

    assert sim.torchalloc_module_name(0, b"x") == -1 and "id above 0" in _lib.last_error()
    assert sim.torchalloc_module_name(1, None) == -1
    assert sim.torchalloc_module_tag(None, 1, 7) == -1 and "role" in _lib.last_error()


def test_a_tag_inside_a_large_block_finds_it_however_many_blocks_were_there_before() -> None:
    """A tag names the block live at the tag that holds its address (a view into a flat buffer, say), even when
    many blocks came and went inside that range before the buffer was made (a search among the 64 blocks below
    the address found none of them live, and called the tag unmatched)."""
    from synthlog import SynthLog
    from torchalloc._records import MODULE_NAME, MODULE_TAG

    log = SynthLog()
    log._row(kind=MODULE_NAME, size=L0, stack=log._string("model.layers.0"), device=-1)
    base = 0x10000000
    for k in range(80):  # small blocks inside the range the buffer will take, all freed before it is made
        log.alloc(base + k * 64 * KiB, 64 * KiB)
        log.free(base + k * 64 * KiB)
    log.alloc(base, 16 * MiB)  # the flat buffer
    log._row(kind=MODULE_TAG, addr=base + 6 * MiB, size=L0, flags=PARAMETER, device=-1)  # a view into it
    log._row(kind=MODULE_TAG, addr=base + 32 * MiB, size=L0, flags=PARAMETER, device=-1)  # outside every block
    m, _ = log.analyze().modules()
    assert m.tags_unmatched == 1
    assert [(r.module, r.at_peak, r.what_at_peak) for r in m.rows] == [("model.layers.0", 16 * MiB,
                                                                        {"parameters": 16 * MiB})]
