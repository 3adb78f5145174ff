"""PyTorch's own allocator tests under PyTorch's allocator and under torchalloc: which outcomes differ.

    python3 bench/pytorch_tests.py PATH/TO/test_cuda.py                  # the allocator tests, both allocators
    python3 bench/pytorch_tests.py PATH/TO/test_cuda.py --list           # only list what would run
    python3 bench/pytorch_tests.py PATH/TO/test_cuda.py -k 'mempool|fraction' --jobs 8 --gpus 0,1 --json out.json
    python3 bench/pytorch_tests.py PATH/TO/test_cuda.py PATH/TO/test_cuda_multigpu.py --gpus 0,1 --jobs 12

PATH is a test file of a PyTorch checkout (test/test_cuda.py of the release of the installed torch, or the
nearest), given by the user: it is PyTorch's code and is never copied into this repository. Its tests are
listed by importing it in a child process (unittest's loader, after PyTorch's own parametrization), then
those whose class is one of PyTorch's allocator test classes and whose name matches --select (memory,
alloc, cache, snapshot, OOM, fraction, record_stream, MemPool, expandable, stats, graph by default) run one
per process, with a timeout, once under PyTorch's allocator and once after torchalloc.install() (the bridge
route, the default configuration): a crash (a signal), a hang (the timeout; the child prints every thread's
stack first) and a failure are outcomes like a pass or a skip. The table lists every test whose outcome
differs, then the counts; --json writes every outcome with its first lines of output.

Several files run in one pool of --jobs, each with its own defaults (FILES): test_cuda_multigpu.py runs every
test of its two classes (TestCudaMultiGPU, TestCudaComm), and each of them is given two GPUs of --gpus
(CUDA_VISIBLE_DEVICES "0,1"; with four, "0,1" and "2,3" in turn), as its tests need; a file of another
name gets test_cuda.py's. --classes, -k and --gpus-per-test override them for every file.

A test file newer than the installed torch may import names that torch does not have yet: --stub
"module:attribute" (repeatable) puts a stand-in there before the file is imported (a function that raises
unittest.SkipTest, so a test that really uses it is skipped, not failed), "module:attribute=VALUE" a
constant (a Python literal), "module:attribute@" a decorator factory that leaves the test as it is (for a
skip-if of another CI system). The defaults cover what the copy of the file run here needs on torch 2.11. PyTorch's test utilities import expecttest: put its wheel's folder on
PYTHONPATH where it is not installed. Needs torch with CUDA and a GPU (each test runs on the GPUs of --gpus,
round robin, or as groups of --gpus-per-test); without them it says so and exits 2.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))  # run from a checkout without installing

from torchalloc import _gpu_child as child  # noqa: E402
CLASSES = ("TestCuda", "TestCudaMallocAsync", "TestMemPool", "TestBlockStateAbsorption")
SELECT = r"memory|alloc|cache|snapshot|oom|fraction|record_stream|mempool|mem_pool|expandable|stats|graph"
ALLOCATORS = ("native", "torchalloc")


class FileDefaults(NamedTuple):
    """What runs of a test file by default: its classes, the names selected, the GPUs each test is given."""

    classes: tuple[str, ...]
    select: str
    gpus_per_test: int


# By file name; any other file is treated as test_cuda.py. test_cuda_multigpu.py's tests are all about
# several GPUs and the allocator under them (peer copies, streams and events across devices, comm's scatter
# and gather): every one runs, and its two-GPU tests skip themselves on one GPU, so each gets two.
FILES = {
    "test_cuda.py": FileDefaults(CLASSES, SELECT, 1),
    "test_cuda_multigpu.py": FileDefaults(("TestCudaMultiGPU", "TestCudaComm"), r".", 2),
}


def defaults_for(path: str) -> FileDefaults:
    return FILES.get(os.path.basename(path), FILES["test_cuda.py"])


def gpu_groups(gpus: list[str] | None, per_test: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each slot tests take in turn: --gpus cut into groups of `per_test`
    (a remainder too small for a test is left out); [None] (inherited) without --gpus."""
    if gpus is None:
        return [None]
    if per_test < 1 or per_test > len(gpus):
        raise ValueError(f"a test given {per_test} GPUs needs that many in --gpus ({','.join(gpus)})")
    return [",".join(gpus[i:i + per_test]) for i in range(0, len(gpus) - per_test + 1, per_test)]
TAG = "PYTORCH_TESTS_RESULT "

# What the child runs before the test file is imported: the allocator, stand-ins, then one test by unittest.
CHILD = r"""
import faulthandler, importlib, json, os, sys, types, unittest
faulthandler.dump_traceback_later(float(os.environ["PT_TIMEOUT"]) - 5, exit=True)
allocator, path, test_id, stubs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if allocator == "torchalloc":
    import torchalloc
    torchalloc.install()
def stand_in(name):
    def missing(*args, **kwargs):
        raise unittest.SkipTest(f"{name} is not in this torch (a stand-in of bench/pytorch_tests.py)")
    return missing
import ast
for spec in stubs:
    module_name, _, rest = spec.partition(":")
    attr, _, value = rest.partition("=")
    decorator = attr.endswith("@")
    attr = attr.rstrip("@")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        setattr(module, attr, (lambda *a, **k: (lambda test: test)) if decorator else
                ast.literal_eval(value) if value else stand_in(spec))
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
module = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
if test_id == "--list":
    names = []
    def walk(suite):
        for item in suite:
            if isinstance(item, unittest.TestSuite):
                walk(item)
            else:
                names.append(item.id().split(".", 1)[1])
    walk(unittest.defaultTestLoader.loadTestsFromModule(module))
    print("PYTORCH_TESTS_RESULT " + json.dumps(names), flush=True)
    sys.exit(0)
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(
    unittest.defaultTestLoader.loadTestsFromName(test_id, module))
outcome = ("failed" if result.failures else "error" if result.errors else
           "skipped" if result.skipped else "passed" if result.testsRun else "not run")
detail = (result.failures or result.errors or result.skipped or [(None, "")])[0][1]
print("PYTORCH_TESTS_RESULT " + json.dumps({"outcome": outcome, "detail": detail[-1500:]}), flush=True)
"""  # then a normal exit: a process that hangs or crashes at exit is an outcome too

# Newer than torch 2.11: whether PyTorch's allocator backend is cudaMallocAsync, which it is not in these runs;
# skipIfSandcastle(reason), which skips a test on Meta's internal CI only, so here leaves it as it is.
DEFAULT_STUBS = ["torch.testing._internal.common_utils:TEST_CUDAMALLOCASYNC=False",
                 "torch.testing._internal.common_utils:skipIfSandcastle@"]


def child_env(gpu: str | None, timeout: float, lib: str | None) -> dict[str, str]:
    env = dict(os.environ, PT_TIMEOUT=str(timeout),
               PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCHALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if lib:
        env["TORCHALLOC_LIB"] = lib
    return env


def run_one(allocator: str, path: str, test_id: str, stubs: list[str], env: dict[str, str],
            timeout: float) -> dict[str, Any]:
    """One test in a fresh interpreter: its outcome and the end of what it printed."""
    cmd = [sys.executable, "-c", CHILD, allocator, path, test_id, json.dumps(stubs)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    seconds = round(time.perf_counter() - t0, 1)
    lines = [line for line in out.splitlines() if line.startswith(TAG)]
    ended = proc.returncode == 0
    if lines:
        result = {**json.loads(lines[-1][len(TAG):]), "seconds": seconds}
        if not ended:  # the test ran to its end, then the process did not exit cleanly
            how = "hung at exit" if "Timeout (" in out or proc.returncode == -signal.SIGKILL else (
                f"crashed at exit ({signal.Signals(-proc.returncode).name})" if proc.returncode < 0
                else f"exited {proc.returncode}")
            result.update(outcome=f"{result['outcome']}, then {how}", detail=out[-1500:])
        return result
    if "Timeout (" in out or proc.returncode == -signal.SIGKILL:
        return {"outcome": "timed out", "detail": out[-1500:], "seconds": seconds}
    if proc.returncode < 0:
        return {"outcome": f"crashed ({signal.Signals(-proc.returncode).name})", "detail": out[-1500:],
                "seconds": seconds}
    return {"outcome": f"exited {proc.returncode}", "detail": out[-1500:], "seconds": seconds}


def list_tests(path: str, stubs: list[str], env: dict[str, str], timeout: float) -> list[str]:
    cmd = [sys.executable, "-c", CHILD, "native", path, "--list", json.dumps(stubs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith(TAG)]
    if done.returncode != 0 or not lines:
        sys.exit(f"pytorch_tests: cannot import {path} to list its tests (a newer file may need --stub "
                 f"module:name):\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(lines[-1][len(TAG):])


def selected(names: list[str], select: str, classes: tuple[str, ...]) -> list[str]:
    pattern = re.compile(select, re.I)
    return [n for n in names if n.split(".")[0] in classes and pattern.search(n.split(".", 1)[-1])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", metavar="path",
                    help="PyTorch's test/test_cuda.py, test/test_cuda_multigpu.py (of the installed release, or the "
                    "nearest)")
    ap.add_argument("-k", "--select", default=None, help="regular expression on test names (default: the file's; "
                    f"test_cuda.py: {SELECT})")
    ap.add_argument("--classes", default=None, help="test classes (default: the file's; test_cuda.py: "
                    f"{','.join(CLASSES)})")
    ap.add_argument("--gpus-per-test", type=int, default=None, help="GPUs of --gpus each test is given (default: "
                    "the file's: 2 for test_cuda_multigpu.py, else 1)")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS), help="default: %(default)s")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per test and allocator (default: 60)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each test under each allocator (default: 1); "
                    "with more, an outcome seen in some runs only is listed with its count")
    ap.add_argument("--jobs", type=int, default=4, help="tests at a time, over all files (default: 4)")
    ap.add_argument("--gpus", default=None, help="CUDA_VISIBLE_DEVICES for the tests, round robin: 0,1,2 (default: "
                    "as inherited)")
    ap.add_argument("--stub", action="append", default=[],
                    help="module:name (a function that skips), module:name=VALUE (a constant) or module:name@ (a "
                    "decorator factory that changes nothing) to stand in for (repeatable)")
    ap.add_argument("--lib", default=os.environ.get("TORCHALLOC_LIB"), help="libtorchalloc.so (default: "
                    "$TORCHALLOC_LIB, else the package's own)")
    ap.add_argument("--list", action="store_true", help="list the selected tests and stop")
    ap.add_argument("--json", type=Path, help="write every outcome here")
    args = ap.parse_args()
    for path in args.paths:
        if not Path(path).is_file():
            sys.exit(f"pytorch_tests: {path}: no such file")
    if args.repeat < 1:
        sys.exit("pytorch_tests: --repeat takes a positive number of runs")
    gpus = args.gpus.split(",") if args.gpus else None
    try:  # before anything runs: a file whose tests need more GPUs than --gpus has is refused at once
        slots = {path: gpu_groups(gpus, args.gpus_per_test or defaults_for(path).gpus_per_test)
                 for path in args.paths}
    except ValueError as e:
        sys.exit(f"pytorch_tests: {e}")
    why = child.skip_reason()
    if why:
        print(f"pytorch_tests: {why}: NOTHING RAN")
        return 2
    import torch
    stubs = DEFAULT_STUBS + args.stub
    allocators = [a for a in args.allocators.split(",") if a]
    if any(a not in ALLOCATORS for a in allocators):
        sys.exit(f"pytorch_tests: --allocators takes {', '.join(ALLOCATORS)}")
    chosen: dict[str, list[str]] = {}
    for path in args.paths:
        file = defaults_for(path)
        classes = tuple(args.classes.split(",")) if args.classes else file.classes
        chosen[path] = selected(list_tests(path, stubs, child_env(slots[path][0], 300, args.lib), 300),
                                args.select or file.select, classes)
        where = " or ".join(f"CUDA_VISIBLE_DEVICES={g}" for g in slots[path] if g) or "the inherited GPUs"
        print(f"{len(chosen[path])} tests selected from {path} (torch {torch.__version__}), each on {where}",
              flush=True)
    if args.list:
        for path in args.paths:
            print("\n".join(chosen[path]))
        return 0
    results = run_all(args.paths, chosen, allocators, slots, stubs, args, torch.__version__)
    for path in args.paths:
        print_outcomes(path, chosen[path], allocators, results[path])
    return 0


def run_all(paths: list[str], chosen: dict[str, list[str]], allocators: list[str],
            slots: dict[str, list[str | None]], stubs: list[str], args: argparse.Namespace,
            torch_version: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Every (file, test, allocator, run) in one pool of --jobs; each file's tests take its GPU slots in turn.
    A test's runs under one allocator are folded into one outcome (fold_runs)."""
    jobs = [(path, name, a, slots[path][k % len(slots[path])])
            for path in paths
            for k, (name, a) in enumerate((n, a) for n in chosen[path] for a in allocators for _ in range(args.repeat))]
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        path: {name: {} for name in chosen[path]} for path in paths}
    results: dict[str, dict[str, dict[str, Any]]] = {path: {name: {} for name in chosen[path]} for path in paths}
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_one, a, path, name, stubs, child_env(gpu, args.timeout, args.lib),
                               args.timeout): (path, name, a)
                   for path, name, a, gpu in jobs}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            path, name, a = futures[future]
            runs[path][name].setdefault(a, []).append(future.result())
            results[path][name][a] = fold_runs(runs[path][name][a])
            print(f"\r{done}/{len(jobs)} runs ({time.perf_counter() - t0:.0f} s)", end="", file=sys.stderr,
                  flush=True)
            if args.json:  # kept current: a run stopped from outside leaves what finished
                write_json(args.json, torch_version, results, complete=done == len(jobs))
    print(file=sys.stderr)
    return results


def fold_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One test's runs under one allocator as one result: the outcome when every run had it, else each
    outcome with its count, most frequent first ("passed 38, passed, then hung at exit 2"); the detail is
    that of the first run whose outcome is the rarest (the one worth reading)."""
    if len(runs) == 1:
        return runs[0]
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    order = sorted(counts, key=lambda o: (-counts[o], o))
    rarest = order[-1]
    outcome = order[0] + f" x{len(runs)}" if len(order) == 1 else ", ".join(f"{o} {counts[o]}" for o in order)
    first_rare = next(r for r in runs if r["outcome"] == rarest)
    return {"outcome": outcome, "detail": first_rare["detail"], "seconds": max(r["seconds"] for r in runs),
            "runs": [r["outcome"] for r in runs]}


def print_outcomes(path: str, names: list[str], allocators: list[str], results: dict[str, dict[str, Any]]) -> None:
    """The tests of `path` whose outcome differs between the allocators, then each allocator's counts."""
    differ = [n for n in names if len({results[n][a]["outcome"] for a in allocators}) > 1]
    width = max([len(n) for n in differ] + [4])
    print(f"\n{path}: {len(differ)} tests whose outcome differs:")
    print(f"{'test':<{width}}  " + "  ".join(f"{a:<16}" for a in allocators))
    for n in differ:
        print(f"{n:<{width}}  " + "  ".join(f"{results[n][a]['outcome']:<16}" for a in allocators))
    for a in allocators:
        counts: dict[str, int] = {}
        for n in names:
            counts[results[n][a]["outcome"]] = counts.get(results[n][a]["outcome"], 0) + 1
        print(f"{a}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def write_json(path: Path, torch_version: str, results: dict[str, dict[str, dict[str, Any]]],
               complete: bool) -> None:
    """Every outcome so far, by test file (a test whose runs are not all done has fewer allocators), written
    whole then renamed."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"torch": torch_version, "complete": complete, "files": results}, indent=1))
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main())
