"""tests/run.sh's end (issue 50): the tests skipped, by reason, and a loud line when the browser tests did not run.

The summary's shell functions are taken from run.sh itself and run on a pytest log written here, so the
test follows the script without running its builds.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import headless

RUN_SH = Path(__file__).resolve().parents[2] / "tests" / "run.sh"


def summary_of(pytest_log: str, tmp_path: Path, *stage_skips: tuple[int, str]) -> str:
    """What run.sh prints at the end after a pytest run that wrote `pytest_log` and the stages skipped."""
    log = tmp_path / "run-pytest.log"
    log.write_text(pytest_log)
    functions = subprocess.run(["sed", "-n", r"/^skipped() {/,/^}/p; /^summary() {/,/^}/p", str(RUN_SH)],
                               capture_output=True, text=True, check=True).stdout
    collect = subprocess.run(["sed", "-n", r'/^# "SKIPPED \[3\]/,/SKIPPED/p', str(RUN_SH)],
                             capture_output=True, text=True, check=True).stdout
    assert "summary()" in functions and "SKIPPED" in collect, "run.sh's summary functions were not found"
    stages = "".join(f"skipped {n} '{why}'\n" for n, why in stage_skips)
    script = f"set -euo pipefail\nPASSED=7; FAILED=0; SKIPS=()\n{functions}\nlog={log}\n{collect}\n{stages}summary\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout


def test_skips_are_summed_by_reason_and_missing_browser_tests_are_said_loudly(tmp_path: Path) -> None:
    log = (f"SKIPPED [9] python/tests/test_report_layout.py:137: {headless.NO_BROWSER}\n"
           f"SKIPPED [2] python/tests/test_report_page.py:313: {headless.NO_BROWSER}\n"
           "SKIPPED [4] python/tests/test_torch_gpu.py:20: no GPU\n"
           "7 passed, 15 skipped in 1.00s\n")
    out = summary_of(log, tmp_path, (1, "clang stage: clang is not installed"))
    lines = out.splitlines()
    assert lines[-1] == "7 passed, 0 failed"
    assert f"==      11  {headless.NO_BROWSER}" in lines
    assert "==       4  no GPU" in lines and "==       1  clang stage: clang is not installed" in lines
    assert any(line.startswith("run.sh: WARNING: THE 11 BROWSER TESTS DID NOT RUN") for line in lines)


def test_a_run_with_the_browser_says_nothing_of_it(tmp_path: Path) -> None:
    out = summary_of("SKIPPED [1] python/tests/test_torch_gpu.py:20: no GPU\n1 passed\n", tmp_path)
    assert "==       1  no GPU" in out and "BROWSER" not in out


def finish_fuzzers_after(status: int, tmp_path: Path) -> tuple[int, str]:
    """run.sh's finish_fuzzers (stage 5), after a background job that exits `status` as run_fuzzers would; fuzz_api
    not built. Returns (its exit status, what it printed and the counts after)."""
    functions = subprocess.run(["sed", "-n", r"/^AWK_CS=/,/}'$/p; /^stage_done_bg() {/,/^}/p; "
                                r"/^finish_fuzzers() {/,/^}/p", str(RUN_SH)],
                               capture_output=True, text=True, check=True).stdout
    assert "finish_fuzzers()" in functions and "AWK_CS=" in functions, "run.sh's finish_fuzzers was not found"
    (tmp_path / "build").mkdir(parents=True)
    (tmp_path / "build" / "run-fuzz-decode.log").write_text("fuzz_log_decode: 812 inputs\n")
    (tmp_path / "build" / "run-fuzz-snapshot.log").write_text("fuzz_snapshot: 90 snapshots\n")
    (tmp_path / "bg-fuzz.times").write_text("0m0.010s 0m0.002s\n1m29.500s 0m2.000s\n0\n")  # run_fuzzers' bg_done
    script = (f"set -euo pipefail\ncd {tmp_path}\nPASSED=7; FAILED=0; TIMES=(); FUZZ_API=0; FUZZ_T0=$SECONDS\n"
              f"RUN_TMP={tmp_path}\n{functions}\n(exit {status}) &\nFUZZ_PID=$!\nrc=0; finish_fuzzers || rc=$?\n"
              'echo "$rc $PASSED passed, $FAILED failed"\n')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-5]), done.stdout


def test_the_fuzzers_beside_pytest_count_when_they_pass_and_fail_the_run_when_one_fails(tmp_path: Path) -> None:
    status, out = finish_fuzzers_after(0, tmp_path / "pass")
    assert status == 0 and out.splitlines()[-1] == "0 9 passed, 0 failed"
    assert "s, 92s CPU)" in out  # the fuzzers' own CPU time, from their `times`
    assert "== fuzz_log_decode: 812 inputs" in out and "== fuzz_snapshot: 90 snapshots" in out
    status, out = finish_fuzzers_after(11, tmp_path / "fail")
    assert status == 1 and out.splitlines()[-1] == "1 7 passed, 1 failed"
    assert "run.sh: FAILED in fuzz: fuzz_log_decode: an input neither decoded" in out
    assert "---- last lines of build/run-fuzz-decode.log ----" in out
