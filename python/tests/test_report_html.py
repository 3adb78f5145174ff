"""The HTML report renders in a real browser: headless Chromium draws the timeline.

Skips (with the reason) when no chromium binary is installed; on Debian:
apt-get install chromium. The screenshot is decoded here (PNG with zlib and
struct, no imaging library) and the timeline's area must hold the colours
of every phase's stacked area and the red of the peak marker: as the page's
script draws it, and as the static SVG is without the script.
(test_report_page.py clicks the page.)
"""
from __future__ import annotations

import re
import struct
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headless  # noqa: E402
from test_analysis import training_log  # noqa: E402

from torchalloc.report.html import render_html  # noqa: E402
from torchalloc.report.svg import LEFT, PALETTE, TOP, H, W  # noqa: E402


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of RGB bytes of an 8-bit RGB/RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = depth = ctype = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    assert depth == 8 and ctype in (2, 6), f"unsupported PNG: depth {depth}, colour type {ctype}"
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        rows.append(bytes(line) if bpp == 3 else bytes(v for k, v in enumerate(line) if k % 4 != 3))
    return width, height, rows


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def test_html_elements() -> None:
    """What the page must contain, browser or not."""
    a = training_log().analyze()
    page = render_html(a)
    areas = re.findall(r'<path class="phase-area" data-phase="([^"]+)"', page)
    assert areas == ["model", "forward", "backward", "optimizer"]
    assert page.count('<g class="peak-marker">') == 1
    assert page.count('<path class="reserved-line"') == 1
    assert len(re.findall(r'<g class="marker" data-label=', page)) == 4
    anatomy_rows = page.split('<table class="anatomy">')[1].split("</table>")[0].count("<tr>") - 1
    assert anatomy_rows == len(a.anatomy("peak").rows) > 0
    lifetime_rows = page.split('<table class="lifetimes">')[1].split("</table>")[0].count("<tr><td")
    assert lifetime_rows == len(a.lifetimes())
    assert page.split('<table class="phases">')[1].split("</table>")[0].count("<tr>") - 1 == 4


@pytest.mark.parametrize("script", [True, False], ids=["drawn by the script", "static"])
def test_timeline_draws_in_headless_chromium(tmp_path: Path, script: bool) -> None:
    browser = headless.browser()
    if browser is None:
        pytest.skip(headless.NO_BROWSER)
    page = tmp_path / "report.html"
    html = render_html(training_log().analyze())
    page.write_text(html if script else headless.without_script(html), encoding="utf-8")
    shot = tmp_path / "shot.png"
    # tall enough for the summary above the timeline
    headless.screenshot(browser, headless.page_url(page), shot, tmp_path / "profile", size=(1200, 1400))
    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (1200, 1400)

    # Find the plot: the SVG's light background box (#fbfbfd) begins at the first row that has a long run of it.
    bg = _hex("#fbfbfd")
    top = next((y for y, row in enumerate(rows)
                if sum(1 for x in range(0, width * 3, 3) if tuple(row[x:x + 3]) == bg) > 600), None)
    assert top is not None, "the timeline's plot area is not on the screenshot"
    region = rows[top:min(height, top + (H - TOP))]
    pixels = [tuple(r[x:x + 3]) for r in region for x in range(0, width * 3, 3)]
    assert len(set(pixels)) > 20, "the timeline area is nearly blank"

    def near(c: tuple[int, int, int], target: tuple[int, int, int], tol: int = 28) -> bool:
        return all(abs(p - q) <= tol for p, q in zip(c, target))

    # each phase's area, fill-opacity 0.82 over the plot background
    for i, phase in enumerate(("model", "forward", "backward", "optimizer")):
        colour = tuple(round(0.82 * v + 0.18 * b) for v, b in zip(_hex(PALETTE[i]), bg))
        count = sum(1 for p in pixels if near(p, colour))
        assert count > 100, f"phase {phase}: only {count} pixels of its colour {colour} in the timeline"
    red = sum(1 for p in pixels if near(p, (214, 39, 40), 40))
    assert red > 20, "no peak marker drawn"
    dark = sum(1 for p in pixels if max(p) < 90)
    assert dark > 200, "no reserved line / labels drawn"
    assert LEFT < W  # layout constants the check relies on exist


def test_the_page_carries_its_help_from_a_packaged_file() -> None:
    """Issue 25: the page linked to docs/REPORT.md, which the installed package does not have."""
    import re as _re
    from pathlib import Path as _Path

    from torchalloc.report.page_help import HELP_FILE, help_html
    from torchalloc.report.html import render_html
    from synthlog import SynthLog

    log = SynthLog()
    log.segment(0x100000, 4 << 20)
    log.alloc(0x100000, 1 << 20)
    page = render_html(log.analyze())
    assert "docs/REPORT.md" not in page
    assert '<section id="help">' in page and 'href="#help"' in page
    assert "<th>to</th>" in page and "list the blocks live at a moment" in page
    setup = (_Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert "report/page_help.md" in setup and HELP_FILE.name == "page_help.md"
    assert "<b>x&lt;y</b>" in help_html("**x<y**") and not _re.search("<script", help_html("<script>"))
