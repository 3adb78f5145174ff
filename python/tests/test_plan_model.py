"""The model of `torchalloc plan` against runs written at the size it predicts (plan_runs.py): what it predicts
from a run at batch B is what the run written at 2B and 4B does under every policy, replayed the same way; two
runs at two sequence lengths measure attention's quadratic law; what the analysis cannot attribute bounds the
prediction; the largest batch that fits is the one a bisection of real runs finds."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_runs import training, write  # noqa: E402

from torchalloc.log.trace import load_trace  # noqa: E402
from torchalloc.plan import PlanError, fit_pair, make_plan, one_run, read_run  # noqa: E402
from torchalloc.plan.laws import growth, law_name  # noqa: E402
from torchalloc.plan.predict import fits  # noqa: E402
from torchalloc.replay.engine import DEFAULT_POLICIES, INSTALL_DEFAULT, replay_once  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan")


def real(path: Path, policy: str, capacity: int = 0) -> dict[str, int]:
    result, _ = replay_once(load_trace(path), policy, capacity)
    return result


def predicted(model, x: float, policy: str, capacity: int = 0) -> dict[str, int]:  # type: ignore[no-untyped-def]
    result, _ = replay_once(model.events_at(x), policy, capacity)
    return result


@pytest.mark.parametrize("x", [2, 4])
def test_one_run_predicts_the_run_at_a_multiple_of_its_batch_under_every_policy(folder: Path, x: int,
                                                                               library_path: Path) -> None:
    model = one_run(read_run(write(training(4), folder, "b4.talog")))
    bigger = write(training(4 * x), folder, f"b{4 * x}.talog")
    for policy in DEFAULT_POLICIES:
        got, want = predicted(model, x, policy), real(bigger, policy)
        assert (got["peak_allocated"], got["peak_reserved"]) == (want["peak_allocated"], want["peak_reserved"]), \
            policy
    assert model.runs == 1 and not model.unattributed.any()


def test_at_1x_the_trace_is_the_recorded_one(folder: Path, library_path: Path) -> None:
    path = write(training(4), folder, "b4.talog")
    model = one_run(read_run(path))
    assert np.array_equal(model.events_at(1.0), load_trace(path).events)
    grown = model.events_at(3.0)
    assert np.array_equal(grown["kind"], model.trace.events["kind"])  # the same events, in the same order
    assert np.array_equal(grown["addr"], model.trace.events["addr"])
    assert (grown["size"] >= model.trace.events["size"]).all() and (grown["size"] > model.trace.events["size"]).any()


def test_two_runs_measure_attentions_quadratic_law(folder: Path, library_path: Path) -> None:
    """Sequence length as the knob: attention's scores grow with its square. The pair at 128 and 256 predicts
    512 exactly; one run, taking every activation as linear, falls short."""
    a = read_run(write(training(2, 128), folder, "s128.talog"))
    b = read_run(write(training(2, 256), folder, "s256.talog"))
    at_512 = write(training(2, 512), folder, "s512.talog")
    model = fit_pair(a, b)
    assert model.r == 2.0 and model.matched == "in order" and not model.unattributed.any()
    for policy in DEFAULT_POLICIES:
        got, want = predicted(model, 4, policy), real(at_512, policy)
        assert (got["peak_allocated"], got["peak_reserved"]) == (want["peak_allocated"], want["peak_reserved"]), \
            policy
    assert predicted(one_run(a), 4, INSTALL_DEFAULT)["peak_allocated"] < real(at_512, INSTALL_DEFAULT)[
        "peak_allocated"]
    laws = {law for _, law, _, _ in make_plan(model, 4.0, None, policies=[INSTALL_DEFAULT]).laws}
    assert {"constant", "linear", "quadratic"} <= laws


def test_the_knob_ratio_given_is_the_ratio_measured(folder: Path, library_path: Path) -> None:
    a = read_run(write(training(2, 128), folder, "s128.talog"))
    b = read_run(write(training(2, 256), folder, "s256.talog"))
    measured, given = fit_pair(a, b), fit_pair(a, b, 2.0)
    assert np.array_equal(measured.rho, given.rho)
    assert np.array_equal(measured.sizes_at(3.0), given.sizes_at(3.0))


def test_runs_that_allocate_differently_are_matched_site_by_site(folder: Path, library_path: Path) -> None:
    """One more step in the second run: no allocation-by-allocation match, so each site and phase's mean size
    gives its law where the counts differ."""
    a = read_run(write(training(2, steps=4), folder, "b2s4.talog"))
    b = read_run(write(training(4, steps=5), folder, "b4s5.talog"))
    model = fit_pair(a, b)
    assert model.matched == "by site" and model.by_site_mean > 0 and model.r == 2.0
    grown = model.sizes_at(2.0)
    assert grown.sum() > a.size.sum()


def test_a_size_chosen_anew_between_two_logs_is_no_law(folder: Path, library_path: Path) -> None:
    """A workspace of 4 KiB at batch 2 and 512 MiB at batch 4 (another algorithm): taken as a law it grows as
    the knob's 17th power, past any device at 4x (ResNet-50's two logs did that). It gets its category's law
    instead, counted and said, and the prediction is the model's with that block linear."""
    a = read_run(write(training(2, workspace=4096), folder, "w2.talog"))
    b = read_run(write(training(4, workspace=512 * MiB), folder, "w4.talog"))
    model = fit_pair(a, b, 2.0)
    per_step = 3 * 4  # one workspace per layer and step
    assert model.off_law == per_step and model.unattributed.sum() == per_step
    assert model.sizes_at(4.0).max() < 64 * MiB  # no power law: the workspace grown linearly from 4 KiB
    plan = make_plan(model, 4.0, None, policies=[INSTALL_DEFAULT])
    assert plan.default is not None and not plan.default.too_large and plan.default.peak_allocated > 0
    words = " ".join(limit.text for limit in plan.limits)
    assert f"{per_step} of them because their sizes shrank or grew faster than the knob's square" in words


def test_bytes_not_attributed_bound_the_prediction(folder: Path, library_path: Path) -> None:
    """The first step's token ids kept for the whole run: persistent, made in forward, neither a parameter nor
    optimizer state, so not attributed. Kept at their size, the prediction is low by their growth; grown, it
    is the real run's."""
    model = one_run(read_run(write(training(4, kept_input=True), folder, "kept4.talog")))
    bigger = write(training(8, kept_input=True), folder, "kept8.talog")
    assert model.unattributed.sum() == 1
    for policy in DEFAULT_POLICIES:
        low, high = predicted(model, 2, policy)["peak_allocated"], real(bigger, policy)["peak_allocated"]
        assert low < high, policy
        result, _ = replay_once(model.events_at(2.0, high=True), policy, 0)
        assert result["peak_allocated"] == high, policy
    plan = make_plan(model, 2.0, 1 << 30, policies=[INSTALL_DEFAULT], search=False)
    assert plan.by_kind["not attributed"] == 4 * 128 * 8  # the token ids: batch x seq int64
    words = next(x.text for x in plan.limits if x.key == "unattributed")
    assert "not attributed" in words and "would be" in words


def test_the_largest_batch_that_fits_is_what_real_runs_find(folder: Path, library_path: Path) -> None:
    """Batch by batch, the model's run fits the capacity exactly when the real run does, so a bisection over the
    model's runs finds what one over real runs finds: a batch that fits, the next one not. (Fitting is not
    monotone: under caching here 17-19 do not fit and 20 does, its 20 MiB segments falling differently.)"""
    capacity = 48 * MiB
    model = one_run(read_run(write(training(4), folder, "b4.talog")))
    plan = make_plan(model, 2.0, capacity, recorded=4, policies=["caching", INSTALL_DEFAULT, "exact"])
    for p in plan.policies:
        real_fits = {b: not real(write(training(b), folder, f"b{b}.talog"), p.policy, capacity)["oom"]
                     for b in range(1, 64)}
        assert {b: fits(model, b / 4, p.policy, capacity) for b in real_fits} == real_fits, p.policy
        largest = plan.batch_of(p.largest)
        assert largest is not None and real_fits[largest] and not real_fits[largest + 1], p.policy


def test_steps_come_from_markers_else_from_phases(folder: Path, library_path: Path) -> None:
    marked = read_run(write(training(2, steps=4), folder, "marked.talog")).steps
    assert marked.by == "markers like 'step 1'" and marked.complete == 3  # from each marker to the next
    phased = read_run(write(training(2, steps=4, markers=False), folder, "phased.talog")).steps
    assert phased.by == "the end of each optimizer phase" and phased.complete == 4
    assert phased.spread() is not None and phased.spread()[2] < 0.02  # fixed shapes: steps alike


def test_a_run_cut_before_its_first_step_or_with_nothing_that_scales_is_refused(folder: Path,
                                                                               library_path: Path) -> None:
    with pytest.raises(PlanError, match="no complete step"):
        one_run(read_run(write(training(2, cut_after="backward"), folder, "cut.talog")))
    from synthlog import SynthLog

    L = SynthLog()
    L.alloc(1 << 32, 4 * MiB)  # persistent, no phase, no marker: nothing grows with the batch
    L.alloc(2 << 32, 4 * MiB)
    with pytest.raises(PlanError, match="no block whose size scales"):
        one_run(read_run(write(L, folder, "flat.talog")))


def test_two_logs_at_the_same_size_have_no_law_to_measure(folder: Path, library_path: Path) -> None:
    a = read_run(write(training(2), folder, "same1.talog"))
    b = read_run(write(training(2), folder, "same2.talog"))
    with pytest.raises(PlanError, match="no block whose size changes"):
        fit_pair(a, b)


@pytest.mark.parametrize("rho,name,at4", [(1.0, "constant", 1.0), (2.0, "linear", 4.0), (4.0, "quadratic", 16.0),
                                         (1.5, "affine", 2.5), (3.0, "linear + quadratic", 10.0),
                                         (8.0, "power 3.00", 64.0), (0.5, "power -1.00", 0.25)])
def test_the_law_through_two_sizes(rho: float, name: str, at4: float) -> None:
    """Measured at 1 and 2: 1.5 is a + b x with a = b (at 4: 5/2), 3 is x + x^2 (at 4: 20/2)."""
    assert law_name(rho, 2.0) == name
    assert growth(np.array([rho]), 2.0, 4.0)[0] == pytest.approx(at4)
    assert growth(np.array([rho]), 2.0, 1.0)[0] == pytest.approx(1.0)
    assert growth(np.array([rho]), 2.0, 2.0)[0] == pytest.approx(rho)
