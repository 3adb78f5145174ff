"""What `torchalloc report` shows of a plan: one summary line (the same figures `torchalloc plan` prints), the
same in --json, and on the page the plot of the predicted peaks against the batch, per policy, with the capacity
and the recorded run; a log the plan cannot predict from gets a line that says why."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import cli  # noqa: E402
from plan_runs import training, write  # noqa: E402

from torchalloc.replay.engine import DEFAULT_POLICIES, INSTALL_DEFAULT  # noqa: E402
from torchalloc.units import fmt_bytes  # noqa: E402

DEMO = str(Path(__file__).resolve().parents[1] / "torchalloc" / "data" / "demo_trace.talog.xz")
GiB = 1 << 30


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
