"""The ceiling of live bytes (plan/ceiling.py) and the search the report's line makes from it: no policy fits
above the ceiling, and searched down from it the largest multiple that fits is a multiple that fits with the next
one not -- for the default, the bisection's answer -- in a replay or two."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_runs import training, write  # noqa: E402

from torchalloc.plan import one_run, read_run  # noqa: E402
from torchalloc.plan.ceiling import LiveBytes, largest_where  # noqa: E402
from torchalloc.plan.predict import MAX_MULTIPLE, fits, largest_multiple, unconstrained  # noqa: E402
from torchalloc.replay.engine import DEFAULT_POLICIES, INSTALL_DEFAULT  # noqa: E402

DEMO = str(Path(__file__).resolve().parents[1] / "torchalloc" / "data" / "demo_trace.talog.xz")
MiB, GiB = 1 << 20, 1 << 30


def test_largest_where_is_a_bisection_from_anywhere() -> None:
    rng = random.Random(49)
    for _ in range(3000):
        top = rng.randint(1, 300)
        last = rng.randint(0, top)
        probed: list[int] = []

        def ok(n: int) -> bool:
            probed.append(n)
            assert 1 <= n <= top
            return n <= last

        start = rng.randint(-3, top + 3)
        assert largest_where(ok, start, top) == last
        assert len(probed) <= 2 * max(1, abs(start - last)).bit_length() + 2
    assert largest_where(lambda n: n <= 7, 7, 7) == 7  # one probe when the start is the answer


@pytest.mark.parametrize("source, capacity", [("demo", 4 * GiB), ("training", 48 * MiB)])
def test_no_policy_fits_above_the_ceiling(source: str, capacity: int, tmp_path: Path, library_path: Path) -> None:
    path = DEMO if source == "demo" else str(write(training(4), tmp_path, "b4.talog"))
    model = one_run(read_run(path))
    step = 0.05
    ceiling = LiveBytes(model).ceiling(capacity, step, int(MAX_MULTIPLE / step))
    assert ceiling > 0
    for policy in DEFAULT_POLICIES:
        assert not fits(model, (ceiling + 1) * step, policy, capacity), policy
        largest, at_least = largest_multiple(model, policy, capacity, step, ceiling=ceiling)
        assert largest is not None and not at_least, policy
        assert fits(model, largest, policy, capacity) and not fits(model, largest + step, policy, capacity), policy
        if policy == INSTALL_DEFAULT:
            assert (largest, at_least) == largest_multiple(model, policy, capacity, step)  # the bisection's


def test_a_replay_that_peaked_within_the_capacity_answers_whether_it_fits(library_path: Path) -> None:
    model = one_run(read_run(DEMO))
    peak = unconstrained(model, 3.0, "caching")["peak_reserved"]
    assert ("caching", 3.0) in model.peaks
    model.events_at = None  # type: ignore[assignment, method-assign]  # any replay now fails
    assert fits(model, 3.0, "caching", peak)
    with pytest.raises(TypeError):
        fits(model, 3.0, "caching", peak - 1)  # below its peak: only a replay with that capacity can tell
