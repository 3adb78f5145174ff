"""bench/start_to_exit.py without a GPU: the phases cut from a process's marks, the summary over rounds, the
verdict against native + 2 %, the turned order, and SKIP where the script cannot run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import start_to_exit as ste  # noqa: E402


def process(launched: float, *gaps: float) -> dict[str, float]:
    """Phases of a process launched at `launched` whose phases took `gaps` seconds (interpreter first)."""
    points = [launched]
    for g in gaps:
        points.append(points[-1] + g)
    marks = dict(zip(ste.MARKS, points[1:-1]))
    return ste.phases_of(marks, launched, points[-1])


def test_the_phases_are_the_gaps_between_the_marks_and_add_up_to_the_whole() -> None:
    got = process(100.0, 0.5, 3.0, 0.25, 2.0, 1.25, 0.75, 0.25)
    assert got == pytest.approx({"interpreter": 0.5, "torch": 3.0, "install": 0.25, "model": 2.0, "to_gpu": 1.25,
                                 "steps": 0.75, "exit": 0.25, "total": 8.0})


def test_marks_are_read_from_the_last_json_line_and_a_script_that_printed_none_has_none() -> None:
    marks = {k: float(i) for i, k in enumerate(ste.MARKS)}
    out = "60 steps: 0.9 s\n" + json.dumps({"marks": marks}) + "\n"
    assert ste.marks_in(out) == marks
    assert ste.marks_in("60 steps: 0.9 s\n") is None
    assert ste.marks_in('{"marks": {"started": 1}}\n') is None  # a mark missing
    assert ste.marks_in("{not json\n") is None


def test_rounds_turn_the_order() -> None:
    assert ste.order_of(0) == ("native", "install")
    assert ste.order_of(1) == ("install", "native")
    assert ste.order_of(2) == ste.order_of(0)


def test_the_summary_takes_each_rounds_ratio_and_skips_a_failed_process() -> None:
    #                 interpreter torch install model to_gpu steps exit
    rounds = [
        [{"variant": "native", "phases": process(0, 1, 3, 0, 2, 1, 1, 2)},        # 10 s
         {"variant": "install", "phases": process(0, 1, 3, 0.2, 2, 1, 1, 2)}],    # 10.2 s
        [{"variant": "install", "phases": process(0, 1, 3, 0.2, 1.8, 1, 1, 3)},   # 11 s: the CPU's model faster
         {"variant": "native", "phases": process(0, 1, 3, 0, 3, 1, 1, 3)}],      # 12 s
        [{"variant": "native", "failed": "exit 1: boom"},
         {"variant": "install", "phases": process(0, 1, 3, 0.2, 0.8, 1, 1, 0)}],  # 7 s, no ratio
    ]
    s = ste.summarize(rounds)
    assert s["ratios"] == pytest.approx([1.02, 11 / 12])
    # what install() added where an allocator runs: 0.2 s in both rounds, whatever the CPU's model cost
    assert s["allocator_shares"] == pytest.approx([0.2 / 10, 0.2 / 12])
    assert s["seconds"]["native"]["total"] == pytest.approx((11.0, 10.0, 12.0))
    assert s["seconds"]["install"]["total"] == pytest.approx((10.2, 7.0, 11.0))
    assert s["seconds"]["install"]["model"] == pytest.approx((1.8, 0.8, 2.0))
    text = ste.table(s)
    assert "install - native" in text and "-0.800" in text  # medians 10.2 against 11.0
    assert ste.allocator_line(s["allocator_share"]).endswith("+1.8 % of native's start to exit, median of the "
                                                              "rounds (+1.7 to +2.0 %)")


def test_the_verdict_against_native_plus_two_percent() -> None:
    assert ste.verdict((1.019, 0.95, 1.1)).endswith("met (target <= 1.02x)")
    assert "within the spread" in ste.verdict((1.05, 1.01, 1.1))
    assert "NOT met" in ste.verdict((1.05, 1.03, 1.1))
    assert "no verdict" in ste.verdict(None)


def test_without_a_gpu_it_says_skip_and_exits_2() -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "start_to_exit.py"), "--rounds", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("SKIP: exit 2:") and "short_train.py: needs" in done.stdout


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--timeout", "0"]])
def test_bad_arguments_are_refused(args: list[str]) -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "start_to_exit.py"), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "must be" in done.stderr
