"""Leaks named (issues 37 and 52): the rule of analysis/sections/leaks.py on hand-made tables of each site's live
bytes at each step marker, its bounded state, and the report's pass against an oracle, in pieces. The shapes a user
meets, recorded by the library and read by every tool, are test_leak_shapes.py's.
"""
from __future__ import annotations

import random
from typing import Any

import pytest

from torchalloc.analysis.sections.leaks import LOWS, MIN_STEPS, Trends, follow, step_kind, step_markers

MiB = 1 << 20


# -- the rules, on hand-made tables --------------------------------------------------------------------------------

def _table(**series: list[int]) -> list[tuple[str, float, dict[str, int]]]:
    n = len(next(iter(series.values())))
    return [(f"step {k + 1}", float(k), {site: b[k] for site, b in series.items()}) for k in range(n)]


def _named(**series: list[int]) -> list[str]:
    return [x.site for x in follow(_table(**series)).leaks()]


def test_growth_never_given_back_is_named_whatever_its_rhythm() -> None:
    for k in range(1, 11):  # a block kept every k-th step: named once the run has four of its rises or more
        for n in range(max(MIN_STEPS, 5 * k), 100, 7):
            assert _named(leak=[(j // k) * MiB for j in range(n)]) == ["leak"], (k, n)
    rng = random.Random(1)
    drawn = [0]
    for _ in range(30):
        drawn.append(drawn[-1] + rng.randint(1, 8) * MiB)
    assert _named(leak=drawn) == ["leak"]
    bursts = [sum(1 for s in range(j) if s % 8 < 3) * MiB for j in range(40)]
    assert _named(leak=bursts) == ["leak"]
    noisy_leak = [j * MiB + rng.randint(0, 4) * MiB for j in range(60)]  # its own blocks come and go too
    assert _named(leak=noisy_leak) == ["leak"]
    trends = follow(_table(late=[max(0, j - 20) * MiB for j in range(40)]))
    (late,) = trends.leaks()
    assert (late.since, late.steps, late.grown, late.per_step, late.live, late.last) == (
        "step 21", 19, 19 * MiB, MiB, 19 * MiB, "step 40")


def test_what_comes_back_is_never_named() -> None:
    """Cycles of 2 to 16 markers, from any phase (a log opened mid-run), above a held base or not, cut by the
    end of the log anywhere; generate() calls of drawn lengths; a site whose bytes come and go at random. A run
    that has not yet seen one fall may be a leak as well as a cycle's first ramp: those are left out."""
    for period in range(2, 17):
        for n in range(MIN_STEPS, 100):
            for phase in (0, 3, 7):
                for base in (0, 5 * MiB):
                    live = [base + ((j + phase) % period) * MiB for j in range(n)]
                    if any(b < a for a, b in zip(live, live[1:])):
                        assert _named(cycle=live) == [], (period, n, phase, base)
    for seed in range(100):
        rng = random.Random(seed)
        kv: list[int] = []
        while len(kv) < rng.randint(20, 80):
            kv += [t * MiB for t in range(rng.randint(6, 12))]
        assert _named(kv=kv) == [], seed
        assert _named(noise=[rng.randint(0, 8) * MiB for _ in range(rng.randint(MIN_STEPS, 80))]) == [], seed


def test_a_warm_up_grew_then_stable() -> None:
    for warm in range(2, 11):
        for n in range(3 * warm, 3 * warm + 20):
            trends = follow(_table(cache=[min(j, warm) * 4 * MiB for j in range(max(n, MIN_STEPS))]))
            assert trends.leaks() == []
            (settled,) = trends.settled()
            assert (settled.steps, settled.since, settled.until, settled.grown) == (
                warm, None, f"step {warm + 1}", 4 * warm * MiB)
            assert settled.words() == (f"cache grew during the first {warm} steps, then stable "
                                       f"(+{4 * warm}.0 MiB; {4 * warm}.0 MiB live)")
    (later,) = follow(_table(cache=[0] * 5 + [min(j, 4) * MiB for j in range(25)])).settled()
    assert (later.since, later.until, later.steps) == ("step 6", "step 10", 4)  # at 0 up to step 6
    assert "grew from step 6 to step 10, then stable" in later.words()


def test_too_few_markers_name_nothing() -> None:
    trends = follow(_table(leak=[j * MiB for j in range(MIN_STEPS - 1)]))
    assert not trends.enough() and trends.leaks() == [] and trends.settled() == []
    trends.marker("step 8", 8.0, {"leak": MIN_STEPS * MiB})
    assert trends.enough() and [x.site for x in trends.leaks()] == ["leak"]


def test_leaks_are_listed_the_largest_growth_per_step_first() -> None:
    rows = _table(slow=[j * MiB for j in range(20)], fast=[3 * j * MiB for j in range(20)], flat=[MiB] * 20)
    assert [x.site for x in follow(rows).leaks()] == ["fast", "slow"]


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
    want = [(x.site, x.per_step, x.since, x.steps, x.live) for x in follow(table).leaks()]
    assert want, "the run should hold at least one leak"
    path = L.file()
    for chunk in (3, 17, 1 << 16):  # pieces smaller than a step, and the whole log as one
        rows = analysis.analyze(path, chunk_records=chunk).section_rows("leaks").rows
        assert [(x.site, x.per_step, x.since, x.steps, x.live) for x in rows] == want, chunk


def test_a_long_run_keeps_nothing_per_marker() -> None:
    """Thousands of step markers: per site LOWS low points, and the labels of a few markers, never one per marker;
    told only the sites that changed, it finds what it finds when told every site."""
    found = []
    for told in (False, True):  # each site's bytes looked at, or only those said to have changed
        s = Trends()
        for k in range(5000):
            live = {"leak": 1000 * (k // 3), "saw": (k % 7) * 100, "flat": 7, f"once {k % 10}": 1}
            changed = list(live) if not k else ["leak", "saw", f"once {k % 10}", f"once {(k - 1) % 10}"]
            s.marker(f"step {k}", float(k), live, changed if told else None)  # flat: said changed at the first only
        assert len(s.sites) == 13 and all(len(st.lows) <= LOWS for st in s.sites.values())
        assert len(s._named) < 100  # two markers a site names, the first and the last: bounded by the sites
        found.append([x.to_dict() for x in s.leaks()])
    assert found[0] == found[1]
    (leak,) = found[0]
    assert (leak["site"], leak["since"], leak["steps"], leak["grown"]) == ("leak", "step 2", 4997, 1000 * 1666)
