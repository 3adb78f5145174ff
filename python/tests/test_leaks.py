"""Leaks named (issue 37 item 3): a site whose live bytes rise at each step marker, STEPS in a row, is flagged in
the analysis, the text report's summary and section, --json and the page's summary.

The runs drive the library on the simulated device with Python stacks: each step allocates activations at one
line (`_activation`) and frees them, and a leaky run keeps one of them per step in a list never cleared -- so the
site's live bytes at the step markers rise by one activation per step. The pure streak rules (leaks.py) are tested
on hand-made tables.
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pytest

from torchalloc.analysis.leaks import STEPS, Streaks, find_leaks, step_kind, step_markers

MiB = 1 << 20
ACT = 4 * MiB


def _activation(lib: Any) -> int:
    return lib.torchalloc_malloc(ACT, 0, None)  # the line every activation is allocated at


def _state(lib: Any) -> int:
    return lib.torchalloc_malloc(MiB, 0, None)  # optimizer state, say: a site of its own


def _activation_site() -> str:
    return f"test_leaks.py:{_activation.__code__.co_firstlineno + 1} _activation"


def _record(lib: Any, path: Path, steps: int, kept_steps: int, state_steps: int) -> None:
    """On the library `lib` (loaded once per process: the sim fixture's), `steps` steps, each marked "step k": three activations allocated and freed, except that in the first
    `kept_steps` steps one is kept in a list for the whole run; in the first `state_steps` one more block of state
    is allocated and kept."""
    from torchalloc import _lib

    _lib.teardown()  # the fixture's configuration: this one logs, with stacks
    _lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,log:{path},stacks:1")
    kept, state = [], []
    try:
        for k in range(1, steps + 1):
            assert lib.torchalloc_mark(f"step {k}".encode()) == 0
            acts = [_activation(lib) for _ in range(3)]
            assert all(acts)
            if k <= kept_steps:
                kept.append(acts.pop())
            for p in acts:
                lib.torchalloc_free(p, ACT, 0, None)
            if k <= state_steps:
                state.append(_state(lib))
    finally:
        _lib.teardown()  # closes the log


@pytest.fixture
def record(sim: ctypes.CDLL, tmp_path: Path) -> Any:
    from torchalloc import _lib

    if not _lib.has("torchalloc_mark"):
        pytest.skip("this libtorchalloc has no event log")

    def run(name: str, **kw: int) -> Path:
        path = tmp_path / f"{name}.talog"
        _record(sim, path, **kw)
        return path
    return run


def test_a_list_that_keeps_an_activation_per_step_is_named(record: Any, tmp_path: Path) -> None:
    from torchalloc.report.html import render_html
    from torchalloc.report.text import SUMMARY_LINES, render_text, report
    from torchalloc import analysis

    # state grows for STEPS - 1 steps only: one rise short of a streak
    path = record("leak", steps=8, kept_steps=8, state_steps=STEPS - 1)
    data = json.loads(json.dumps(report(path)))  # as --json prints it
    (leak,) = data["leaks"]
    assert leak["site"] == _activation_site()
    assert leak["per_step"] == ACT
    assert leak["since"] == "step 1"  # live 0 at step 1, one activation more at each marker after
    assert leak["steps"] == 7 and leak["until"] is None
    assert leak["live"] == 7 * ACT  # at step 8; the eighth kept activation comes after the last marker
    assert data["summary"]["leaks"] == [leak] and data["summary"]["leak_count"] == 1

    a = analysis.analyze(path)
    text = render_text(a, width=120)
    summary = text.split("== Summary")[1].split("== Timeline")[0]
    assert len(summary.strip().splitlines()) < SUMMARY_LINES
    line = f"Leak: grows 4.0 MiB per step at {_activation_site()} since step 1 (7 steps in a row; 28.0 MiB live then)"
    assert line in summary
    assert "== Leaks: sites whose live bytes rose step after step" in text
    page = render_html(a)
    assert 'class="summary-leaks"' in page and '<h2 id="leaks">' in page and f"per step at {_activation_site()} since step 1" in page


def test_no_leak_flags_nothing(record: Any) -> None:
    from torchalloc.report.text import report, render_text
    from torchalloc import analysis

    path = record("clean", steps=8, kept_steps=0, state_steps=0)
    data = report(path)
    assert data["leaks"] == [] and data["summary"]["leak_count"] == 0
    text = render_text(analysis.analyze(path), width=120)
    assert "Leak:" not in text and "== Leaks" not in text


def test_a_streak_shorter_than_steps_is_not_a_leak_and_one_that_stopped_says_until(record: Any) -> None:
    from torchalloc.report.text import report

    # k kept (one in each of the first k steps): live k-1 kept at marker k, so k rises from step 1
    short = report(record("short", steps=8, kept_steps=STEPS - 1, state_steps=0))
    assert short["leaks"] == []
    # STEPS rises, then flat from step STEPS + 2 on: still named, with where it stopped
    (leak,) = report(record("stopped", steps=STEPS + 3, kept_steps=STEPS, state_steps=0))["leaks"]
    assert (leak["since"], leak["steps"], leak["until"]) == ("step 1", STEPS, f"step {STEPS + 2}")
    assert leak["per_step"] == ACT and leak["live"] == STEPS * ACT


# -- the rules, on hand-made tables --------------------------------------------------------------------------------

def _table(**series: list[int]) -> list[tuple[str, float, dict[str, int]]]:
    n = len(next(iter(series.values())))
    return [(f"step {k + 1}", float(k), {site: b[k] for site, b in series.items()}) for k in range(n)]


def test_streak_rules() -> None:
    M = MiB
    rows = _table(leak=[0, M, 2 * M, 3 * M, 5 * M, 6 * M, 7 * M],  # uneven rises: the mean, rounded down
                  flat=[M] * 7, saw=[M, 2 * M, M, 2 * M, M, 2 * M, M],
                  late=[0, 0, 0, M, 2 * M, 3 * M, 4 * M])  # 4 rises, from step 3
    (leak,) = find_leaks(rows, n=5)
    assert (leak.site, leak.per_step, leak.since, leak.steps, leak.live) == ("leak", 7 * M // 6, "step 1", 6, 7 * M)
    by_site = {x.site: x for x in find_leaks(rows, n=3)}
    assert set(by_site) == {"leak", "late"} and by_site["late"].since == "step 3"
    assert [x.site for x in find_leaks(rows, n=3)] == ["leak", "late"]  # larger growth per step first (7/6 vs 1)


def test_the_last_flagged_streak_is_kept_and_a_site_may_vanish() -> None:
    M = MiB
    s = Streaks(2)
    for k, live in enumerate([{"a": M}, {"a": 2 * M}, {"a": 3 * M}, {}, {}, {"a": M}, {"a": 3 * M}]):
        s.marker(f"m{k}", float(k), live)
    (leak,) = s.leaks()  # the first streak ended at m3; the second (m4 .. m6, from 0) is the last flagged
    assert (leak.since, leak.steps, leak.per_step, leak.until) == ("m4", 2, 3 * M // 2, None)
    with pytest.raises(ValueError):
        Streaks(0)


def test_step_markers() -> None:
    assert step_markers(["model", "step 1", "fwd", "step 2", "fwd", "fwd"]) == [1, 3]  # names a step: preferred
    assert step_markers(["model", "after fwd", "after fwd", "x 1", "x 2", "x 3"]) == [3, 4, 5]  # the most frequent
    assert step_markers(["model", "checkpoint", "done"]) == []
    assert step_kind({"fwd": 3, "epoch N": 2, "step N": 3}) == "step N"  # names a step; the most frequent such
    assert step_kind({"a": 2, "b": 3}) == "b" and step_kind({"a": 2, "b": 2}) == "a" and step_kind({"a": 1}) is None


# -- the pass against an oracle, in pieces -----------------------------------------------------------------------

def _random_run(seed: int, steps: int) -> tuple[Any, list[tuple[str, float, dict[str, int]]]]:
    """A SynthLog of `steps` steps marked "step k" over six sites -- some keep a block in some steps (streaks of
    every length), all allocate and free others -- and, as the oracle, each site's live bytes at each marker
    counted from the events themselves."""
    import random

    from synthlog import SynthLog

    rng = random.Random(seed)
    L = SynthLog()
    sites = [L.stack((f"model{k}.py", 10 + k, f"layer{k}")) for k in range(6)]
    label = {s: f"model{k}.py:{10 + k} layer{k}" for k, s in enumerate(sites)}
    keep_p = [0.95, 0.8, 0.5, 0.2, 0.0, 0.9]  # the chance a site keeps a block in a step
    owner: dict[int, int] = {}
    kept: list[int] = []
    table = []
    addr = 1 << 20
    for k in range(1, steps + 1):
        L.mark(f"step {k}")
        live: dict[str, int] = {}
        for a, s in owner.items():
            live[label[s]] = live.get(label[s], 0) + L.live[a][1]
        table.append((f"step {k}", 0.0, live))
        for s, p in zip(sites, keep_p):
            for _ in range(rng.randint(1, 3)):
                addr += 1 << 20
                L.alloc(addr, rng.choice((512, 4096, 1 << 20)), stack=s)
                owner[addr] = s
                if rng.random() < p:
                    kept.append(addr)
                else:
                    L.free(addr)
                    del owner[addr]
        if kept and rng.random() < 0.15:  # now and then a kept block goes
            gone = kept.pop(rng.randrange(len(kept)))
            L.free(gone)
            del owner[gone]
    return L, table


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_pass_in_pieces_flags_what_the_oracle_flags(seed: int) -> None:
    from torchalloc import analysis

    L, table = _random_run(seed, steps=30)
    want = [(x.site, x.per_step, x.since, x.steps, x.live, x.until) for x in find_leaks(table)]
    assert want, "the run should hold at least one streak"
    path = L.file()
    for chunk in (3, 17, 1 << 16):  # pieces smaller than a step, and the whole log as one
        rows = analysis.analyze(path, chunk_records=chunk).section_rows("leaks").rows
        assert [(x.site, x.per_step, x.since, x.steps, x.live, x.until) for x in rows] == want, chunk


def test_a_long_run_keeps_nothing_per_marker() -> None:
    """Thousands of step markers: the streaks remember a few markers' labels, never one per marker."""
    for told in (False, True):  # each site's bytes looked at, or only those said to have changed
        s = Streaks()
        for k in range(5000):
            live = {"leak": 1000 * k, "saw": k % 2, "flat": 7, f"once {k}": 1}
            changed = list(live) if not k else ["leak", "saw", f"once {k}", f"once {k - 1}"]  # flat: at the first
            s.marker(f"step {k}", float(k), live, changed if told else None)
        assert len(s.sites) == 4  # leak, saw, flat, the last 'once': a site gone with no streak is forgotten
        assert len(s._named) < 30  # the labels of a few markers only (forgotten now and then)
        (leak,) = s.leaks()
        assert (leak.site, leak.since, leak.steps, leak.per_step) == ("leak", "step 0", 4999, 1000)
