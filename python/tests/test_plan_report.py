"""What `torchalloc report` shows of a plan: one summary line (the same figures `torchalloc plan` prints), the
same in --json, and on the page the plot of the predicted peaks against the batch, per policy, with the capacity
and the recorded run; a log the plan cannot predict from gets a line that says why."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import cli  # noqa: E402
from plan_runs import training, write  # noqa: E402
from test_mid_run_logs import record_mid_run  # noqa: E402

from torchalloc import _records as records  # noqa: E402
from torchalloc.analysis import analyze  # noqa: E402
from torchalloc.log.trace import MAX_REQUEST, Trace, load_trace  # noqa: E402
from torchalloc.plan import brief_of, report_follower  # noqa: E402
from torchalloc.replay.engine import DEFAULT_POLICIES, INSTALL_DEFAULT  # noqa: E402
from torchalloc.units import fmt_bytes  # noqa: E402

DEMO = str(Path(__file__).resolve().parents[1] / "torchalloc" / "data" / "demo_trace.talog.xz")
MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan_report")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_summary_line_says_what_plan_says(monkeypatch: pytest.MonkeyPatch, library_path: Path) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    status, text, err = cli("report", DEMO)
    assert status == 0, err
    summary = text[text.index("== Summary"):text.index("== Timeline")]
    status, out, err = cli("plan", DEMO, "--capacity", "80GiB", "--policies", INSTALL_DEFAULT, "--json")
    assert status == 0, err
    d = json.loads(out)["policies"][INSTALL_DEFAULT]
    want = (f"Batch 2x: {fmt_bytes(d['peak_allocated'])} allocated, {fmt_bytes(d['peak_reserved'])} reserved under "
            f"the default, fits in 80 GiB (assumed); the largest that fits about {round(d['largest_multiple'], 2):g}x "
            "(torchalloc plan)")
    assert want in flat(summary)


def test_json_carries_the_plan(library_path: Path) -> None:
    status, out, err = cli("report", "--json", DEMO)
    assert status == 0, err
    plan = json.loads(out)["plan"]
    assert plan["predicted"] and plan["multiple"] == 2.0 and plan["capacity"] == 80 * GiB and plan["capacity_assumed"]
    assert plan["default"]["policy"] == INSTALL_DEFAULT and plan["default"]["fits"]
    assert plan["line"].startswith("Batch 2x: ")
    assert plan["recorded"]["peak_allocated"] < plan["default"]["peak_allocated"]
    assert plan["points"] is None  # the plot is the page's


def test_the_page_plots_every_policy_the_capacity_and_the_recorded_run(tmp_path: Path, library_path: Path) -> None:
    page = tmp_path / "demo.html"
    status, _, err = cli("report", DEMO, "--html", str(page))
    assert status == 0, err
    html = page.read_text()
    section = html[html.index('<h2 id="plan">'):]
    svg = section[section.index("<svg"):section.index("</svg>")]
    drawn = re.findall(r'class="plan-line" data-policy="([^"]+)"', svg)
    assert drawn == list(DEFAULT_POLICIES)
    assert 'class="plan-capacity"' in svg and "capacity 80 GiB (assumed)" in svg
    assert 'class="plan-recorded"' in svg and 'class="plan-allocated"' in svg
    assert "(the default)" in section
    summary = html[html.index('id="summary"'):html.index("</section>", html.index('id="summary"'))]
    assert '<dd class="summary-plan">Batch 2x: ' in summary and 'href="#plan"' in summary


def test_the_recorded_gpus_memory_is_not_assumed(folder: Path, library_path: Path) -> None:
    path = write(training(4, oom_device=20 * GiB), folder, "oom.talog")
    status, out, err = cli("report", "--json", str(path))
    assert status == 0, err
    plan = json.loads(out)["plan"]
    assert plan["capacity"] == 20 * GiB and not plan["capacity_assumed"]
    assert "fits in 20 GiB;" in plan["line"]


def test_a_log_plan_cannot_predict_from_says_why(folder: Path, library_path: Path) -> None:
    path = write(training(2, cut_after="backward"), folder, "cut.talog")
    status, text, err = cli("report", str(path))
    assert status == 0, err
    assert "Batch 2x: not predicted (no complete step: the log marks its steps" in flat(text)


def test_the_report_reads_the_log_once(monkeypatch: pytest.MonkeyPatch, library_path: Path) -> None:
    """The plan's trace is gathered in the analysis' pass: the report never loads the log as a trace."""
    import torchalloc.plan.model as model

    def refused(*args: object, **kw: object) -> None:
        raise AssertionError("the report read the log a second time")

    monkeypatch.setattr(model, "load_trace", refused)
    monkeypatch.setattr(model, "load_log", refused)
    status, out, err = cli("report", "--json", DEMO)
    assert status == 0, err
    assert json.loads(out)["plan"]["predicted"]


def gathered(path: Path | str, chunk_records: int) -> tuple[Trace, Trace]:
    """The trace the report's follower gathers from `path` read in pieces of `chunk_records`, and load_trace's."""
    follower = report_follower()
    a = analyze(path, chunk_records=chunk_records, followers=[follower])
    assert follower.gather is not None
    return (follower.gather.trace(a.table.path, a.device, a.log.dropped, a.blocks.before_log),
            load_trace(path, device=a.device))


def test_the_gathered_trace_is_load_traces(folder: Path, library_path: Path) -> None:
    """Blocks from before the log (a free first on its address; not a second free of one, nor a free of a block
    of no size), another device's blocks and segments, a log read in many pieces; the bundled demo; a log the
    library opened after its first allocations."""
    L = training(2, steps=2)
    for addr, size, device, times in ((7 << 40, 3 * MiB, 0, 2), (8 << 40, 0, 0, 1), (9 << 40, MiB, 1, 1)):
        for _ in range(times):
            L.live[addr] = (size, size)
            L.free(addr, device=device)
    L.segment(10 << 40, GiB)
    L.alloc(11 << 40, 5 * MiB, device=1)
    L.segment_free(10 << 40, GiB)
    L._row(kind=records.SEGMENT_ALLOC, addr=13 << 40, size=GiB, block_size=GiB, device=1)
    path = write(L, folder, "gathered.talog")
    late = folder / "late.talog"  # the library's own log, opened after some allocations
    record_mid_run(late, [8 * MiB, MiB, 4 * MiB], [("free", 0), ("alloc", 2 * MiB), ("free", 1)])
    for source, pieces in ((path, 16), (DEMO, 1000), (late, 2)):
        got, want = gathered(source, pieces)
        assert np.array_equal(got.events, want.events) and got.prelude == want.prelude
        assert (got.native_peak_reserved, got.native_label) == (want.native_peak_reserved, want.native_label)
        assert np.array_equal(got.native_pos, want.native_pos)  # type: ignore[arg-type]
        assert np.array_equal(got.native_delta, want.native_delta)  # type: ignore[arg-type]
    assert got.prelude == 2
    got, _ = gathered(path, 16)
    assert got.prelude == 1 and got.events["size"][0] == 3 * MiB and got.native_peak_reserved == GiB


def test_a_damaged_log_is_refused_as_plan_refuses_it(folder: Path, library_path: Path) -> None:
    L = training(2, steps=2)
    L.alloc(14 << 40, MAX_REQUEST + 1)
    path = str(write(L, folder, "huge.talog"))
    status, text, err = cli("report", path)
    assert status == 0, err
    status, _, refused = cli("plan", path, "--capacity", "1GiB")
    assert status == 2 and "a damaged or hand-made log: 1 impossible record" in refused
    reason = refused.strip().removeprefix(f"torchalloc plan: error: {path}: ")
    assert f"Batch 2x: not predicted ({flat(reason)})" in flat(text)


def test_the_plot_shares_its_replays(library_path: Path) -> None:
    """At 1x each policy's point is the reserve section's replay of the run; the default's 2x is the line's; the
    far point, where the bytes live at once reach the capacity, is the one the line's search started from."""
    follower = report_follower()
    a = analyze(DEMO, page=True, followers=[follower])
    b = brief_of(DEMO, a, follower, points=True)
    assert b.plan is not None and b.points is not None and b.plan.default is not None
    at_1 = {r.policy: (1.0, r.peak_allocated, r.peak_reserved) for r in a.reserve().replays}
    far = {line[-1][0] for line in b.points.values() if line[-1] is not None}
    assert list(b.points) == list(DEFAULT_POLICIES) and len(far) == 1 and far.pop() > 2.0
    for policy, line in b.points.items():
        assert line[0] == at_1[policy]
        if policy == INSTALL_DEFAULT:
            d = b.plan.default
            assert line[1] == (2.0, d.peak_allocated, d.peak_reserved) and len(line) == 3
            assert d.largest is not None and line[2][0] >= d.largest  # nothing fits beyond the far point
        else:
            assert len(line) == 2
