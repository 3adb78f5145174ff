"""Leaks a user would call leaks (issue 52): every shape of growth that is never given back is named, and nothing
that comes back or stops after a warm-up is, in the report's JSON, its text summary and section, the page's
summary and `top`'s frame.

Each run is recorded by the C library on the simulated device with Python stacks (leak_runs.py): a leak keeps
blocks at `leaky` with some rhythm, a cycle keeps them at `cycling` and frees them all at its end, a warm-up keeps
them at `warming` for its first steps only, `noisy` holds a drawn number of blocks of drawn sizes at each marker.
"""
from __future__ import annotations

import ctypes
import html
import json
import random
from pathlib import Path
from typing import Any, Callable

import pytest

from leak_runs import MiB, Run, cycling, leaky, noisy, record, site_label, warming
from torchalloc.analysis.sections.leaks import MIN_STEPS

SITES = (leaky, cycling, warming, noisy)


@pytest.fixture
def log(sim: ctypes.CDLL, tmp_path: Path) -> Callable[..., Path]:
    from torchalloc import _lib

    if not _lib.has("torchalloc_mark"):
        pytest.skip("this libtorchalloc has no event log")

    def make(loop: Callable[[Run], None], before: Callable[[Run], None] | None = None) -> Path:
        return record(tmp_path / "run.talog", loop, before)
    return make


def _views(path: Path) -> dict[str, Any]:
    """What each tool says of the log: --json (as printed), the text summary and Leaks section, the page's summary,
    and the Leaks lines of top's frame (the log read as `top --once` reads it)."""
    from torchalloc import analysis
    from torchalloc.cli.top_frame import frame
    from torchalloc.cli.top_reader import LiveReader
    from torchalloc.cli.top_state import LiveState
    from torchalloc.report.html import render_html
    from torchalloc.report.text import render_text, report

    a = analysis.analyze(path)
    text = render_text(a, width=250)
    page = render_html(a)
    state = LiveState(LiveReader(str(path)))
    state.refresh()
    top = "\n".join(frame([state], 250))
    return {"json": json.loads(json.dumps(report(path))),
            "summary": text.split("== Summary")[1].split("== Timeline")[0],
            "section": text.split("== Leaks")[1].split("\n==")[0] if "== Leaks" in text else "",
            "page_summary": page.split('<section id="summary"')[1].split("</section>")[0],
            "top": top[top.index("Leaks"):] if "Leaks" in top else ""}


def check(path: Path, named: set[Callable[..., int]], since: dict[Callable[..., int], str] | None = None,
          settled: dict[Callable[..., int], int] | None = None) -> dict[str, Any]:
    """The sites in `named` are the leaks in every view, each since the marker `since` gives; no other site is;
    the sites in `settled` grew during their first N steps, then stayed: said so in the section and the JSON
    summary, and never named a leak."""
    v = _views(path)
    data = v["json"]
    labels = {site_label(fn) for fn in named}
    assert {x["site"] for x in data["leaks"]} == labels
    assert data["summary"]["leak_count"] == len(labels) and data["summary"]["leaks"] == data["leaks"][:2]
    assert data["summary"]["leak_check"]["enough"]
    for x in data["leaks"]:
        assert x["grown"] > 0 and x["per_step"] == x["grown"] // x["steps"]
    for fn, label in (since or {}).items():
        assert next(x for x in data["leaks"] if x["site"] == site_label(fn))["since"] == label
    for fn in SITES:
        said = f"at {site_label(fn)} since"
        assert (said in v["summary"]) == (fn in named), (fn.__name__, v["summary"])
        assert (said in v["page_summary"]) == (fn in named), fn.__name__
        assert (said in v["top"]) == (fn in named), (fn.__name__, v["top"])
        assert (said in v["section"]) == (fn in named), fn.__name__
    if not named:
        assert "Leak:" not in v["summary"] and "summary-leaks" not in v["page_summary"]
        assert "Leaks (a site whose low point over the step markers rose, never given back): none" in v["top"]
    settled = settled or {}
    got = {x["site"]: x for x in data["summary"]["leak_check"]["settled"]}
    for fn, steps in settled.items():
        assert got[site_label(fn)]["steps"] == steps and got[site_label(fn)]["since"] is None
        assert f"{site_label(fn)} grew during the first {steps} steps, then stable" in v["section"]
    return v


def every(k: int, steps: int, size: int = 4 * MiB) -> Callable[[Run], None]:
    """A leak of `size` kept at every k-th step (k = 10: a logging step keeping `loss` with its graph)."""
    def loop(r: Run) -> None:
        for s in range(1, steps + 1):
            r.mark(f"step {s}")
            r.temporary()
            if s % k == 0:
                r.keep("history", leaky, size)
    return loop


@pytest.mark.parametrize("k,steps", [(1, 20), (2, 20), (3, 30), (10, 50)])
def test_a_leak_at_every_kth_step_is_named(log: Any, k: int, steps: int) -> None:
    v = check(log(every(k, steps)), {leaky}, since={leaky: f"step {k}"})
    (leak,) = v["json"]["leaks"]
    assert leak["live"] == (steps - 1) // k * 4 * MiB  # the block kept at the last step comes after its marker
    assert leak["grown"] == leak["live"] and leak["last"] == f"step {steps}"


def test_the_issues_every_other_step_leak_is_named_in_its_words(log: Any) -> None:
    v = check(log(every(2, 20)), {leaky})
    line = (f"Leak: grows 2.0 MiB per step at {site_label(leaky)} since step 2 (+36.0 MiB over 18 steps, never given "
            "back; 36.0 MiB live at step 20)")
    assert line in v["summary"]


def test_a_leak_in_bursts_is_named(log: Any) -> None:
    def loop(r: Run) -> None:
        for s in range(1, 41):
            r.mark(f"step {s}")
            if (s - 1) % 8 < 3:  # three steps in eight keep one
                r.keep("kept", leaky, 2 * MiB)
    check(log(loop), {leaky})


def test_a_leak_of_drawn_sizes_is_named(log: Any) -> None:
    rng = random.Random(52)
    sizes = [rng.randint(1, 8) * MiB for _ in range(12)]

    def loop(r: Run) -> None:
        for s, size in enumerate(sizes, 1):
            r.mark(f"step {s}")
            r.temporary(3 * MiB)
            r.keep("kept", leaky, size)
    (leak,) = check(log(loop), {leaky}, since={leaky: "step 1"})["json"]["leaks"]
    assert leak["live"] >= sum(sizes[:-1])  # the blocks' bytes: a cached block may be a little more than asked


def test_a_leak_beside_a_noisy_site_is_named_and_the_noise_is_not(log: Any) -> None:
    rng = random.Random(7)

    def loop(r: Run) -> None:
        for s in range(1, 31):
            r.mark(f"step {s}")
            r.free("noise")
            for _ in range(rng.randint(0, 3)):
                r.keep("noise", noisy, rng.randint(1, 6) * MiB)
            r.keep("kept", leaky, MiB)
    check(log(loop), {leaky})


def test_a_leak_that_starts_late_is_named_since_it_started(log: Any) -> None:
    def loop(r: Run) -> None:
        for s in range(1, 41):
            r.mark(f"step {s}")
            r.temporary()
            if s > 20:
                r.keep("kept", leaky, MiB)
    check(log(loop), {leaky}, since={leaky: "step 21"})


@pytest.mark.parametrize("warm", [2, 6, 10])
def test_a_warm_up_is_no_leak_but_grew_then_stable(log: Any, warm: int) -> None:
    """The issue's false alarm (6 steps of growth, then 14 flat) and its kin: growth in the first steps only."""
    def loop(r: Run) -> None:
        for s in range(1, max(20, 3 * warm) + 1):
            r.mark(f"step {s}")
            r.temporary()
            if s <= warm:
                r.keep("cache", warming, 4 * MiB)
    check(log(loop), set(), settled={warming: warm})


def _accumulation(micro: int, cycles: int, cut: int, micro_markers: bool) -> Callable[[Run], None]:
    """A gradient kept per micro-step, all freed at the optimizer step; the last cycle cut after `cut` micro-steps
    by the end of the log. Markers: 'optimizer step N' at each optimizer step, and 'micro-step N' at each
    micro-step when `micro_markers` (then the most frequent kind naming a step: the step markers)."""
    def loop(r: Run) -> None:
        n = 0
        for c in range(1, cycles + 2):
            r.mark(f"optimizer step {c}")
            for _ in range(micro if c <= cycles else cut):
                n += 1
                if micro_markers:
                    r.mark(f"micro-step {n}")
                r.temporary()
                r.keep("grads", cycling, 4 * MiB)
            if c <= cycles:
                r.free("grads")
    return loop


@pytest.mark.parametrize("micro", [2, 8, 16])
def test_gradient_accumulation_with_a_marker_per_micro_step_is_no_leak(log: Any, micro: int) -> None:
    """The issue's false alarm is micro = 8 over 32 micro-steps; here each run ends inside a cycle."""
    check(log(_accumulation(micro, cycles=4, cut=micro - 1, micro_markers=True)), set())


@pytest.mark.parametrize("micro", [2, 8, 16])
def test_gradient_accumulation_with_a_marker_per_optimizer_step_is_no_leak(log: Any, micro: int) -> None:
    check(log(_accumulation(micro, cycles=10, cut=micro // 2, micro_markers=False)), set())


def test_a_kv_cache_within_each_generate_is_no_leak(log: Any) -> None:
    """A marker per generated token; the cache grows a block per token and goes when generate() returns; the
    last generate() is cut by the end of the log."""
    rng = random.Random(3)
    lengths = [rng.randint(6, 12) for _ in range(6)]

    def loop(r: Run) -> None:
        token = 0
        for g, length in enumerate(lengths + [5]):
            r.temporary(8 * MiB)  # the prompt's activations
            for _ in range(length):
                token += 1
                r.mark(f"token {token}")
                r.keep("kv", cycling, MiB)
            if g < len(lengths):
                r.free("kv")
    check(log(loop), set())


def test_a_per_epoch_buffer_is_no_leak(log: Any) -> None:
    def loop(r: Run) -> None:
        step = 0
        for epoch in range(1, 7):
            r.mark(f"epoch {epoch}")
            for _ in range(8 if epoch < 6 else 5):  # the last epoch cut by the end of the log
                step += 1
                r.mark(f"step {step}")
                r.temporary()
                r.keep("epoch", cycling, 2 * MiB)
            if epoch < 6:
                r.free("epoch")
    check(log(loop), set())


def test_a_run_shorter_than_the_rule_needs_says_so(log: Any) -> None:
    v = _views(log(every(1, MIN_STEPS - 2)))
    short = (f"{MIN_STEPS - 2} step markers like 'step 1', fewer than the {MIN_STEPS} the leak rule needs: no leak "
             "looked for")
    assert v["json"]["leaks"] == [] and v["json"]["summary"]["leak_check"]["enough"] is False
    assert f"Leaks: {short}" in v["summary"] and short in v["section"] and html.escape(short) in v["page_summary"]
    assert "Leak:" not in v["summary"]
    assert v["top"].startswith(f"Leaks: {MIN_STEPS - 2} step markers like 'step N', fewer than the {MIN_STEPS}")


def test_a_log_opened_mid_run_names_the_leak_and_not_the_cycle(log: Any) -> None:
    """Ten steps and three micro-steps of an accumulation of 8 before the log opens: the blocks from before it are
    no site's, the leak is named from the log's first step marker, the accumulation is not."""
    def steps(first: int, last: int, micro_from: int = 0) -> Callable[[Run], None]:
        def loop(r: Run) -> None:
            for s in range(first, last + 1):
                r.mark(f"step {s}")
                r.keep("kept", leaky, MiB)
                r.keep("grads", cycling, 4 * MiB)
                if (s + micro_from) % 8 == 0:
                    r.free("grads")
        return loop
    v = check(log(steps(14, 45), before=steps(1, 13)), {leaky}, since={leaky: "step 14"})
    assert v["json"]["summary"]["peak"]["at_least"]
