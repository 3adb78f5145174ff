"""A small training run that ends out of memory: the HTML report's tests use it, and docs/report.png shows it.

Three steps of test_analysis.training_log (parameters, activations saved for
backward, gradients, Adam state, a cuBLAS-sized workspace; phases, markers
and stacks), then a fourth forward whose 96 MiB activation does not fit.

    PYTHONPATH=python python3 python/tests/report_demo.py docs/report.png

renders its report in headless Chromium with the peak selected, one of its
temporary blocks open (both stacks) and the tooltip up (docs/REPORT.md shows
the picture).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headless  # noqa: E402
from synthlog import LINEAR, MODULE, MiB, SynthLog  # noqa: E402
from test_analysis import main, training_log  # noqa: E402

OOM_ASKED = 96 * MiB
SCREENSHOT_STEPS = "click-peak,click-block:9,hover-at:0.62"  # a block with both stacks; the tooltip


def demo_log() -> SynthLog:
    L = training_log(steps=3)
    L.mark("step 3")
    L.begin("forward")
    fwd = L.stack((LINEAR, 125, "forward"), (MODULE, 1750, "_call_impl"), main(20))
    L.alloc(0x20000000, 2 * MiB, fwd)
    L.oom(OOM_ASKED, 144 * MiB, fwd)
    L.end()
    return L


def write_screenshot(out: Path) -> None:
    from torchalloc.report.html import write_html

    binary = headless.browser()
    if binary is None:
        raise SystemExit(headless.NO_BROWSER)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        write_html(demo_log().analyze(), page)
        headless.screenshot(binary, headless.page_url(page, SCREENSHOT_STEPS), out, Path(tmp) / "profile",
                            size=(1200, 1700))  # the summary, the timeline, the panels


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} OUT.png")
    write_screenshot(Path(sys.argv[1]))
