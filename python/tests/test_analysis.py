"""The report's analysis on hand-made event tables (no C library, no torch), then end to end on
a real log written by the C library on the sim backend."""
from __future__ import annotations

import ctypes
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthlog import ADAM, AUTOGRAD, LINEAR, MODULE, TENSOR, USER, MiB, SynthLog  # noqa: E402

from torchalloc import analysis as A  # noqa: E402
from torchalloc.report.export import check_snapshot, to_snapshot  # noqa: E402
from torchalloc.report.text import render_text, report  # noqa: E402
from torchalloc.report.html import render_html  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(line: int) -> tuple[str, int, str]:
    return (USER, line, "<module>")


def only_row(a: A.Analysis, site: str) -> A.LifetimeRow:
    rows = [r for r in a.lifetimes() if r.site == site]
    assert len(rows) == 1, (site, [(r.site, r.reason) for r in a.lifetimes()])
    return rows[0]


# ---------------------------------------------------------------------------
# Frames and stacks
# ---------------------------------------------------------------------------


def test_library_frames() -> None:
    assert A.is_library_frame("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py")
    assert A.is_library_frame("/usr/lib/python3/dist-packages/torch/_tensor.py")
    assert A.is_library_frame("/home/u/pytorch/torch/nn/functional.py")  # a source checkout
    assert A.is_library_frame("/usr/lib/python3.12/contextlib.py")
    assert A.is_library_frame("<frozen runpy>")
    assert not A.is_library_frame("/home/u/torch_experiments/train.py")
    assert not A.is_library_frame("/venv/lib/python3.12/site-packages/mylib/model.py")
    assert not A.is_library_frame("/home/u/train.py")
    # torchalloc's own modules wherever the log was recorded (a source tree elsewhere: the bundled demo's)
    assert A.is_library_frame("/somewhere/else/python/torchalloc/tracking.py")
    assert A.is_library_frame("/ci/clone/python/torchalloc/integrations/huggingface.py")
    assert not A.is_library_frame("/home/u/torchalloc/train.py")  # a user's folder of that name


def test_user_suffix_skips_torch_frames() -> None:
    f = A.Frame
    stack = (f(LINEAR, 125, "forward"), f(MODULE, 1750, "_call_impl"), f(USER, 20, "<module>"))
    assert A.user_suffix(stack) == stack[2:]
    assert A.user_suffix(stack[:2]) == stack[:2]  # all library: keep it whole


# ---------------------------------------------------------------------------
# Each lifetime reason, with hand-made stacks
# ---------------------------------------------------------------------------


def test_temporary_same_line() -> None:
    L = SynthLog()
    s = L.stack(main(10))
    L.alloc(0, MiB, s)  # x + 1, result dropped
    L.free(0, s)
    row = only_row(L.analyze(), "train.py:10 <module>")
    assert row.reason == "temporary"
    assert "same line" in row.explanation and "peak" in row.explanation


def test_temporary_seen_through_torch_frames() -> None:
    """A no_grad forward of nn.Sequential: activations made and freed inside torch, on the user's model(x) line."""
    L = SynthLog()
    L.alloc(0, MiB, L.stack((LINEAR, 125, "forward"), (MODULE, 1750, "_call_impl"), main(30)))
    L.free(0, L.stack(("/venv/lib/python3.12/site-packages/torch/nn/modules/container.py", 250, "forward"),
                      (MODULE, 1750, "_call_impl"), main(30)))
    assert only_row(L.analyze(), "train.py:30 <module>").reason == "temporary"


def test_freed_when_function_returned_names_the_caller_line() -> None:
    L = SynthLog()
    L.alloc(0, MiB, L.stack((USER, 3, "f"), main(12)))  # x = x + 1 inside f
    L.free(0, L.stack(main(12)))  # f's frame exits: the caller is current, at its call line
    row = only_row(L.analyze(), "train.py:3 f")
    assert row.reason == "freed when its function returned"
    assert row.free_site == "train.py:12 <module>"
    assert "f()" in row.explanation and "train.py:12" in row.explanation


def test_function_returned_through_module_call() -> None:
    """A local of a user Module.forward, freed when forward returns into torch's _call_impl."""
    L = SynthLog()
    forward = ("/home/u/model.py", 8, "forward")
    L.alloc(0, MiB, L.stack((LINEAR, 125, "forward"), (MODULE, 1750, "_call_impl"), forward, (MODULE, 1750, "_call_impl"),
                            main(40)))
    L.free(0, L.stack((MODULE, 1750, "_call_impl"), (MODULE, 1739, "_wrapped_call_impl"), main(40)))
    # the free's torch frames differ from the alloc's, but user suffixes match: main(40) is the caller
    row = only_row(L.analyze(), "model.py:8 forward")
    assert row.reason == "freed when its function returned"
    assert "forward()" in row.explanation and row.free_site == "train.py:40 <module>"


def test_freed_on_rebinding() -> None:
    L = SynthLog()
    L.alloc(0, MiB, L.stack(main(14)))  # x = ...
    L.alloc(MiB, MiB, L.stack(main(15)))  # something else in between
    L.free(0, L.stack(main(16)))  # x = (attn @ v)... rebinds x
    row = only_row(L.analyze(), "train.py:14 <module>")
    assert row.reason == "freed on rebinding"
    assert row.free_site == "train.py:16 <module>"


def test_same_line_in_a_loop_is_rebinding_not_temporary() -> None:
    """for ...: x = x + 1; y = x * 2 -- the old x dies when line 20 runs again, after line 21 allocated."""
    L = SynthLog()
    s20, s21 = L.stack(main(20)), L.stack(main(21))
    L.alloc(0, MiB, s20)
    L.alloc(MiB, MiB, s21)
    L.free(MiB, s21)
    L.alloc(2 * MiB, MiB, s20)
    L.free(0, s20)
    a = L.analyze()
    rows = {(r.site, r.reason) for r in a.lifetimes()}
    assert ("train.py:20 <module>", "freed on rebinding") in rows
    assert "ran again" in [r for r in a.lifetimes() if r.reason == "freed on rebinding"][0].explanation


def test_saved_for_backward_by_phase() -> None:
    L = SynthLog()
    L.begin("forward")
    L.alloc(0, MiB, L.stack((LINEAR, 125, "forward"), (MODULE, 1750, "_call_impl"), main(30)))
    L.end()
    L.begin("backward")
    L.free(0, 0, tid=7)  # autograd's thread: no Python stack
    L.end()
    a = L.analyze()
    row = only_row(a, "train.py:30 <module>")
    assert row.reason == "saved for backward"
    assert row.category == "activations"
    assert a.backward_from == "phase"


def test_saved_for_backward_without_phases_from_backward_frames() -> None:
    """No phases: the main thread's records inside Tensor.backward mark when backward ran."""
    L = SynthLog()
    L.alloc(0, MiB, L.stack((LINEAR, 125, "forward"), main(30)))
    bw = L.stack((AUTOGRAD, 200, "_make_grads"), (AUTOGRAD, 300, "backward"), (TENSOR, 600, "backward"), main(31))
    L.alloc(MiB, 512, bw)  # the grad seed, on the main thread inside loss.backward()
    L.free(0, 0, tid=7)  # autograd's thread frees the saved activation
    L.free(MiB, bw)
    L.alloc(2 * MiB, MiB, L.stack(main(32)))  # back in user code
    L.free(2 * MiB, L.stack(main(32)))
    a = L.analyze()
    assert a.backward_from == "stacks"
    assert only_row(a, "train.py:30 <module>").reason == "saved for backward"
    assert only_row(a, "train.py:32 <module>").reason == "temporary"


def test_persistent_categories() -> None:
    L = SynthLog()
    L.begin("model")
    L.alloc(0, 4 * MiB, L.stack((LINEAR, 100, "__init__"), main(5)))
    L.end()
    L.begin("forward")
    fwd = L.stack((LINEAR, 125, "forward"), main(30))
    L.alloc(100 * MiB, MiB, fwd)  # the matmul's output...
    L.alloc(4 * MiB, 32 * MiB, fwd)  # ...then cuBLAS's workspace, inside the same op
    L.free(100 * MiB, L.stack(main(31)))
    L.alloc(200 * MiB, 32 * MiB, L.stack(main(32)))  # a 32 MiB tensor of the user's: not a workspace
    L.end()
    L.begin("optimizer")
    L.alloc(36 * MiB, 8 * MiB, L.stack((ADAM, 300, "_single_tensor_adam"), main(40)))
    L.end()
    a = L.analyze()
    by_site = {r.site: r for r in a.lifetimes() if r.reason == "persistent"}
    assert by_site["train.py:5 <module>"].category == "parameters"
    assert by_site["train.py:30 <module>"].category == "library workspace"
    assert "first matmul" in by_site["train.py:30 <module>"].explanation
    assert by_site["train.py:32 <module>"].category == "other persistent (inputs, caches...)"
    assert by_site["train.py:40 <module>"].category == "optimizer state"


def test_other_shows_the_free_site() -> None:
    L = SynthLog()
    L.alloc(0, MiB, L.stack(("/home/u/a.py", 3, "make"), main(10)))
    L.free(0, L.stack(("/home/u/b.py", 9, "consume"), main(11)))
    row = only_row(L.analyze(), "a.py:3 make")
    assert row.reason == "other"
    assert "b.py:9 consume" in row.explanation


def test_without_stacks_falls_back_to_phases_and_says_so() -> None:
    L = SynthLog()
    L.begin("forward")
    L.alloc(0, MiB)
    L.alloc(MiB, MiB)
    L.free(0)
    L.end()
    L.begin("eval")
    L.free(MiB)
    L.end()
    a = L.analyze()
    reasons = {r.reason for r in a.lifetimes()}
    assert reasons == {"freed within its phase", "freed in a later phase"}
    assert any("no stacks" in n for n in a.notes)
    assert "stacks:1" in a.lifetimes()[0].explanation
    assert "no stacks" in render_text(a)


def test_without_stacks_or_phases() -> None:
    """A log written with log:PATH alone: classification, categories and every section cope without either."""
    L = SynthLog()
    L.alloc(0, MiB)
    L.alloc(MiB, 2 * MiB)
    L.free(0)
    L.alloc(3 * MiB, MiB)
    L.free(MiB)
    a = L.analyze()
    # two blocks freed within the phase that made them, the third never freed; no phase occurrence, no backward
    counts = {r.reason: r.count for r in a.lifetimes()}
    assert counts == {"freed within its phase": 2, "persistent": 1}
    assert any(n.startswith("no backward pass found") for n in a.notes)
    assert [p.phase for p in a.phases()] == ["default"] and a.phases()[0].transient == 3 * MiB
    assert any("no stacks" in n for n in a.notes)
    text = render_text(a)
    assert "== Lifetimes" in text
    # The default phase never began: its table row says so instead of "0" occurrences beside its bytes.
    row = next(line for line in text.splitlines() if line.strip().startswith("default "))
    assert "- (outside phases)" in row and " 0 " not in row.split("- (outside phases)")[0]
    json.dumps(a.to_dict())


def test_a_block_freed_within_the_first_occurrence_reads_plainly() -> None:
    """It said "freed within the same occurrence of the first occurrence of backward that allocated it"."""
    L = SynthLog()
    for _ in range(2):
        L.begin("backward")
        L.alloc(0, MiB)
        L.free(0)
        L.end()
    a = L.analyze()
    texts = [r.explanation for r in a.lifetimes()]
    assert any(t.startswith("freed within the first occurrence of backward, which allocated it") for t in texts), texts
    assert not any("same occurrence of the first occurrence" in t for t in texts)


# ---------------------------------------------------------------------------
# A training-shaped log: phases, peak anatomy, the estimate
# ---------------------------------------------------------------------------


def training_log(steps: int = 2) -> SynthLog:
    """setup: 8 MiB params; forward: 2 MiB saved + 1 MiB temp (+ 32 MiB workspace once); backward:
    8 MiB grads (once) + 1 MiB temp; optimizer: 16 MiB Adam state (once) + 8 MiB intermediates."""
    L = SynthLog()
    L.begin("model")
    L.segment(0x10000000, 20 * MiB)
    init = L.stack((LINEAR, 100, "__init__"), main(5))
    L.alloc(0x10000000, 4 * MiB, init)
    L.alloc(0x10400000, 4 * MiB, init)
    L.end()
    for step in range(steps):
        L.mark(f"step {step}")
        L.begin("forward")
        fwd = L.stack((LINEAR, 125, "forward"), (MODULE, 1750, "_call_impl"), main(20))
        if step == 0:
            L.segment(0x20000000, 64 * MiB)
            L.alloc(0x21000000, 32 * MiB, fwd)
        L.alloc(0x20000000, 2 * MiB, fwd)
        L.alloc(0x20200000, 1 * MiB, fwd)
        L.free(0x20200000, L.stack((MODULE, 1750, "_call_impl"), main(20)))
        L.end()
        L.mark(f"after forward {step}")
        L.begin("backward")
        if step == 0:
            L.segment(0x30000000, 20 * MiB)
            L.alloc(0x30000000, 4 * MiB, 0, tid=2)
            L.alloc(0x30400000, 4 * MiB, 0, tid=2)
        L.alloc(0x30800000, 1 * MiB, 0, tid=2)
        L.free(0x30800000, 0, tid=2)
        L.free(0x20000000, 0, tid=2)
        L.end()
        L.begin("optimizer")
        opt = L.stack((ADAM, 300, "_single_tensor_adam"), (ADAM, 200, "step"), main(30))
        if step == 0:
            L.segment(0x40000000, 40 * MiB)
            for k in range(4):
                L.alloc(0x40000000 + k * 4 * MiB, 4 * MiB, opt)
        L.alloc(0x41000000, 4 * MiB, opt)
        L.alloc(0x41400000, 4 * MiB, opt)
        L.free(0x41000000, opt)
        L.free(0x41400000, opt)
        L.end()
    return L


def test_phase_summary_numbers_and_sentence() -> None:
    a = training_log().analyze()
    phases = {p.phase: p for p in a.phases()}
    opt = phases["optimizer"]
    assert opt.occurrences == 2
    assert opt.allocated == 32 * MiB  # 16 state + 2 x 8 intermediates
    assert opt.persistent == 16 * MiB and opt.transient == 16 * MiB and opt.handed_on == 0
    assert opt.reserved_growth == 40 * MiB
    assert opt.persistent_by_category == {"optimizer state": 16 * MiB}
    assert opt.sentence.startswith("optimizer: reserved 40.0 MiB more")
    assert "16.0 MiB is optimizer state that stays (2.0 × parameters)" in opt.sentence
    assert "16.0 MiB transient" in opt.sentence
    fwd = phases["forward"]
    assert fwd.persistent == 32 * MiB  # the workspace
    assert fwd.handed_on == 4 * MiB and fwd.handed_on_to == {"backward": 4 * MiB}
    assert "saved for backward" in fwd.sentence
    assert fwd.first_occurrence_persistent == 32 * MiB
    bwd = phases["backward"]
    assert bwd.persistent == 8 * MiB and bwd.persistent_by_category == {"gradients": 8 * MiB}
    assert bwd.freed == 2 * MiB + 4 * MiB  # its temporaries, and forward's activations


def test_peak_anatomy_largest_first() -> None:
    a = training_log().analyze()
    peak = a.anatomy("peak")
    assert peak.allocated == a.timeline.peak_allocated == 8 * MiB + 32 * MiB + 8 * MiB + 16 * MiB + 8 * MiB
    assert [r.bytes for r in peak.rows] == sorted((r.bytes for r in peak.rows), reverse=True)
    top = peak.rows[0]
    assert (top.site, top.phase, top.category, top.bytes) == ("train.py:20 <module>", "forward", "library workspace", 32 * MiB)
    assert peak.by_category["optimizer intermediates"] == 8 * MiB
    # at a marker
    after = a.anatomy("after forward 0")
    assert after.by_category["activations"] == 2 * MiB
    assert after.allocated == 8 * MiB + 32 * MiB + 2 * MiB
    with pytest.raises(ValueError, match="no marker"):
        a.anatomy("nope")


def test_estimate_terms_measured() -> None:
    est = training_log().analyze().estimate()
    assert est.parameters == 8 * MiB
    assert est.optimizer_state == 16 * MiB
    assert est.gradients == 8 * MiB
    assert est.optimizer_intermediates == 8 * MiB
    assert est.gradients_plus_intermediates == 16 * MiB
    assert est.activations == 2 * MiB
    assert est.workspace == 32 * MiB
    assert est.estimate == 8 * MiB + 16 * MiB + 16 * MiB
    assert est.measured_peak == 72 * MiB
    assert "library workspace 32.0 MiB" in est.sentence


def test_timeline_stacks_by_phase_and_marks_the_peak() -> None:
    a = training_log().analyze(max_points=10)  # fewer points than events: sampled
    tl = a.timeline
    assert len(tl.t_s) < len(a.table)
    total = sum(tl.by_phase.values())
    assert np.array_equal(total, tl.allocated)
    from log_oracle import LogOracle

    assert tl.peak_allocated == int(LogOracle(a.table.path).allocated().max()) and tl.peak_index in tl.index
    assert [m[1] for m in tl.markers] == ["step 0", "after forward 0", "step 1", "after forward 1"]
    assert tl.peak_reserved == 144 * MiB
    assert set(tl.by_phase) == {"model", "forward", "backward", "optimizer"}


def test_fragmentation_oom_explained() -> None:
    L = SynthLog()
    for s in range(3):  # three 20 MiB segments, each 6 + 6 + 6 MiB, the middle block kept
        base = s * 32 * MiB
        L.segment(base, 20 * MiB)
        for k in range(3):
            L.alloc(base + k * 6 * MiB, 6 * MiB, L.stack(main(10)))
    for s in range(3):
        base = s * 32 * MiB
        L.free(base, L.stack(main(11)))
        L.free(base + 12 * MiB, L.stack(main(11)))
    L.oom(12 * MiB, 60 * MiB, L.stack(main(12)))
    a = L.analyze()
    (oom,) = a.ooms()
    assert oom.fragmentation
    assert oom.allocated == 18 * MiB and oom.free_in_reserved == 42 * MiB
    assert oom.largest_free_range == 8 * MiB  # 6 MiB before the kept block, 8 MiB after it
    assert "fragmentation" in oom.explanation and oom.site == "train.py:12 <module>"
    assert a.timeline.ooms == [(pytest.approx(a.timeline.ooms[0][0]), 12 * MiB)]
    assert "Out of memory" in render_text(a)


# ---------------------------------------------------------------------------
# Outputs: JSON, text, HTML, export
# ---------------------------------------------------------------------------


def test_json_round_trips_and_has_every_section() -> None:
    data = training_log().analyze().to_dict()
    text = json.dumps(data)
    back = json.loads(text)
    for key in ("timeline", "peak_anatomy", "lifetimes", "phases", "estimate", "ooms", "markers", "notes"):
        assert key in back
    assert back["peak_allocated"] == 72 * MiB
    assert back["timeline"]["peak"]["allocated"] == 72 * MiB


def test_html_contains_the_svg_and_the_tables() -> None:
    page = render_html(training_log().analyze())
    assert page.startswith("<!DOCTYPE html>")
    assert '<svg id="timeline"' in page
    for phase in ("model", "forward", "backward", "optimizer"):
        assert f'class="phase-area" data-phase="{phase}"' in page
    assert 'class="reserved-line"' in page and 'class="peak-marker"' in page
    assert page.count('class="marker"') == 4
    for table in ('class="anatomy"', 'class="lifetimes"', 'class="phases"', 'class="estimate"'):
        assert table in page
    assert "saved for backward" in page
    # self-contained: nothing fetched
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<link" not in page and "src=" not in page


def test_export_schema() -> None:
    L = training_log()
    snap, notes, _ = to_snapshot(L.file())
    assert check_snapshot(snap) == []
    assert set(snap) >= {"segments", "device_traces"}
    trace = snap["device_traces"][0]
    actions = [e["action"] for e in trace]
    assert actions.count("alloc") == sum(1 for r in L.rows if r["kind"] == A.ALLOC)
    assert actions.count("free_requested") == actions.count("free_completed") == sum(1 for r in L.rows if r["kind"] == A.FREE)
    assert actions.count("segment_alloc") == 4
    first = next(e for e in trace if e["action"] == "alloc")
    assert first["frames"][0] == {"filename": LINEAR, "line": 100, "name": "__init__"}
    # the segments at the end hold exactly the live blocks
    live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    a = L.analyze()
    assert live == a.anatomy("end").allocated
    assert sum(s["total_size"] for s in snap["segments"]) == 144 * MiB
    assert notes == []
    pickle.loads(pickle.dumps(snap))


def test_export_made_up_segment_for_blocks_before_the_log() -> None:
    L = SynthLog()
    L.alloc(5 * MiB, MiB, L.stack(main(3)))  # no segment record: reserved before the log
    snap, notes, _ = to_snapshot(L.file())
    assert check_snapshot(snap) == [] and notes
    assert snap["segments"][0]["address"] == 5 * MiB


def test_export_loads_in_torch_memory_viz() -> None:
    viz = pytest.importorskip("torch.cuda._memory_viz", reason="torch is not installed: the schema check above stands in")
    snap, _, _ = to_snapshot(training_log().file())
    snap = pickle.loads(pickle.dumps(snap))
    for name in ("trace_plot", "segment_plot"):
        if hasattr(viz, name):
            assert "<html" in getattr(viz, name)(snap).lower() or getattr(viz, name)(snap)
    if hasattr(viz, "segsum"):
        assert "total_reserved" in viz.segsum(snap)
    if hasattr(viz, "trace"):
        assert "cudaMalloc" in viz.trace(snap)
    for name in ("memory", "segments"):
        if hasattr(viz, name):
            lines = getattr(viz, name)(snap, format_flamegraph=lambda text: text)
            assert "active_allocated" in lines


# ---------------------------------------------------------------------------
# End to end: a real log from the C library (sim backend), then `torchalloc report`
# ---------------------------------------------------------------------------


def _write_sim_log(lib: ctypes.CDLL, path: Path) -> None:
    from torchalloc import _lib, phases

    _lib.init(f"backend:sim,sim_capacity:80MiB,warn:0,log:{path},expandable:off")  # caching's holes, as PyTorch's
    try:
        malloc, free = lib.torchalloc_malloc, lib.torchalloc_free
        with phases.phase("model"):
            params = [malloc(4 << 20, 0, None) for _ in range(2)]
        lib.torchalloc_mark(b"after model")
        with phases.phase("forward"):
            act = malloc(2 << 20, 0, None)
            tmp = malloc(1 << 20, 0, None)
            free(tmp, 1 << 20, 0, None)
        lib.torchalloc_mark(b"after forward")
        with phases.phase("backward"):
            grads = [malloc(4 << 20, 0, None) for _ in range(2)]
            free(act, 2 << 20, 0, None)
        with phases.phase("optimizer"):
            state = [malloc(4 << 20, 0, None) for _ in range(4)]
            inter = malloc(8 << 20, 0, None)
            free(inter, 8 << 20, 0, None)
        # fragmentation: 6 MiB blocks in 20 MiB segments, keep the middle ones, ask for 12 MiB
        with phases.phase("fragment"):
            blocks = [malloc(6 << 20, 0, None) for _ in range(6)]
            for k in (0, 2, 3, 5):
                free(blocks[k], 6 << 20, 0, None)
            assert not malloc(12 << 20, 0, None)  # holes of 6 and 8 MiB, no room for a segment: OOM
        assert all(params) and all(grads) and all(state)
    finally:
        _lib.teardown()  # closes the log


def test_end_to_end_report_on_a_sim_log(sim: ctypes.CDLL, tmp_path: Path) -> None:
    from torchalloc import _lib

    if not _lib.has("torchalloc_mark"):
        pytest.skip("this libtorchalloc has no event log")
    _lib.teardown()
    path = tmp_path / "run.talog"
    _write_sim_log(sim, path)
    data = report(path, at=["after forward"])
    phases = {p["phase"]: p for p in data["phases"]}
    assert phases["model"]["persistent"] == 8 << 20
    assert phases["optimizer"]["persistent"] == 16 << 20
    assert phases["forward"]["handed_on_to"] == {"backward": 2 << 20}
    assert data["at"][0]["at"] == "marker 'after forward'"
    assert any(r["reason"] == "saved for backward" for r in data["lifetimes"])
    (oom,) = data["ooms"]
    assert oom["requested"] == 12 << 20 and oom["fragmentation"], oom
    assert oom["largest_free_range"] < 12 << 20 <= oom["free_in_reserved"]
    assert any("no stacks" in n for n in data["notes"])  # C callers have no Python stack

    env = {"PYTHONPATH": str(REPO / "python")}
    import os

    env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-m", "torchalloc.cli", "report", str(path)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Peak anatomy" in out.stdout and "optimizer" in out.stdout and "Out of memory" in out.stdout
    js = subprocess.run([sys.executable, "-m", "torchalloc.cli", "report", str(path), "--json", "--html",
                         str(tmp_path / "r.html")], capture_output=True, text=True, env=env, timeout=120)
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout)["peak_allocated"] == data["peak_allocated"]
    assert (tmp_path / "r.html").read_text().count('class="phase-area"') >= 4
    snap_path = tmp_path / "snap.pickle"
    ex = subprocess.run([sys.executable, "-m", "torchalloc.cli", "export", str(path), "-o", str(snap_path)],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ex.returncode == 0, ex.stderr
    from torchalloc.log.trace import safe_unpickle

    snap = safe_unpickle(snap_path.read_bytes())  # only builtin containers and scalars inside
    assert check_snapshot(snap) == []


def test_report_cli_errors(tmp_path: Path) -> None:
    from torchalloc.cli.report import main as report_main

    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path / "missing.talog")])
    assert exit_info.value.code == 2
    bad = tmp_path / "bad.talog"
    bad.write_bytes(b"not a log at all")
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(bad)])
    assert exit_info.value.code == 2
