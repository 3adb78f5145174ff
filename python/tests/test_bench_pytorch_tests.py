"""bench/pytorch_tests.py's machinery on a stand-in test file (no torch, no GPU needed): every test in its own
process, and a pass, a failure, a skip, a crash, a hang and a hang at exit each reported as what it is."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pytorch_tests", REPO / "bench" / "pytorch_tests.py")
assert spec and spec.loader
runner = importlib.util.module_from_spec(spec)
sys.path.insert(0, str(REPO / "bench"))
spec.loader.exec_module(runner)

STAND_IN = '''
import os, signal, threading, time, unittest
from torchalloc_stand_in import missing_helper   # a name the "installed torch" lacks: --stub puts one there
class TestCuda(unittest.TestCase):
    def test_memory_passes(self):
        self.assertEqual(1 + 1, 2)
    def test_memory_fails(self):
        self.assertEqual(1, 2)
    def test_memory_uses_a_missing_name(self):
        missing_helper()
    def test_memory_crashes(self):
        os.kill(os.getpid(), signal.SIGSEGV)
    def test_memory_hangs(self):
        time.sleep(3600)
    def test_memory_hangs_at_exit(self):
        threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon: exit waits for it
    def test_unrelated(self):
        pass
class TestOther(unittest.TestCase):
    def test_memory_elsewhere(self):
        pass
'''


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    (tmp_path / "torchalloc_stand_in.py").write_text("")
    path = tmp_path / "test_stand_in.py"
    path.write_text(STAND_IN)
    return path


def env(tmp_path: Path, timeout: float) -> dict[str, str]:
    e = runner.child_env(None, timeout, None)
    e["PYTHONPATH"] = os.pathsep.join([str(tmp_path), e["PYTHONPATH"]])
    return e


def test_listing_and_selection(stand_in: Path, tmp_path: Path) -> None:
    names = runner.list_tests(str(stand_in), ["torchalloc_stand_in:missing_helper"], env(tmp_path, 60), 60)
    assert len(names) == 8
    chosen = runner.selected(names, runner.SELECT, runner.CLASSES)
    assert "TestCuda.test_unrelated" not in chosen and "TestOther.test_memory_elsewhere" not in chosen
    assert len(chosen) == 6


@pytest.mark.parametrize("test,outcome", [
    ("test_memory_passes", "passed"),
    ("test_memory_fails", "failed"),
    ("test_memory_uses_a_missing_name", "skipped"),
    ("test_memory_crashes", "crashed (SIGSEGV)"),
])
def test_each_outcome_is_told_apart(stand_in: Path, tmp_path: Path, test: str, outcome: str) -> None:
    r = runner.run_one("native", str(stand_in), f"TestCuda.{test}", ["torchalloc_stand_in:missing_helper"],
                       env(tmp_path, 120), 120)
    assert r["outcome"] == outcome, r


@pytest.mark.parametrize("test,outcome", [("test_memory_hangs", "timed out"),
                                          ("test_memory_hangs_at_exit", "passed, then hung at exit")])
def test_hangs_end_with_the_stacks(stand_in: Path, tmp_path: Path, test: str, outcome: str) -> None:
    r = runner.run_one("native", str(stand_in), f"TestCuda.{test}", ["torchalloc_stand_in:missing_helper"],
                       env(tmp_path, 15), 15)
    assert r["outcome"] == outcome, r
    assert "Timeout (" in r["detail"] and "File " in r["detail"], r["detail"]
