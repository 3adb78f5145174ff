"""The interactive HTML report: the data it embeds, and what its script does when clicked.

The first tests read the JSON the page embeds and hold it against the
analysis it came from and the log itself (log_oracle.py: which blocks the
log has, when each was live; no browser). Each runs on the log read whole
and read in pieces. The rest load the page in headless
Chromium with a `#test=...` hash: page.js then runs those steps
through the handlers a user's clicks reach (buttons clicked, mouse and wheel
events dispatched on the SVG), and the test reads the DOM Chromium dumps
afterwards: what the panels list and show, the SVG's view and ticks. They
skip when no Chromium is installed.
"""
from __future__ import annotations

import functools
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headless  # noqa: E402
from log_oracle import LOG_OPENED, LogOracle  # noqa: E402
from report_demo import OOM_ASKED, demo_log  # noqa: E402
from report_ways import (BUNDLED, BUNDLED_PIECES, WAYS, analyse, embedded, oracle, page_block, row_of,  # noqa: E402
                         way)  # noqa: F401  (a fixture)
from synthlog import USER, MiB, SynthLog  # noqa: E402

from torchalloc import analysis as A  # noqa: E402
from torchalloc.report.data import PER_MOMENT  # noqa: E402
from torchalloc.report.html import marker_groups, render_html  # noqa: E402
from torchalloc.report.svg import LEFT, RIGHT, W  # noqa: E402

@pytest.fixture(scope="module")
def demo_path() -> Path:
    return demo_log().file()


@pytest.fixture(scope="module", params=WAYS)
def demo(request: pytest.FixtureRequest, demo_path: Path) -> Any:
    return analyse(demo_path, request.param)


@pytest.fixture(scope="module")
def demo_oracle(demo_path: Path) -> LogOracle:
    return oracle(demo_path)


def frames_of(a: Any, stack_id: int) -> list[str]:
    return [f"{f.filename}:{f.line} in {f.function}" for f in a.table.stack_of(stack_id)]


def page_frames(d: dict[str, Any], stack: int) -> list[str]:
    return [f"{d['files'][d['frames'][f][0]]}:{d['frames'][f][1]} in {d['frames'][f][2]}" for f in d["stacks"][stack]]


# The opening words of a block's sentence for each reason (analysis/sections/lifetimes.py's reason_sentence): the
# page gives each block the sentence of its own reason.
OPENINGS = {
    "temporary": ("temporary: made and freed on the same line",),
    "freed when its function returned": ("freed when its function returned: ",),
    "freed on rebinding": ("freed on rebinding",),
    "saved for backward": ("saved for backward: allocated in ",),
    "persistent": ("persistent: ",),
    "freed within its phase": ("freed within ",),
    "freed in a later phase": ("outlived ",),
    "other": ("allocated before the log began", "allocated and freed by autograd's engine",
              "freed on a thread without Python", "allocated on a thread without Python", "freed at "),
}


def check_block_against_the_log(a: Any, d: dict[str, Any], k: int, b: Any) -> None:
    """The page's k-th block says what the log says of block `b` (a log_oracle.Block)."""
    B, p = d["blocks"], page_block(d, k)
    assert (B["id"][k], B["addr"][k], B["alloc_i"][k], B["free_i"][k]) == (b.id, hex(b.addr), b.alloc_i, b.free_i)
    assert p["size"] == b.block_size and p["requested"] == b.size
    assert p["phase"] == a.phase_name(b.alloc_phase)
    assert (d["phase_names"][B["free_phase"][k]] if B["free_phase"][k] >= 0 else None) == (
        None if b.never_freed else a.phase_name(b.free_phase))
    alloc = frames_of(a, b.alloc_stack)
    assert (page_frames(d, B["alloc_stack"][k]) if B["alloc_stack"][k] >= 0 else []) == alloc
    free = frames_of(a, b.free_stack) if not b.never_freed else []
    assert (page_frames(d, B["free_stack"][k]) if B["free_stack"][k] >= 0 else []) == free
    assert (B["free_i"][k] < 0) == b.never_freed
    # the site: a frame of the block's own stack, or, without one, a stand-in that says why
    label, location, is_frame = p["site"]
    if is_frame:
        assert location in alloc, f"block {b.id}: its site {location} is not in its stack"
    else:
        assert not alloc and (label == "(before the log began)") == (b.alloc_i < 0)
    if p["free_site"] is not None and p["free_site"][2]:
        assert p["free_site"][1] in free
    assert p["why"].startswith(OPENINGS[p["reason"]]), f"block {b.id}: {p['reason']!r} said as {p['why']!r}"
    if p["reason"] == "persistent":
        assert p["why"].startswith("persistent: still live at the end of the log") == b.never_freed


def check_groups(a: Any, d: dict[str, Any], o: LogOracle) -> None:
    """The blocks' reasons, sites, categories and phases as the page gives them add up to the rows of the
    lifetimes table (every block) and of the peak's anatomy (the blocks the log has live then)."""
    held = [page_block(d, k) for k in range(len(d["blocks"]["id"]))]
    mine: Counter = Counter()
    theirs: Counter = Counter()
    for p in held:
        key = (p["site"][0], p["site"][1], p["reason"], p["category"], p["free_site"][0] if p["free_site"] else None)
        mine[key + ("count",)] += 1
        mine[key + ("bytes",)] += p["size"]
    for r in a.lifetimes():
        key = (r.site, r.location, r.reason, r.category, r.free_site)
        theirs[key + ("count",)] += r.count
        theirs[key + ("bytes",)] += r.bytes
    assert mine == theirs
    peak = a.anatomy("peak")
    by_id = {p["id"]: p for p in held}
    mine, theirs = Counter(), Counter()
    for k in o.live_after(peak.index):
        p = by_id[k]
        key = (p["site"][0], p["site"][1], p["phase"], p["category"], p["reason"])
        mine.update({key + ("count",): 1, key + ("bytes",): p["size"], key + ("requested",): p["requested"]})
    for r in peak.rows:
        key = (r.site, r.location, r.phase, r.category, r.reason)
        theirs.update({key + ("count",): r.count, key + ("bytes",): r.bytes, key + ("requested",): r.requested})
    assert mine == theirs and sum(v for k, v in mine.items() if k[-1] == "count") > 0


# ---------------------------------------------------------------------------
# The log as the analysis reads it (log_oracle.py)
# ---------------------------------------------------------------------------


def awkward_log() -> SynthLog:
    """Two devices (device 1 has more allocs), a block of device 1 allocated before the log began, a lost free
    (an address allocated again while live), phases and a marker: every rule by which the analysis numbers events
    and pairs blocks."""
    L = SynthLog()
    stack = L.stack((USER, 3, "main"))
    L._row(kind=A.FREE, addr=0x7000000, size=5 * MiB, block_size=5 * MiB, device=1)  # made before the log
    L.alloc(0x100000, MiB, stack, device=0)
    L.begin("forward")
    L.alloc(0x1000000, 2 * MiB, stack, device=1)
    L.alloc(0x200000, 3 * MiB, device=0)
    L.alloc(0x2000000, 4 * MiB, device=1)
    L.mark("middle")
    L.alloc(0x2000000, 6 * MiB, stack, device=1)  # its first block's free was lost
    L.free(0x1000000, stack, device=1)
    L.end()
    L.alloc(0x3000000, 7 * MiB, device=1)
    L.free(0x100000, device=0)
    L.free(0x3000000, device=1)
    return L


@pytest.mark.parametrize("device", [None, 0])
def test_the_oracle_reads_the_log_as_the_analysis_does(way: str, device: int | None) -> None:
    path = awkward_log().file()
    a, o = analyse(path, way, device=device), LogOracle(path, device)
    assert a.device == o.device == (1 if device is None else 0)
    assert len(a.table) == o.n and len(a.blocks) == len(o.blocks)
    assert o.opened == (device is None) and (o.kind(0) == LOG_OPENED) == o.opened
    tl = a.timeline
    assert o.allocated()[tl.index].tolist() == tl.allocated.tolist()
    peak = a.anatomy("peak")
    assert o.allocated_after(peak.index) == peak.allocated and len(o.live_after(peak.index)) == sum(
        r.count for r in peak.rows)
    d = embedded(render_html(a))
    assert d["blocks"]["id"] == [b.id for b in o.blocks]  # a small log: every block held
    for k, b in enumerate(o.blocks):
        check_block_against_the_log(a, d, k, b)
    assert [m["i"] for m in d["markers"]] == [i for i in range(o.n) if o.kind(i) == A.MARKER]
    assert all(o.label(m["i"]) == m["label"] for m in d["markers"])
    if device is None:
        assert [b.alloc_i for b in o.blocks][:1] == [-1] and sum(b.lost_free for b in o.blocks) == 1
    check_groups(a, d, o)


# ---------------------------------------------------------------------------
# The embedded data (no browser)
# ---------------------------------------------------------------------------


def test_embedded_data_matches_the_analysis(demo: Any, demo_oracle: LogOracle) -> None:
    a, o, d = demo, demo_oracle, embedded(render_html(demo))
    tl, tt = a.timeline, d["timeline"]
    assert tt["allocated"] == tl.allocated.tolist() and tt["reserved"] == tl.reserved.tolist()
    assert tt["i"] == tl.index.tolist() and np.allclose(tt["t"], tl.t_s, atol=1e-6)
    assert dict(zip(tt["phases"], tt["by_phase"])) == {k: v.tolist() for k, v in tl.by_phase.items()}
    assert len(a.table) == o.n and tt["allocated"] == o.allocated()[tl.index].tolist()  # the log's events, numbered
    assert tt["live"] == [len(o.live_after(i)) for i in tl.index.tolist()]
    assert [m["label"] for m in d["markers"]] == ["step 0", "after forward 0", "step 1", "after forward 1", "step 2",
                                                  "after forward 2", "step 3"]
    assert all(o.label(m["i"]) == m["label"] for m in d["markers"])

    peak = a.anatomy("peak")
    assert d["peak"]["i"] == peak.index and d["peak"]["allocated"] == peak.allocated == tl.peak_allocated
    assert d["peak"]["live"] == sum(r.count for r in peak.rows) == len(o.live_after(peak.index))
    assert peak.allocated == o.allocated_after(peak.index)

    (oom,) = a.ooms()
    (page_oom,) = d["ooms"]
    assert page_oom["i"] == oom.index and page_oom["requested"] == OOM_ASKED
    assert o.kind(oom.index) == A.OOM and o.record(oom.index)["size"] == OOM_ASKED
    assert (page_oom["verdict"], page_oom["explanation"]) == (oom.verdict, oom.explanation) and oom.explanation
    assert page_oom["live"] == len(o.live_after(oom.index))

    B = d["blocks"]
    assert B["id"] == [b.id for b in o.blocks] and len(a.blocks) == len(o.blocks)  # a small log: every block held
    assert d["budget"] == {**d["budget"], "blocks": len(a.blocks), "held": len(a.blocks), "cut": False}
    for k, b in enumerate(o.blocks):
        check_block_against_the_log(a, d, k, b)
    assert any(B["alloc_stack"][k] >= 0 for k in range(len(B["id"])))  # the log has stacks: the check above bites
    assert any(B["free_stack"][k] >= 0 for k in range(len(B["id"])))
    assert len(d["stacks"]) == len({tuple(s) for s in d["stacks"]})  # deduplicated
    check_groups(a, d, o)

    rows = a.lifetimes()
    assert [r["why"] for r in d["lifetimes"]] == [r.explanation for r in rows]
    for row, page_row in zip(rows, d["lifetimes"]):
        p = page_block(d, page_row["block"])  # the block that speaks for the row: its group, its sentence
        assert (p["site"][0], p["site"][1], p["reason"], p["category"]) == (row.site, row.location, row.reason,
                                                                            row.category)
        assert (p["free_site"][0] if p["free_site"] else None) == row.free_site
        assert row.explanation == (p["why"] if len(row.phases) == 1
                                   else p["why"].replace(f"in {p['phase']}", f"in {', '.join(row.phases)}"))
        group = [q for q in map(functools.partial(page_block, d), range(len(B["id"])))
                 if (q["site"], q["reason"], q["category"], q["free_site"]) == (p["site"], p["reason"], p["category"],
                                                                                p["free_site"])]
        if sum(1 for r in rows if (r.site, r.location, r.reason, r.category, r.free_site) == (
                row.site, row.location, row.reason, row.category, row.free_site)) == 1:
            assert p["id"] == min(q["id"] for q in group)  # the group's first block speaks for it
            assert sorted({q["phase"] for q in group}) == row.phases


def test_log_text_cannot_close_the_data_element(way: str) -> None:
    evil = "/tmp/</script><script>document.title='pwned'</script><!--x.py"
    L = SynthLog()
    L.alloc(0, MiB, L.stack((evil, 1, "f</script>"), (USER, 2, "<module>")))
    page = render_html(analyse(L, way))
    assert page.count("</script>") == 2  # the data element's and the script's own
    d = embedded(page)
    assert evil in d["files"] and d["sites"][0][0] == "script><!--x.py:1 f</script>"  # the basename, verbatim


def test_the_page_says_what_the_timeline_leaves_out(way: str) -> None:
    L = SynthLog()
    for k in range(210):
        L.mark(f"m{k}")
        L.alloc(k * MiB, MiB)
    page = render_html(analyse(L, way))
    assert len(embedded(page)["markers"]) == 200 and page.count('<g class="marker"') == 200
    assert '<p class="note">The timeline draws the first 200 of 210 markers.</p>' in page
    assert "The timeline draws" not in render_html(analyse(demo_log(), way))


def test_block_budget_keeps_each_moments_largest(way: str) -> None:
    """More blocks than the page's budget, of distinct sizes: at every moment a click can ask for (a sample, the
    peak, a marker) the page holds that moment's `exact` largest live blocks, at the peak its PER_MOMENT largest;
    and it was the budget that cut: the page holds as many as it allows."""
    L = SynthLog()
    rng = np.random.default_rng(7)
    live: list[int] = []
    for k in range(9000):
        if k % 1000 == 0:
            L.mark(f"thousand {k // 1000}")
        L.alloc(k * 1024 * MiB, int(rng.integers(1, 60)) * 8 * MiB + k * 512)  # distinct: k * 512 < 8 MiB
        live.append(k * 1024 * MiB)
        if len(live) > 150:
            L.free(live.pop(int(rng.integers(0, len(live)))))
    path = L.file()
    o = oracle(path)
    a = analyse(path, way, pieces=2000)
    d = embedded(render_html(a))
    budget, B = d["budget"], d["blocks"]
    exact, priority = budget["exact"], budget["priority"]
    assert budget["cut"] and 0 < exact < PER_MOMENT and budget["blocks"] == len(o.blocks)
    assert budget["total"] <= budget["held"] == len(B["id"]) <= budget["total"] + len(d["lifetimes"])
    assert priority == [d["peak"]["i"]]  # no OOM
    held = set(B["id"])
    at = set(d["timeline"]["i"]) | {d["peak"]["i"]} | {m["i"] for m in d["markers"]}
    assert len(at) > 1000
    for i in sorted(at):
        keep = PER_MOMENT if i in priority else exact
        assert set(o.largest_live(i)[:keep]) <= held, f"moment {i} lost one of its {keep} largest"
    sizes = [b.block_size for b in o.blocks]
    assert len(set(sizes)) == len(sizes)  # distinct: "the largest" is one set of blocks
    for k in range(0, len(B["id"]), 97):
        check_block_against_the_log(a, d, k, o.blocks[B["id"][k]])


def test_bundled_log_page_is_bounded(way: str) -> None:
    a = analyse(BUNDLED, way, pieces=BUNDLED_PIECES)
    page = render_html(a)
    d = embedded(page)
    budget = d["budget"]
    assert budget["blocks"] == len(a.blocks) == len(oracle(BUNDLED).blocks) > 100_000
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


def plot_span(tl: Any) -> tuple[float, float]:
    """The times at the plot's left and right edges in the whole-run view: 1 % of the logged activity before its
    first event (not the log's opening), and the log's end."""
    x1 = max(tl.duration_s, float(tl.t_s[-1]))
    first = min([float(tl.t_s[0])] + [m[0] for m in tl.markers[:1]] + [s[1] for s in tl.phase_spans[:1]])
    return max(0.0, first - 0.01 * (x1 - first)), x1


def run_steps(chromium: str, a: Any, steps: str, tmp: Path) -> headless.Node:
    page = tmp / "report.html"
    page.write_text(render_html(a), encoding="utf-8")
    dom = headless.parse(headless.dump_dom(chromium, headless.page_url(page, steps), tmp / "profile"))
    body = dom.one("body")
    assert "data-test-error" not in body.attrs, body.attrs["data-test-error"]
    assert body.attrs.get("data-test-done") == steps, "the page did not run every step"
    return dom


def listed(dom: headless.Node) -> list[headless.Node]:
    return dom.by_id("moment").all("tr", "block-row")


def test_peak_lists_its_live_blocks_and_a_block_opens_its_stacks(chromium: str, demo: Any, demo_oracle: LogOracle,
                                                                  tmp_path: Path) -> None:
    a, o = demo, demo_oracle
    dom = run_steps(chromium, a, "click-peak,click-first-block", tmp_path)
    peak = a.anatomy("peak")
    summary = dom.by_id("moment").one("p", "moment-summary")
    assert int(summary.attrs["data-index"]) == peak.index
    assert int(summary.attrs["data-live"]) == sum(r.count for r in peak.rows) == 11
    assert int(summary.attrs["data-bytes"]) == peak.allocated == 72 * MiB
    rows = listed(dom)
    sizes = [int(r.attrs["data-bytes"]) for r in rows]
    assert {int(r.attrs["data-id"]) for r in rows} == set(o.live_after(peak.index))
    assert sum(sizes) == peak.allocated and sizes == sorted(sizes, reverse=True)

    first = int(rows[0].attrs["data-id"])
    assert "selected" in rows[0].classes()
    detail = dom.by_id("detail")
    assert detail.attrs["data-kind"] == "block" and int(detail.attrs["data-id"]) == first
    stack = [li.text() for li in detail.one("ol", "alloc-stack").all("li")]
    assert stack == frames_of(a, o.blocks[first].alloc_stack) and len(stack) == 3
    d = embedded(render_html(a))
    why = detail.one("p", "why").text()
    assert why == page_block(d, row_of(d, first))["why"] and why.startswith("persistent: still live at the end")
    assert o.blocks[first].never_freed and detail.one("p", "still-live").text() == "still live at the end of the log"
    cursor = dom.by_id("selection")  # the selected moment is drawn
    assert cursor.attrs["x1"] == cursor.attrs["x2"]


def test_oom_button_selects_the_failure_with_its_verdict(chromium: str, demo: Any, demo_oracle: LogOracle,
                                                         tmp_path: Path) -> None:
    a, o = demo, demo_oracle
    (oom,) = a.ooms()
    dom = run_steps(chromium, a, "click-oom:0,click-block:1", tmp_path)
    moment = dom.by_id("moment")
    summary = moment.one("p", "moment-summary")
    assert int(summary.attrs["data-index"]) == oom.index
    assert int(summary.attrs["data-live"]) == len(o.live_after(oom.index)) == len(listed(dom))
    assert int(summary.attrs["data-bytes"]) == oom.allocated
    assert moment.one("b", "verdict").text() == oom.verdict == "capacity"
    assert moment.one("span", "oom-why").text() == oom.explanation
    second = int(listed(dom)[1].attrs["data-id"])
    assert int(dom.by_id("detail").attrs["data-id"]) == second


def test_lifetime_site_opens_the_block_its_sentence_speaks_for(chromium: str, demo: Any, demo_oracle: LogOracle,
                                                               tmp_path: Path) -> None:
    a, o = demo, demo_oracle
    rows, d = a.lifetimes(), embedded(render_html(demo))
    examples = [d["blocks"]["id"][r["block"]] for r in d["lifetimes"]]  # the block each row's sentence speaks for
    k = next(i for i, b in enumerate(examples) if not o.blocks[b].never_freed)  # one with a free
    dom = run_steps(chromium, a, f"click-site:{k}", tmp_path)
    detail = dom.by_id("detail")
    b = o.blocks[examples[k]]
    assert detail.attrs["data-kind"] == "site" and int(detail.attrs["data-id"]) == b.id
    assert detail.one("p", "why").text() == rows[k].explanation
    assert [li.text() for li in detail.one("ol", "alloc-stack").all("li")] == frames_of(a, b.alloc_stack)
    free = frames_of(a, b.free_stack)
    shown = [li.text() for li in detail.one("ol", "free-stack").all("li")] if free else []
    assert shown == free and free  # the demo's freed blocks have free stacks: the check bites


def test_zoom_pan_click_and_hover_on_the_timeline(chromium: str, demo: Any, demo_oracle: LogOracle,
                                                  tmp_path: Path) -> None:
    a, o = demo, demo_oracle
    tl = a.timeline
    steps = "zoom-in,wheel-in:0.25,drag:0.2,click-at:0.5,hover-at:0.5"
    dom = run_steps(chromium, a, steps, tmp_path)
    trace = json.loads(dom.one("body").attrs["data-test-trace"])
    x0, x1 = plot_span(tl)
    span = [s["v1"] - s["v0"] for s in trace]
    zoom, wheel, drag, click, hover = trace
    assert span[0] == pytest.approx((x1 - x0) / 2, rel=1e-6)
    assert zoom["v0"] == pytest.approx(x0 + (x1 - x0) / 4, rel=1e-6)
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
    assert int(dom.by_id("moment").one("p", "moment-summary").attrs["data-live"]) == len(o.live_after(int(tl.index[j])))

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


def test_every_click_lists_exactly_the_blocks_live_then(chromium: str, demo: Any, demo_oracle: LogOracle,
                                                          tmp_path: Path) -> None:
    """A click in the middle of every sample's step (clientX is whole pixels: the middle is far from the edges):
    each selects that sample and lists the blocks live just after its event (a block freed by it is gone, one
    made by it is there). A step of no width (the log's end record, at its last event's time) has no middle."""
    a, o = demo, demo_oracle
    tl = a.timeline
    x0, x1 = plot_span(tl)
    middles = ((tl.t_s[:-1] + tl.t_s[1:]) / 2 - x0) / (x1 - x0)
    dom = run_steps(chromium, a, ",".join(f"click-at:{f:.6f}" for f in middles), tmp_path)
    trace = json.loads(dom.one("body").attrs["data-test-trace"])
    assert len(trace) == len(tl.index) - 1
    wide = (tl.t_s[1:] > tl.t_s[:-1]).tolist()
    checked = []
    for i, state, has_width in zip(tl.index[:-1].tolist(), trace, wide):
        if not has_width:
            continue
        assert state["selected"] == i
        assert sorted(state["listed"]) == o.live_after(i), f"at event {i}"
        checked.append(i)
    kinds = {o.kind(i) for i in checked}
    assert {A.ALLOC, A.FREE} <= kinds  # moments just after an allocation and just after a free were both checked


def test_whole_run_view_matches_the_static_timeline(chromium: str, demo: Any, tmp_path: Path) -> None:
    """Without a step the script redraws the whole run: the areas, markers and peak the static SVG has."""
    dom = run_steps(chromium, demo, "zoom-in,zoom-reset", tmp_path)
    svg = dom.by_id("timeline")
    assert [p.attrs["data-phase"] for p in svg.all("path", "phase-area")] == list(demo.timeline.by_phase)
    assert len(svg.all("g", "marker")) == len(demo.timeline.markers)
    assert len(svg.all("g", "peak-marker")) == 1 and len(svg.all("g", "oom-marker")) == 1
    assert tuple(map(float, svg.attrs["data-view"].split())) == pytest.approx(plot_span(demo.timeline))


def test_without_javascript_the_static_page_stands(chromium: str, demo: Any, tmp_path: Path) -> None:
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
    # the peak's, and one per group of markers with the same table (folded, but there without the script)
    assert len(dom.all("table", "anatomy")) == 1 + len(marker_groups(demo)) == 1 + len(dom.all("details"))


def test_bundled_log_peak_says_what_the_page_left_out(chromium: str, way: str, tmp_path: Path) -> None:
    a, o = analyse(BUNDLED, way, pieces=BUNDLED_PIECES), oracle(BUNDLED)
    dom = run_steps(chromium, a, "click-peak", tmp_path)
    peak = a.anatomy("peak")
    summary = dom.by_id("moment").one("p", "moment-summary")
    live, held = int(summary.attrs["data-live"]), int(summary.attrs["data-listed"])
    assert live == sum(r.count for r in peak.rows) and PER_MOMENT <= held < live
    note = dom.by_id("moment").one("p", "cut-note").text()
    assert f"holds {held} of the {live} blocks" in note and f"at least the {PER_MOMENT} largest here" in note
    sizes = [int(r.attrs["data-bytes"]) for r in listed(dom)]
    assert live == len(o.live_after(peak.index))
    largest = [o.blocks[k].block_size for k in o.largest_live(peak.index)]
    assert sizes == largest[:len(sizes)] and len(sizes) == 25  # the first page of the largest, exactly


# ---------------------------------------------------------------------------
# Memory by module: a click on a module lists its blocks at the peak
# ---------------------------------------------------------------------------


def module_log() -> SynthLog:
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
    return L


def test_module_rows_hold_their_blocks_at_the_peak(way: str) -> None:
    path = module_log().file()
    a, o = analyse(path, way), oracle(path)
    d = embedded(render_html(a))
    mods = {m["module"]: m for m in d["modules"]}
    assert mods["model.enc"]["at_peak"] == 9 * MiB and mods["model.dec"]["at_peak"] == 2 * MiB
    sizes = [d["blocks"]["size"][k] for k in mods["model.enc"]["blocks"]]
    assert sizes == [6 * MiB, 3 * MiB]
    whats = [d["module_what"][d["blocks"]["module_what"][k]] for k in mods["model.enc"]["blocks"]]
    assert whats == ["parameters", "activations saved for backward"]
    ids = [d["blocks"]["id"][k] for k in mods["model.enc"]["blocks"]]
    assert [o.blocks[b].addr for b in ids] == [0x1000000, 0x2000000]
    assert set(ids) <= set(o.live_after(d["peak"]["i"]))


def test_a_module_click_lists_its_blocks_and_opens_one(chromium: str, way: str, tmp_path: Path) -> None:
    path = module_log().file()
    a, o = analyse(path, way), oracle(path)
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
    assert (o.blocks[activation].block_size, o.blocks[activation].addr) == (3 * MiB, 0x2000000)
    assert int(detail.one("h4", "module-block-title").attrs["data-id"]) == activation
    facts = detail.one("dl", "facts").text()
    assert "model.enc (activations saved for backward)" in facts
