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
    marks = dict(zip(ste.MARKS, points[1:5]))
    return ste.phases_of(marks, launched, points[5])


def test_the_phases_are_the_gaps_between_the_marks_and_add_up_to_the_whole() -> None:
    got = process(100.0, 0.5, 3.0, 1.25, 0.75, 0.25)
    assert got == pytest.approx({"interpreter": 0.5, "import": 3.0, "build": 1.25, "steps": 0.75, "exit": 0.25,
                                 "total": 5.75})


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
    rounds = [
        [{"variant": "native", "phases": process(0, 1, 3, 1, 1, 4)},      # 10 s
         {"variant": "install", "phases": process(0, 1, 3.2, 1, 1, 4)}],  # 10.2 s
        [{"variant": "install", "phases": process(0, 1, 3, 1, 1, 5)},     # 11 s
         {"variant": "native", "phases": process(0, 1, 3, 1, 1, 6)}],     # 12 s
        [{"variant": "native", "failed": "exit 1: boom"},
         {"variant": "install", "phases": process(0, 1, 3, 1, 1, 1)}],    # 7 s, no ratio
    ]
    s = ste.summarize(rounds)
    assert s["ratios"] == pytest.approx([1.02, 11 / 12])
    assert s["seconds"]["native"]["total"] == pytest.approx((11.0, 10.0, 12.0))
    assert s["seconds"]["install"]["total"] == pytest.approx((10.2, 7.0, 11.0))
    assert s["seconds"]["install"]["import"] == pytest.approx((3.0, 3.0, 3.2))
    text = ste.table(s)
    assert "install - native" in text and "-0.800" in text  # medians 10.2 against 11.0


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
