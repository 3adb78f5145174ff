"""The HTML page's layout (issue 35): it leads with the answer, its timeline spans the logged activity with
marker labels that never overlap and the cache as a band, each marker's anatomy is folded (identical ones
merged), and a segment's blocks are nested under it.

The label and axis checks run in headless Chromium (headless.py; they skip, saying why, when no chromium is
installed): a small script appended to the page measures every marker label's box as the browser laid it out
(getBBox, in the SVG's units), both as page.js draws it (after the test steps it was given) and as the static
SVG is without the script. labels.py's placement is also checked on its own, without a browser.
"""
from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headless  # noqa: E402
from report_demo import demo_log  # noqa: E402
from report_ways import embedded  # noqa: E402
from synthlog import MiB, SynthLog  # noqa: E402

from torchalloc.analysis import analyze  # noqa: E402
from torchalloc.report.html import render_html  # noqa: E402
from torchalloc.report.labels import GAP, place_labels  # noqa: E402
from torchalloc.report.svg import LEFT, RIGHT, W  # noqa: E402
from torchalloc.units import fmt_bytes  # noqa: E402

BUNDLED_DEMO = Path(__file__).resolve().parents[1] / "torchalloc" / "data" / "demo_trace.talog.xz"

# Appended to a page: every marker's line x, its label's box and its leader, and the SVG's size, on <body>.
MEASURE = """<script>
(function () {
  var svg = document.getElementById('timeline');
  var out = [].map.call(svg.querySelectorAll('g.marker'), function (g) {
    var t = g.querySelector('text.marker-label'), lead = g.querySelector('line.marker-leader');
    var b = t ? t.getBBox() : null;
    return { label: g.getAttribute('data-label'), x: +g.querySelector('line').getAttribute('x1'),
      box: b ? [b.x, b.y, b.width, b.height] : null,
      leader: lead ? ['x1', 'y1', 'x2', 'y2'].map(function (k) { return +lead.getAttribute(k); }) : null };
  });
  var vb = svg.viewBox.baseVal;
  document.body.setAttribute('data-labels', JSON.stringify(out));
  document.body.setAttribute('data-size', JSON.stringify([vb.width, vb.height]));
})();
</script>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    path = headless.browser()
    if path is None:
        pytest.skip(headless.NO_BROWSER)
    return path


def bursts_log(labels: list[str], gap_ns: int, pause_ns: int, per_burst: int) -> SynthLog:
    """Markers in bursts of `per_burst`, `gap_ns` apart within a burst and `pause_ns` between bursts, an
    allocation before each, the whole run starting 5 s after the log opened."""
    L = SynthLog()
    L.time = 5 * 10**9
    L.segment(0x10000000, 64 * MiB)
    for k, label in enumerate(labels):
        if k % per_burst == 0:
            L.time += pause_ns
        L.alloc(0x10000000 + k * 4096, 2048)
        L.time += gap_ns
        L.mark(label)
    return L


def measured(chromium: str, page: str, tmp: Path, steps: str = "") -> tuple[list[dict[str, Any]], list[float]]:
    path = tmp / "page.html"
    path.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = headless.parse(headless.dump_dom(chromium, headless.page_url(path, steps), tmp / "profile"))
    body = dom.one("body")
    assert "data-test-error" not in body.attrs, body.attrs["data-test-error"]
    return json.loads(body.attrs["data-labels"]), json.loads(body.attrs["data-size"])


def check_labels(labels: list[dict[str, Any]], size: list[float]) -> int:
    """No two drawn labels overlap; each lies inside the plot's width and above the plot; its leader runs from
    under it to its marker's line. Returns how many were drawn."""
    drawn = [m for m in labels if m["box"] is not None]
    for m in drawn:
        x, y, w, h = m["box"]
        assert LEFT - 0.5 <= x and x + w <= W - RIGHT + 0.5 and 0 <= y and y + h <= size[1], m
        lx1, ly1, lx2, ly2 = m["leader"]
        assert lx2 == pytest.approx(m["x"], abs=0.01) and x <= lx1 <= x + w and y + h - 1 <= ly1 < ly2, m
    for p, q in itertools.combinations(drawn, 2):
        (px, py, pw, ph), (qx, qy, qw, qh) = p["box"], q["box"]
        apart = px + pw <= qx or qx + qw <= px or py + ph <= qy or qy + qh <= py
        assert apart, f"labels {p['label']!r} and {q['label']!r} overlap: {p['box']} and {q['box']}"
    return len(drawn)


# ---------------------------------------------------------------------------
# Marker labels
# ---------------------------------------------------------------------------


def test_placed_labels_never_overlap_and_stay_near_their_markers() -> None:
    """labels.py alone: a lone label is centred on its marker; a burst is packed into one row, pushed inside the
    plot; too many for one row take more; too many for every row keep every second (third, ...) label."""
    assert place_labels([500.0], [60.0], 100, 1000, 3)[0] == (0, 470.0)
    assert place_labels([995.0], [60.0], 100, 1000, 3)[0] == (0, 940.0)  # pulled back inside the right edge
    xs = [990.0 + k * 0.5 for k in range(10)]
    burst = place_labels(xs, [50.0] * 10, 100, 1000, 3)
    assert {p.row for p in burst if p} == {0}
    lefts = [p.left for p in burst if p]
    assert lefts == sorted(lefts) and lefts[-1] == 950.0
    assert all(b - a == pytest.approx(50.0 + GAP) for a, b in zip(lefts, lefts[1:]))  # packed, in marker order
    wide = place_labels(xs, [150.0] * 10, 100, 1000, 3)
    assert all(p is not None for p in wide) and {p.row for p in wide if p} == {0, 1}
    crowd = place_labels([500.0 + k for k in range(100)], [150.0] * 100, 100, 1000, 3)
    shown = [k for k, p in enumerate(crowd) if p is not None]
    assert 0 < len(shown) < 100 and shown == list(range(0, 100, shown[1]))
    for placed, width in ((burst, 50.0), (wide, 150.0), (crowd, 150.0)):
        for p, q in itertools.combinations([p for p in placed if p], 2):
            assert p.row != q.row or abs(p.left - q.left) >= width + GAP


LABEL_LOGS = {
    "demo": lambda: demo_log(),
    # three bursts of 8 markers 50 µs apart, long and short labels, over a run of a second or so
    "bursts": lambda: bursts_log([f"{w} {k}" for k, w in zip(range(24), itertools.cycle(
        ("step", "stray reference cleared", "checkpoint", "x")))], 50_000, 400_000_000, 8),
    # 200 markers: more than three rows hold, so some go without a label
    "many": lambda: bursts_log([f"iteration {k}" for k in range(200)], 1_000_000, 0, 200),
}


@pytest.mark.parametrize("log", sorted(LABEL_LOGS))
@pytest.mark.parametrize("steps", ["", "zoom-in,wheel-in:0.8", "static"])
def test_marker_labels_never_overlap_in_the_browser(chromium: str, log: str, steps: str, tmp_path: Path) -> None:
    a = LABEL_LOGS[log]().analyze()
    page = render_html(a)
    if steps == "static":
        page, steps = headless.without_script(page), ""
    labels, size = measured(chromium, page, tmp_path, steps)
    drawn = check_labels(labels, size)
    if log == "many":
        assert 0 < drawn < len(labels)  # too many to label every one, in the whole run as zoomed in
    elif not steps:
        assert drawn == len(labels) == len(a.timeline.markers)  # every label drawn in the whole-run view
    else:
        assert drawn == len(labels) > 0  # zoomed in: the markers in view, each labelled


# ---------------------------------------------------------------------------
# The time axis and the cache band
# ---------------------------------------------------------------------------


def test_the_plot_starts_at_the_first_event_not_the_logs_opening(chromium: str, tmp_path: Path) -> None:
    """A log opened 5 s before its first event (imports, data loading): the plot's left edge is just before that
    event, as drawn statically and by the script; no time axis tick before it."""
    L = bursts_log(["a", "b"], 1_000_000, 100_000_000, 1)
    a = L.analyze()
    first, end = float(a.timeline.t_s[0]), a.timeline.duration_s
    page = render_html(a)
    d = embedded(page)
    assert first > 5.0 and d["xmin"] == pytest.approx(first - 0.01 * (end - first)) and d["xmax"] == end
    static = headless.parse(page).by_id("timeline")
    ticks = [n.text() for n in static.all("text", "tick") if not n.text().endswith("B")]  # the time axis's
    assert ticks and all(t.endswith(" s") and float(t[:-2]) >= d["xmin"] for t in ticks)  # seconds, 5 s in
    for p in static.all("path", "phase-area"):
        xs = [float(v) for v in re.findall(r"([0-9.]+),", p.attrs["d"])]
        assert min(xs) >= LEFT - 0.01 and max(xs) <= W - RIGHT + 0.01
        assert min(xs) < LEFT + 0.02 * (W - LEFT - RIGHT)  # the activity starts at the left, not 5 s in
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    dom = headless.parse(headless.dump_dom(chromium, headless.page_url(path, "zoom-in,zoom-reset"), tmp_path / "p"))
    assert [float(v) for v in dom.by_id("timeline").attrs["data-view"].split()] == pytest.approx([d["xmin"], end])
    # zoomed to microseconds 5 s into the log: ticks in seconds with the decimals the step needs
    deep = headless.parse(headless.dump_dom(chromium, headless.page_url(path, ",".join(["zoom-in"] * 16)),
                                            tmp_path / "p")).by_id("timeline")
    ticks = deep.all("text", "x-tick")
    assert len(ticks) >= 4 and all(t.text().endswith(" s") for t in ticks)
    assert all(float(t.text()[:-2]) == pytest.approx(float(t.attrs["data-t"]), abs=1e-9) for t in ticks)
    assert len({t.text() for t in ticks}) == len(ticks)  # enough decimals to tell the ticks apart


def test_the_cache_is_a_band_with_a_legend(chromium: str, tmp_path: Path) -> None:
    """Two segments, the second's only block freed: a wholly free segment, the cache, drawn as a filled band
    (path.cache-area) from the top of fragmentation up to reserved, with its legend entry, as drawn statically
    and by the script."""
    L = SynthLog()
    L.segment(0x10000000, 20 * MiB)
    L.alloc(0x10000000, 20 * MiB)
    L.segment(0x20000000, 20 * MiB)
    L.alloc(0x20000000, 20 * MiB)
    L.free(0x20000000)
    L.mark("end")
    page = render_html(L.analyze())
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    drawn = headless.parse(headless.dump_dom(chromium, headless.page_url(path), tmp_path / "p")).by_id("timeline")
    for svg in (headless.parse(page).by_id("timeline"), drawn):
        band = svg.one("path", "cache-area")
        assert "wholly free segments" in band.text()
        assert len(svg.all("rect", "legend-cache")) == 1
        assert any(t.text() == "cache (free segments)" for t in svg.all("text", "legend"))


# ---------------------------------------------------------------------------
# The page's order, the summary, the markers' tables, the segments' blocks
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> Any:
    return demo_log().analyze()


@pytest.mark.parametrize("log", ["synthetic", "bundled"])
def test_the_page_leads_with_the_summary(demo: Any, log: str) -> None:
    """The summary (the analysis' Summary, which the text and JSON reports print first) comes first, before the
    timeline: the peak's figures, the reserve split at the peak allocated (its rarer terms, free granules of
    expandable segments in the bundled demo, named when there are any), the largest groups live at the peak, a
    line per kind of marker, the change to try first, the OOM's verdict."""
    if log == "bundled":
        demo = analyze(BUNDLED_DEMO)
    page = render_html(demo)
    assert page.index('<section id="summary"') < page.index('<svg id="timeline"') < page.index('id="peak-anatomy"')
    assert page.index('id="peak-anatomy"') < page.index('id="reserve"') < page.index('id="markers"')
    summary = headless.parse(page).by_id("summary")
    s = demo.summary()
    peak = summary.one("dd", "summary-peak").text()
    assert f"{fmt_bytes(s.peak.allocated)} allocated at" in peak and f"{fmt_bytes(s.peak.reserved)} reserved at" in peak
    assert s.peak.allocated_phase and f"in {s.peak.allocated_phase};" in peak
    r = s.reserve
    assert r is not None and r.allocated + r.fragmentation + r.cache + r.mapped_free + r.before_log == r.reserved
    rare = [f" + {fmt_bytes(v)} {name}" for v, name in ((r.mapped_free, "mapped free (expandable)"),
                                                        (r.before_log, "before the log")) if v]
    assert summary.one("span", "split-words").text() == (
        f"{fmt_bytes(r.reserved)} reserved = {fmt_bytes(r.allocated)} allocated + {fmt_bytes(r.fragmentation)} "
        f"fragmentation + {fmt_bytes(r.cache)} cache" + "".join(rare))
    assert bool(rare) == (log == "bundled")  # the bundled demo runs under expandable:reclaim
    groups = summary.one("ol", "summary-groups").all("li")
    assert [(g.one("b").text(), g.one("code").text()) for g in groups] == [(fmt_bytes(x.bytes), x.site) for x in s.live]
    lines = summary.one("ul", "summary-markers").all("li")
    assert [li.one("b").text() for li in lines if "more" not in li.classes()] == [m.label for m in s.markers]
    if s.oom is not None:
        assert summary.one("dd", "summary-oom").one("b", "verdict").text() == s.oom.verdict
    else:
        assert not summary.all("dd", "summary-oom")
    assert (s.change is None) == (not summary.all("dd", "summary-change"))


def test_identical_marker_tables_are_one_folded_table(demo: Any) -> None:
    """Each marker's anatomy is in a <details>; markers whose tables are the same share one, which names each of
    them; no two folded tables are the same."""
    dom = headless.parse(render_html(demo))
    folded = dom.all("details", "marker-anatomy")
    named = [label for d in folded for label in d.attrs["data-markers"].split("\n")]
    assert sorted(named) == sorted(demo.marker_labels())  # every marker once
    tables = [d.one("table").text() for d in folded]
    assert len(set(tables)) == len(tables)
    for d in folded:
        labels = d.attrs["data-markers"].split("\n")
        rows = {tuple((r.bytes, r.site, r.reason) for r in demo.anatomy(label).rows) for label in labels}
        assert len(rows) == 1  # the markers a table stands for have that one table
        assert all(label in d.one("summary").text() for label in labels)
    assert len(folded) < len(demo.marker_labels())  # the demo has markers with the same live blocks


def test_a_segments_blocks_are_nested_under_it(demo: Any) -> None:
    """In the reserved-memory table, each segment that live blocks pin is an item, its largest blocks a list
    inside it, as many as the analysis lists for it."""
    dom = headless.parse(render_html(demo))
    trees = dom.one("table", "reserve").all("ul", "tree")
    moments = demo.reserve().moments
    assert len(trees) == len([m for m in moments if m.pinned])
    for tree, m in zip(trees, [m for m in moments if m.pinned]):
        segments = [li for li in tree.children if not isinstance(li, str)]
        assert len(segments) == len(m.pinned)
        for li, seg in zip(segments, m.pinned):
            assert li.text().startswith(f"segment {seg.addr:#x}") or li.text().startswith(f"expandable range {seg.addr:#x}")
            assert len(li.all("li")) == len(seg.blocks)
