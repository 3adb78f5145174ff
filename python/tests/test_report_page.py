"""The interactive HTML report: the data it embeds, and what its script does when clicked.

The first tests read the JSON the page embeds and hold it against the
analysis it came from (no browser). The rest load the page in headless
Chromium with a `#test=...` hash: page.js then runs those steps
through the handlers a user's clicks reach (buttons clicked, mouse and wheel
events dispatched on the SVG), and the test reads the DOM Chromium dumps
afterwards: what the panels list and show, the SVG's view and ticks. They
skip when no Chromium is installed.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headless  # noqa: E402
from report_demo import OOM_ASKED, demo_log  # noqa: E402
from synthlog import USER, MiB, SynthLog  # noqa: E402

from torchalloc import analysis as A  # noqa: E402
from torchalloc.report.data import PER_MOMENT, choose_blocks, lifetime_examples, moments  # noqa: E402
from torchalloc.report.html import render_html  # noqa: E402
from torchalloc.report.svg import LEFT, RIGHT, W  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "python" / "torchalloc" / "data" / "phases_trace.talog.xz"


@pytest.fixture(scope="module")
def demo() -> A.Analysis:
    return demo_log().analyze()


def embedded(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m, "the page embeds no report-data"
    return json.loads(m.group(1))


def frames_of(a: A.Analysis, stack_id: int) -> list[str]:
    return [f"{f.filename}:{f.line} in {f.function}" for f in a.table.stack_of(stack_id)]


def page_frames(d: dict[str, Any], stack: int) -> list[str]:
    return [f"{d['files'][d['frames'][f][0]]}:{d['frames'][f][1]} in {d['frames'][f][2]}" for f in d["stacks"][stack]]


# ---------------------------------------------------------------------------
# The embedded data (no browser)
# ---------------------------------------------------------------------------


def test_embedded_data_matches_the_analysis(demo: A.Analysis) -> None:
    a, d = demo, embedded(render_html(demo))
    tl, tt = a.timeline, d["timeline"]
    assert tt["allocated"] == tl.allocated.tolist() and tt["reserved"] == tl.reserved.tolist()
    assert tt["i"] == tl.index.tolist() and np.allclose(tt["t"], tl.t_s, atol=1e-6)
    assert dict(zip(tt["phases"], tt["by_phase"])) == {k: v.tolist() for k, v in tl.by_phase.items()}
    assert tt["live"] == [len(a.live_at(int(i))) for i in tl.index]
    assert [m["label"] for m in d["markers"]] == ["step 0", "after forward 0", "step 1", "after forward 1", "step 2",
                                                  "after forward 2", "step 3"]
    assert all(a.table.label(m["i"]) == m["label"] for m in d["markers"])

    peak = a.anatomy("peak")
    assert d["peak"]["i"] == peak.index and d["peak"]["allocated"] == peak.allocated == tl.peak_allocated
    assert d["peak"]["live"] == sum(r.count for r in peak.rows)

    (oom,) = a.ooms()
    (page_oom,) = d["ooms"]
    assert page_oom["i"] == oom.index and page_oom["requested"] == OOM_ASKED
    assert (page_oom["verdict"], page_oom["explanation"]) == (oom.verdict, oom.explanation) and oom.explanation
    assert page_oom["live"] == len(a.live_at(oom.index))

    B = d["blocks"]
    assert B["id"] == list(range(len(a.blocks)))  # a small log: every block held
    assert d["budget"] == {**d["budget"], "blocks": len(a.blocks), "held": len(a.blocks), "cut": False}
    for k, b in enumerate(B["id"]):
        assert B["size"][k] == a.blocks.block_size[b] and B["requested"][k] == a.blocks.size[b]
        assert d["phase_names"][B["phase"][k]] == a.phase_name(int(a.blocks.alloc_phase[b]))
        assert d["reasons"][B["reason"][k]] == str(A.REASONS[a.classified.reason[b]])
        assert d["sentences"][B["why"][k]] == a.explanation(b)
        assert d["sites"][B["site"][k]][0] == a.sites[a.classified.site[b]].label
        alloc = frames_of(a, int(a.blocks.alloc_stack[b]))
        assert (page_frames(d, B["alloc_stack"][k]) if B["alloc_stack"][k] >= 0 else []) == alloc
        free = frames_of(a, int(a.blocks.free_stack[b])) if not a.blocks.persistent[b] else []
        assert (page_frames(d, B["free_stack"][k]) if B["free_stack"][k] >= 0 else []) == free
        assert (B["free_i"][k] < 0) == bool(a.blocks.persistent[b])
    assert any(B["alloc_stack"][k] >= 0 for k in range(len(B["id"])))  # the log has stacks: the check above bites
    assert len(d["stacks"]) == len({tuple(s) for s in d["stacks"]})  # deduplicated

    rows = a.lifetimes()
    assert [r["why"] for r in d["lifetimes"]] == [r.explanation for r in rows]
    for row, page_row, b in zip(rows, d["lifetimes"], lifetime_examples(a)):
        assert B["id"][page_row["block"]] == b
        assert a.sites[a.classified.site[b]].label == row.site and str(A.REASONS[a.classified.reason[b]]) == row.reason


def test_log_text_cannot_close_the_data_element() -> None:
    evil = "/tmp/</script><script>document.title='pwned'</script><!--x.py"
    L = SynthLog()
    L.alloc(0, MiB, L.stack((evil, 1, "f</script>"), (USER, 2, "<module>")))
    page = render_html(L.analyze())
    assert page.count("</script>") == 2  # the data element's and the script's own
    d = embedded(page)
    assert evil in d["files"] and d["sites"][0][0] == "script><!--x.py:1 f</script>"  # the basename, verbatim


def test_the_page_says_what_the_timeline_leaves_out() -> None:
    L = SynthLog()
    for k in range(210):
        L.mark(f"m{k}")
        L.alloc(k * MiB, MiB)
    page = render_html(L.analyze())
    assert len(embedded(page)["markers"]) == 200 and page.count('<g class="marker"') == 200
    assert '<p class="note">The timeline draws the first 200 of 210 markers.</p>' in page
    assert "The timeline draws" not in render_html(demo_log().analyze())


def test_block_budget_keeps_each_moments_largest() -> None:
    """300 blocks of distinct sizes, 10 per moment and 40 in all: every moment keeps its `exact` largest,
    the priority moment its 10 largest."""
    L = SynthLog()
    rng = np.random.default_rng(7)
    live: list[int] = []
    for k in range(300):
        L.alloc(k * 64 * MiB, int(rng.integers(1, 60)) * MiB + k * 512)
        live.append(k * 64 * MiB)
        if len(live) > 20:
            L.free(live.pop(int(rng.integers(0, len(live)))))
    a = L.analyze()
    at = moments(a)
    priority = [int(at[len(at) // 3])]
    held, exact = choose_blocks(a, at, priority, per_moment=10, total=40)
    assert 0 < exact < 10 and len(held) <= 40
    size = a.blocks.block_size
    for i in at.tolist():
        live_now = a.live_at(i)
        largest = live_now[np.argsort(-size[live_now], kind="stable")]
        keep = 10 if i in priority else exact
        assert set(largest[:keep].tolist()) <= set(held.tolist()), f"moment {i} lost one of its {keep} largest"
    held_all, exact_all = choose_blocks(a, at, priority, per_moment=10, total=10_000)
    assert exact_all == 10 and len(held_all) > 40  # the same call without a budget keeps more


def test_bundled_log_page_is_bounded() -> None:
    a = A.analyze(BUNDLED)
    page = render_html(a)
    d = embedded(page)
    budget = d["budget"]
    assert budget["blocks"] == len(a.blocks) > 100_000
    assert budget["held"] <= budget["total"] + PER_MOMENT + len(d["lifetimes"]) and budget["cut"]
    assert "This page holds" in page and len(page) < 1_500_000
    assert d["timeline"]["i"] == a.timeline.index.tolist()


# ---------------------------------------------------------------------------
# In headless Chromium
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = headless.browser()
    if binary is None:
        pytest.skip(headless.NO_BROWSER)
    return binary


def run_steps(chromium: str, a: A.Analysis, steps: str, tmp: Path) -> headless.Node:
    page = tmp / "report.html"
    page.write_text(render_html(a), encoding="utf-8")
    dom = headless.parse(headless.dump_dom(chromium, headless.page_url(page, steps), tmp / "profile"))
    body = dom.one("body")
    assert "data-test-error" not in body.attrs, body.attrs["data-test-error"]
    assert body.attrs.get("data-test-done") == steps, "the page did not run every step"
    return dom


def listed(dom: headless.Node) -> list[headless.Node]:
    return dom.by_id("moment").all("tr", "block-row")


def test_peak_lists_its_live_blocks_and_a_block_opens_its_stacks(chromium: str, demo: A.Analysis,
                                                                  tmp_path: Path) -> None:
    a = demo
    dom = run_steps(chromium, a, "click-peak,click-first-block", tmp_path)
    peak = a.anatomy("peak")
    summary = dom.by_id("moment").one("p", "moment-summary")
    assert int(summary.attrs["data-index"]) == peak.index
    assert int(summary.attrs["data-live"]) == sum(r.count for r in peak.rows) == 11
    assert int(summary.attrs["data-bytes"]) == peak.allocated == 72 * MiB
    rows = listed(dom)
    sizes = [int(r.attrs["data-bytes"]) for r in rows]
    assert {int(r.attrs["data-id"]) for r in rows} == set(a.live_at(peak.index).tolist())
    assert sum(sizes) == peak.allocated and sizes == sorted(sizes, reverse=True)

    first = int(rows[0].attrs["data-id"])
    assert "selected" in rows[0].classes()
    detail = dom.by_id("detail")
    assert detail.attrs["data-kind"] == "block" and int(detail.attrs["data-id"]) == first
    stack = [li.text() for li in detail.one("ol", "alloc-stack").all("li")]
    assert stack == frames_of(a, int(a.blocks.alloc_stack[first])) and len(stack) == 3
    assert detail.one("p", "why").text() == a.explanation(first)
    assert a.blocks.persistent[first] and detail.one("p", "still-live").text() == "still live at the end of the log"
    cursor = dom.by_id("selection")  # the selected moment is drawn
    assert cursor.attrs["x1"] == cursor.attrs["x2"]


def test_oom_button_selects_the_failure_with_its_verdict(chromium: str, demo: A.Analysis, tmp_path: Path) -> None:
    a = demo
    (oom,) = a.ooms()
    dom = run_steps(chromium, a, "click-oom:0,click-block:1", tmp_path)
    moment = dom.by_id("moment")
    summary = moment.one("p", "moment-summary")
    assert int(summary.attrs["data-index"]) == oom.index
    assert int(summary.attrs["data-live"]) == len(a.live_at(oom.index)) == len(listed(dom))
    assert int(summary.attrs["data-bytes"]) == oom.allocated
    assert moment.one("b", "verdict").text() == oom.verdict == "capacity"
    assert moment.one("span", "oom-why").text() == oom.explanation
    second = int(listed(dom)[1].attrs["data-id"])
    assert int(dom.by_id("detail").attrs["data-id"]) == second


def test_lifetime_site_opens_the_block_its_sentence_speaks_for(chromium: str, demo: A.Analysis,
                                                               tmp_path: Path) -> None:
    a = demo
    rows = a.lifetimes()
    k = next(i for i, r in enumerate(rows) if not a.blocks.persistent[lifetime_examples(a)[i]])  # one with a free
    dom = run_steps(chromium, a, f"click-site:{k}", tmp_path)
    detail = dom.by_id("detail")
    b = lifetime_examples(a)[k]
    assert detail.attrs["data-kind"] == "site" and int(detail.attrs["data-id"]) == b
    assert detail.one("p", "why").text() == rows[k].explanation
    assert [li.text() for li in detail.one("ol", "alloc-stack").all("li")] == frames_of(a, int(a.blocks.alloc_stack[b]))
    free = frames_of(a, int(a.blocks.free_stack[b]))
    shown = [li.text() for li in detail.one("ol", "free-stack").all("li")] if free else []
    assert shown == free


def test_zoom_pan_click_and_hover_on_the_timeline(chromium: str, demo: A.Analysis, tmp_path: Path) -> None:
    a = demo
    tl = a.timeline
    steps = "zoom-in,wheel-in:0.25,drag:0.2,click-at:0.5,hover-at:0.5"
    dom = run_steps(chromium, a, steps, tmp_path)
    trace = json.loads(dom.one("body").attrs["data-test-trace"])
    xmax = max(tl.duration_s, float(tl.t_s[-1]))
    span = [s["v1"] - s["v0"] for s in trace]
    zoom, wheel, drag, click, hover = trace
    assert span[0] == pytest.approx(xmax / 2, rel=1e-6) and zoom["v0"] == pytest.approx(xmax / 4, rel=1e-6)
    assert span[1] == pytest.approx(span[0] * 0.8, rel=1e-6)
    pointer = zoom["v0"] + 0.25 * span[0]  # the wheel zooms about the time under the pointer: it stays there
    assert wheel["v0"] + 0.25 * span[1] == pytest.approx(pointer, rel=1e-3)
    assert span[2] == pytest.approx(span[1], rel=1e-9)  # a drag pans: the span stays, the view moves earlier
    assert drag["v0"] == pytest.approx(wheel["v0"] - 0.2 * span[1], rel=2e-2)
    t = drag["v0"] + 0.5 * span[2]
    # the sample whose level holds at t; a pointer is whole pixels, so within one of a step's edge either side
    pixel = span[2] / (W - LEFT - RIGHT)
    near = {int(np.searchsorted(tl.t_s, t + e, side="right")) - 1 for e in (-pixel, 0, pixel)}
    assert click["selected"] in {int(tl.index[j]) for j in near}
    j = int(np.flatnonzero(tl.index == click["selected"])[0])
    assert int(dom.by_id("moment").one("p", "moment-summary").attrs["data-live"]) == len(a.live_at(int(tl.index[j])))

    svg = dom.by_id("timeline")
    v0, v1 = map(float, svg.attrs["data-view"].split())
    assert (v0, v1) == pytest.approx((drag["v0"], drag["v1"]))
    ticks = svg.all("text", "x-tick")
    values = [float(x.attrs["data-t"]) for x in ticks]
    assert len(ticks) >= 4 and all(v0 - 1e-12 <= v <= v1 + 1e-12 for v in values)
    assert ticks[0].text().endswith("µs")  # the view is microseconds wide

    tip = dom.by_id("tooltip")
    assert "hidden" not in tip.attrs
    lines = [n.text() for n in tip.all("div")]
    j = int(tip.attrs["data-sample"])
    assert j in near
    assert lines[1].startswith(f"allocated {tl.allocated[j] / MiB:.1f} MiB, reserved {tl.reserved[j] / MiB:.1f} MiB, "
                               "fragmentation ")
    inner = max((s for s in tl.phase_spans if s[1] <= t <= s[2]), key=lambda s: s[1], default=None)
    assert lines[3] == f"phase: {inner[0] if inner else 'none'}"
    nearest = min(tl.markers, key=lambda m: abs(m[0] - t))
    assert lines[4].startswith(f"nearest marker: {nearest[1]} at ")


def test_every_click_lists_exactly_the_blocks_live_then(chromium: str, demo: A.Analysis, tmp_path: Path) -> None:
    """A click in the middle of every sample's step (clientX is whole pixels: the middle is far from the edges):
    each selects that sample and lists the blocks live just after its event (a block freed by it is gone, one
    made by it is there). A step of no width (the log's end record, at its last event's time) has no middle."""
    a = demo
    tl = a.timeline
    xmax = max(tl.duration_s, float(tl.t_s[-1]))
    middles = (tl.t_s[:-1] + tl.t_s[1:]) / 2 / xmax
    dom = run_steps(chromium, a, ",".join(f"click-at:{f:.6f}" for f in middles), tmp_path)
    trace = json.loads(dom.one("body").attrs["data-test-trace"])
    assert len(trace) == len(tl.index) - 1
    wide = (tl.t_s[1:] > tl.t_s[:-1]).tolist()
    for i, state, has_width in zip(tl.index[:-1].tolist(), trace, wide):
        if not has_width:
            continue
        assert state["selected"] == i
        assert sorted(state["listed"]) == sorted(a.live_at(i).tolist()), f"at event {i}"
    kinds = set(a.table.kind[tl.index].tolist())
    assert {A.ALLOC, A.FREE} <= kinds  # moments just after an allocation and just after a free were both checked


def test_whole_run_view_matches_the_static_timeline(chromium: str, demo: A.Analysis, tmp_path: Path) -> None:
    """Without a step the script redraws the whole run: the areas, markers and peak the static SVG has."""
    dom = run_steps(chromium, demo, "zoom-in,zoom-reset", tmp_path)
    svg = dom.by_id("timeline")
    assert [p.attrs["data-phase"] for p in svg.all("path", "phase-area")] == list(demo.timeline.by_phase)
    assert len(svg.all("g", "marker")) == len(demo.timeline.markers)
    assert len(svg.all("g", "peak-marker")) == 1 and len(svg.all("g", "oom-marker")) == 1
    assert float(svg.attrs["data-view"].split()[0]) == 0.0


def test_without_javascript_the_static_page_stands(chromium: str, demo: A.Analysis, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(headless.without_script(render_html(demo)), encoding="utf-8")
    dom = headless.parse(headless.dump_dom(chromium, headless.page_url(page, "click-peak"), tmp_path / "profile"))
    assert "data-test-done" not in dom.one("body").attrs  # nothing ran
    hidden = dom.all(cls="needs-script")
    assert len(hidden) == 2 and all("hidden" in n.attrs for n in hidden)  # the controls and panels stay out of the way
    svg = dom.by_id("timeline")
    assert len(svg.all("path", "phase-area")) == 4 and len(svg.all("g", "peak-marker")) == 1
    assert "interactive" not in svg.classes()
    assert len(dom.all("table", "lifetimes")) == 1
    assert len(dom.all("table", "anatomy")) == 1 + len(demo.timeline.markers)  # the peak's, each marker's


def test_bundled_log_peak_says_what_the_page_left_out(chromium: str, tmp_path: Path) -> None:
    a = A.analyze(BUNDLED)
    dom = run_steps(chromium, a, "click-peak", tmp_path)
    peak = a.anatomy("peak")
    summary = dom.by_id("moment").one("p", "moment-summary")
    live, held = int(summary.attrs["data-live"]), int(summary.attrs["data-listed"])
    assert live == sum(r.count for r in peak.rows) and PER_MOMENT <= held < live
    note = dom.by_id("moment").one("p", "cut-note").text()
    assert f"holds {held} of the {live} blocks" in note and f"at least the {PER_MOMENT} largest here" in note
    sizes = [int(r.attrs["data-bytes"]) for r in listed(dom)]
    largest = np.sort(a.blocks.block_size[a.live_at(peak.index)])[::-1]
    assert sizes == largest[:len(sizes)].tolist() and len(sizes) == 25  # the first page of the largest, exactly


# ---------------------------------------------------------------------------
# Memory by module: a click on a module lists its blocks at the peak
# ---------------------------------------------------------------------------


def module_log() -> A.Analysis:
    """Two modules: model.enc holds a 6 MiB parameter and a 3 MiB activation at the peak, model.dec 2 MiB."""
    from torchalloc._records import MODULE, MODULE_NAME, MODULE_TAG, TAG_PARAMETER

    L = SynthLog()
    for mid, name in ((1, "model.enc"), (2, "model.dec")):
        L._row(kind=MODULE_NAME, size=mid, stack=L._string(name), device=-1)
    L.alloc(0x1000000, 6 * MiB)
    L._row(kind=MODULE_TAG, addr=0x1000000, size=1, flags=TAG_PARAMETER, device=-1)
    L.begin("forward")
    L._row(kind=MODULE, size=1, device=-1)
    L.alloc(0x2000000, 3 * MiB)
    L._row(kind=MODULE, size=2, device=-1)
    L.alloc(0x3000000, 2 * MiB)
    L._row(kind=MODULE, size=0, device=-1)
    L.end()
    L.begin("backward")
    L.free(0x3000000)
    L.free(0x2000000)
    L.end()
    return L.analyze()


def test_module_rows_hold_their_blocks_at_the_peak() -> None:
    a = module_log()
    d = embedded(render_html(a))
    mods = {m["module"]: m for m in d["modules"]}
    assert mods["model.enc"]["at_peak"] == 9 * MiB and mods["model.dec"]["at_peak"] == 2 * MiB
    sizes = [d["blocks"]["size"][k] for k in mods["model.enc"]["blocks"]]
    assert sizes == [6 * MiB, 3 * MiB]
    whats = [d["module_what"][d["blocks"]["module_what"][k]] for k in mods["model.enc"]["blocks"]]
    assert whats == ["parameters", "activations saved for backward"]


def test_a_module_click_lists_its_blocks_and_opens_one(chromium: str, tmp_path: Path) -> None:
    a = module_log()
    dom = run_steps(chromium, a, "click-module:0,click-module-block:1", tmp_path)
    detail = dom.by_id("detail")
    assert detail.attrs["data-kind"] == "module"
    assert detail.one("h3").text() == "Module model.enc"
    summary = detail.one("p", "module-summary")
    assert int(summary.attrs["data-bytes"]) == 9 * MiB and int(summary.attrs["data-count"]) == 2
    rows = detail.all("tr", "module-block")
    assert [int(r.attrs["data-bytes"]) for r in rows] == [6 * MiB, 3 * MiB]
    assert "selected" in rows[1].classes()
    activation = int(rows[1].attrs["data-id"])
    assert a.blocks.block_size[activation] == 3 * MiB
    assert int(detail.one("h4", "module-block-title").attrs["data-id"]) == activation
    facts = detail.one("dl", "facts").text()
    assert "model.enc (activations saved for backward)" in facts
