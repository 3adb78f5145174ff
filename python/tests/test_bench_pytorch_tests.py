"""bench/pytorch_tests.py's machinery on a stand-in test file (no torch, no GPU needed): every test in its own
process, and a pass, a failure, a skip, a crash, a hang and a hang at exit each reported as what it is."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
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


MULTIGPU_STAND_IN = '''
import os, unittest
class TestCudaMultiGPU(unittest.TestCase):
    def test_copy_between_devices(self):  # no word of the test_cuda.py selection: runs all the same
        self.assertEqual(os.environ["CUDA_VISIBLE_DEVICES"], "0,1")
class TestCudaComm(unittest.TestCase):
    def test_scatter_gpu(self):
        self.assertEqual(os.environ["CUDA_VISIBLE_DEVICES"], "0,1")
class TestOther(unittest.TestCase):
    def test_memory_elsewhere(self):
        pass
'''


def test_each_file_has_its_classes_selection_and_gpus() -> None:
    multi = runner.defaults_for("/checkout/test/test_cuda_multigpu.py")
    assert multi.classes == ("TestCudaMultiGPU", "TestCudaComm") and multi.gpus_per_test == 2
    assert runner.selected(["TestCudaComm.test_gather", "TestCudaMultiGPU.test_streams", "TestCuda.test_gather"],
                           multi.select, multi.classes) == ["TestCudaComm.test_gather", "TestCudaMultiGPU.test_streams"]
    assert runner.defaults_for("test/test_cuda.py") == runner.defaults_for("my_copy.py") == \
        runner.FileDefaults(runner.CLASSES, runner.SELECT, 1)


@pytest.mark.parametrize("gpus,per_test,slots", [
    (["0", "1"], 1, ["0", "1"]),
    (["0", "1"], 2, ["0,1"]),
    (["0", "1", "2", "3"], 2, ["0,1", "2,3"]),
    (["0", "1", "2"], 2, ["0,1"]),  # the third GPU alone cannot run a two-GPU test
    (None, 2, [None]),
])
def test_gpu_groups(gpus: list[str] | None, per_test: int, slots: list[str | None]) -> None:
    assert runner.gpu_groups(gpus, per_test) == slots


def test_too_few_gpus_is_refused_before_anything_runs(tmp_path: Path) -> None:
    path = tmp_path / "test_cuda_multigpu.py"
    path.write_text(MULTIGPU_STAND_IN)
    with pytest.raises(ValueError, match="a test given 2 GPUs needs that many in --gpus \\(0\\)"):
        runner.gpu_groups(["0"], 2)
    done = subprocess.run([sys.executable, str(REPO / "bench" / "pytorch_tests.py"), str(path), "--gpus", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "a test given 2 GPUs needs that many in --gpus (0)" in done.stderr


def test_two_files_in_one_pool_each_test_on_its_gpus(tmp_path: Path, stand_in: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    multi = tmp_path / "test_cuda_multigpu.py"
    multi.write_text(MULTIGPU_STAND_IN)
    paths = [str(stand_in), str(multi)]
    stubs = ["torchalloc_stand_in:missing_helper"]
    chosen = {str(stand_in): ["TestCuda.test_memory_passes", "TestCuda.test_memory_uses_a_missing_name"],
              str(multi): runner.selected(runner.list_tests(str(multi), [], env(tmp_path, 60), 60),
                                          runner.defaults_for(str(multi)).select,
                                          runner.defaults_for(str(multi)).classes)}
    assert chosen[str(multi)] == ["TestCudaComm.test_scatter_gpu", "TestCudaMultiGPU.test_copy_between_devices"]
    slots = {str(stand_in): runner.gpu_groups(["0", "1"], 1), str(multi): runner.gpu_groups(["0", "1"], 2)}
    out = tmp_path / "out.json"
    args = argparse.Namespace(jobs=3, timeout=120, lib=None, json=out, repeat=1)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    results = runner.run_all(paths, chosen, ["native"], slots, stubs, args, "2.11.0")
    assert {n: r["native"]["outcome"] for n, r in results[str(multi)].items()} == {
        "TestCudaComm.test_scatter_gpu": "passed", "TestCudaMultiGPU.test_copy_between_devices": "passed"}
    assert {n: r["native"]["outcome"] for n, r in results[str(stand_in)].items()} == {
        "TestCuda.test_memory_passes": "passed", "TestCuda.test_memory_uses_a_missing_name": "skipped"}
    written = json.loads(out.read_text())
    assert written["complete"] is True and set(written["files"]) == set(paths)
    assert written["files"][str(multi)]["TestCudaComm.test_scatter_gpu"]["native"]["outcome"] == "passed"


FLAKY_STAND_IN = '''
import os, threading, time, unittest
class TestCuda(unittest.TestCase):
    def test_memory_hangs_at_exit_once(self):
        # the first run to take the marker hangs at exit; the others exit cleanly
        try:
            os.close(os.open(os.environ["FLAKY_MARKER"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        threading.Thread(target=time.sleep, args=(3600,)).start()
'''


def test_repeated_runs_count_an_outcome_seen_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "test_flaky.py"
    path.write_text(FLAKY_STAND_IN)
    monkeypatch.setenv("FLAKY_MARKER", str(tmp_path / "marker"))
    args = argparse.Namespace(jobs=2, timeout=10, lib=None, json=None, repeat=3)
    name = "TestCuda.test_memory_hangs_at_exit_once"
    results = runner.run_all([str(path)], {str(path): [name]}, ["native"], {str(path): [None]}, [], args, "2.11.0")
    folded = results[str(path)][name]["native"]
    assert folded["outcome"] == "passed 2, passed, then hung at exit 1"
    assert sorted(folded["runs"]) == ["passed", "passed", "passed, then hung at exit"]
    assert "Timeout (" in folded["detail"]  # the rare run's stacks, the one worth reading


def test_runs_that_agree_fold_into_one_outcome() -> None:
    runs = [{"outcome": "passed", "detail": "", "seconds": s} for s in (1.0, 2.5)]
    assert runner.fold_runs(runs) == {"outcome": "passed x2", "detail": "", "seconds": 2.5,
                                      "runs": ["passed", "passed"]}
    assert runner.fold_runs(runs[:1]) is runs[0]


def test_a_decorator_stand_in_leaves_the_test_as_it_is(tmp_path: Path) -> None:
    # skipIfSandcastle(reason) of a newer PyTorch: a stand-in "name@" must decorate without skipping
    (tmp_path / "torchalloc_stand_in.py").write_text("")
    path = tmp_path / "test_decorated.py"
    path.write_text("import unittest\nfrom torchalloc_stand_in import skip_elsewhere\n"
                    "class TestCuda(unittest.TestCase):\n"
                    "    @skip_elsewhere('not here')\n"
                    "    def test_memory_decorated(self):\n"
                    "        self.assertEqual(2, 2)\n")
    stubs = ["torchalloc_stand_in:skip_elsewhere@"]
    e = env(tmp_path, 60)
    assert runner.list_tests(str(path), stubs, e, 60) == ["TestCuda.test_memory_decorated"]
    assert runner.run_one("native", str(path), "TestCuda.test_memory_decorated", stubs, e, 60)["outcome"] == "passed"
