"""`torchalloc compare`: run a training script once per policy on the GPU and tabulate.

    torchalloc compare [--policies native,caching,exact,phase_arena] [--json] [--timeout S] -- python train.py ARGS

Each policy gets its own process (PyTorch can choose its CUDA allocator only
once per process, before CUDA starts). The script needs no change:
torchalloc is installed by an environment-driven hook. The parent puts a
temporary directory holding a `sitecustomize.py` first on PYTHONPATH; Python
imports it at start-up, and it

- reads TORCHALLOC_COMPARE_POLICY and TORCHALLOC_COMPARE_OUT from the
  environment and removes them, so that only the first Python process of
  the command is hooked (not its DataLoader workers or other children);
- for a torchalloc policy, calls torchalloc.install(policy=..., patch_torch=True)
  (so torch.cuda.memory_allocated() and friends keep working in the script);
  for `native`, leaves PyTorch's own allocator in place;
- at exit writes the peaks (torch.cuda.max_memory_allocated()/
  max_memory_reserved(), answered by torchalloc when it is installed), the
  number of OOMs and any uncaught exception to the JSON file named by
  TORCHALLOC_COMPARE_OUT;
- then imports any sitecustomize that was on the path before it.

The parent times each process (wall clock, start-up included) and prints
peak allocated, peak reserved, wall time and whether it ran out of memory.
Python started with -I or -S skips sitecustomize: such commands cannot be
hooked.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from .._records import POLICY_NAMES
from ..units import GiB, fmt_bytes

ENV_POLICY = "TORCHALLOC_COMPARE_POLICY"
ENV_OUT = "TORCHALLOC_COMPARE_OUT"
NATIVE = "native"  # PyTorch's own allocator
DEFAULT_POLICIES = (NATIVE, *POLICY_NAMES.values())
_STDERR_TAIL = 30  # lines of a failed run's stderr to show

# The hook. Plain Python, no imports of torchalloc at module level beyond
# what it needs; everything it does is guarded so that a failure is recorded,
# not swallowed.
SITECUSTOMIZE = r'''
"""torchalloc compare's start-up hook (generated; see torchalloc/cli/compare.py)."""
import atexit as _atexit
import json as _json
import os as _os
import sys as _sys
import time as _time


def _torchalloc_compare_hook():
    policy = _os.environ.pop("TORCHALLOC_COMPARE_POLICY", None)
    out = _os.environ.pop("TORCHALLOC_COMPARE_OUT", None)
    if not policy or not out:
        return
    state = {"policy": policy, "pid": _os.getpid(), "argv": list(_sys.argv), "installed": False,
             "install_error": None, "exception": None, "oom": False, "peak_allocated": None,
             "peak_reserved": None, "num_ooms": None, "seconds": None}
    started = _time.perf_counter()

    def write():
        state["seconds"] = _time.perf_counter() - started
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            _json.dump(state, f)
        _os.replace(tmp, out)

    if policy != "native":
        try:
            import torchalloc
            torchalloc.install(policy=policy, patch_torch=True)
            state["installed"] = True
        except BaseException as e:  # record why, and do not run the script without the allocator asked for
            state["install_error"] = f"{type(e).__name__}: {e}"
            write()
            _sys.stderr.write(f"torchalloc compare: torchalloc.install(policy={policy!r}) failed: "
                              f"{state['install_error']}\n")
            _sys.stderr.flush()
            _os._exit(97)

    previous_hook = _sys.excepthook

    def excepthook(kind, value, tb):
        text = f"{kind.__name__}: {value}"
        state["exception"] = text[:2000]
        if "out of memory" in text.lower() or kind.__name__ == "OutOfMemoryError":
            state["oom"] = True
        previous_hook(kind, value, tb)

    _sys.excepthook = excepthook

    def at_exit():
        torch = _sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                dev = torch.cuda.current_device()
                state["peak_allocated"] = int(torch.cuda.max_memory_allocated(dev))
                state["peak_reserved"] = int(torch.cuda.max_memory_reserved(dev))
                state["num_ooms"] = int(torch.cuda.memory_stats(dev).get("num_ooms", 0))
                if state["num_ooms"]:
                    state["oom"] = True
        except BaseException as e:
            state["stats_error"] = f"{type(e).__name__}: {e}"
        write()

    _atexit.register(at_exit)  # registered first, so it runs after the script's own handlers


_torchalloc_compare_hook()
del _torchalloc_compare_hook


def _chain_previous_sitecustomize():
    """Import the sitecustomize this one shadows, if any."""
    import importlib
    here = _os.path.dirname(_os.path.abspath(__file__))
    ours = _sys.modules.get("sitecustomize")
    saved = list(_sys.path)
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    _sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        _sys.path[:] = saved
        if ours is not None:
            _sys.modules["sitecustomize"] = ours


_chain_previous_sitecustomize()
del _chain_previous_sitecustomize
'''


_SKIPPED = -1000  # RunResult.returncode of a policy not run
# Install failures that do not depend on the policy (no torch, no CUDA, no library): the remaining policies
# are skipped instead of failing the same way.
_ENVIRONMENT_ERRORS = ("ImportError", "ModuleNotFoundError", "LibraryError", "RuntimeError")


@dataclasses.dataclass
class RunResult:
    policy: str
    returncode: int
    wall_s: float
    peak_allocated: int | None
    peak_reserved: int | None
    oom: bool
    error: str | None  # install failure, uncaught exception, or why no stats came back
    stderr_tail: str = ""

    @property
    def status(self) -> str:
        if self.oom:
            return "OOM"
        if self.returncode == 0 and self.error is None:
            return "ok"
        if self.returncode == 97:
            return "install failed"
        if self.returncode == _SKIPPED:
            return "skipped"
        return f"failed (exit {self.returncode})" if self.returncode else "failed"


def _package_root() -> Path:
    """The folder holding the torchalloc package (cli/ is two levels below it)."""
    return Path(__file__).resolve().parents[2]


def child_env(policy: str, out: Path, hook_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one run: the hook first on PYTHONPATH, this torchalloc next, the policy and output path."""
    env = dict(os.environ if base is None else base)
    paths = [str(hook_dir), str(_package_root())]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[ENV_POLICY] = policy
    env[ENV_OUT] = str(out)
    if policy != NATIVE and "TORCHALLOC_LIB" not in env:
        try:  # the child loads the same library this process would
            from .. import _lib

            env["TORCHALLOC_LIB"] = str(_lib.find_library())
        except Exception:
            pass  # the child's install() reports it
    return env


def run_one(policy: str, command: Sequence[str], workdir: Path, timeout: float | None, echo: bool) -> RunResult:
    hook_dir = workdir / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = workdir / f"{policy}.json"
    err_path = workdir / f"{policy}.stderr"
    env = child_env(policy, out, hook_dir)
    t0 = time.perf_counter()
    with open(err_path, "w") as err_file:
        try:
            done = subprocess.run(
                list(command),
                env=env,
                stdout=None if echo else subprocess.DEVNULL,
                stderr=None if echo else err_file,
                timeout=timeout,
                check=False,
            )
            returncode = done.returncode
        except subprocess.TimeoutExpired:
            returncode = -9
        except OSError as e:
            return RunResult(policy, 127, 0.0, None, None, False, f"cannot run {command[0]!r}: {e}")
    wall = time.perf_counter() - t0
    stderr_tail = "" if echo else "\n".join(err_path.read_text(errors="replace").splitlines()[-_STDERR_TAIL:])
    state: dict[str, Any] = {}
    if out.is_file():
        try:
            state = json.loads(out.read_text())
        except ValueError:
            state = {}
    error = state.get("install_error") or state.get("exception")
    if returncode == -9:
        error = f"timed out after {timeout} s"
    elif not state:
        error = error or ("no statistics came back: the command ran no Python process, or one started with -I/-S, "
                          "or it was killed")
    oom = bool(state.get("oom")) or "out of memory" in stderr_tail.lower()
    return RunResult(
        policy=policy,
        returncode=returncode,
        wall_s=wall,
        peak_allocated=state.get("peak_allocated"),
        peak_reserved=state.get("peak_reserved"),
        oom=oom,
        error=error,
        stderr_tail=stderr_tail,
    )


def _fmt_peak(n: int | None) -> str:
    """A peak in GiB (two decimals) or, below 1 GiB, in MiB (one): a script's peaks come in those two sizes."""
    if n is None or n < GiB:
        return fmt_bytes(n, 1, unit="MiB")
    return fmt_bytes(n, 2)


def format_table(command: Sequence[str], results: list[RunResult]) -> str:
    header = ["policy", "status", "peak allocated", "peak reserved", "reserved/alloc", "wall time"]
    rows = []
    for r in results:
        ratio = f"{r.peak_reserved / r.peak_allocated:.3f}" if r.peak_allocated and r.peak_reserved else "-"
        rows.append([r.policy, r.status, _fmt_peak(r.peak_allocated), _fmt_peak(r.peak_reserved), ratio,
                     f"{r.wall_s:.1f} s"])
    widths = [max(len(x[i]) for x in [header] + rows) for i in range(len(header))]
    lines = [f"command: {shlex.join(command)}", ""]
    for i, row in enumerate([header] + rows):
        lines.append("  ".join([row[0].ljust(widths[0]), row[1].ljust(widths[1])]
                               + [c.rjust(w) for c, w in zip(row[2:], widths[2:])]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for r in results:
        if r.error or r.status != "ok":
            lines.append("")
            lines.append(f"{r.policy}: {r.error or r.status}")
            if r.stderr_tail and r.status not in ("ok", "install failed", "skipped"):  # those say why in one line
                lines.extend("  | " + line for line in r.stderr_tail.splitlines()[-10:])
    return "\n".join(lines)


def results_json(command: Sequence[str], results: list[RunResult]) -> dict[str, Any]:
    return {
        "command": list(command),
        "policies": {
            r.policy: {
                "peak_allocated": r.peak_allocated,
                "peak_reserved": r.peak_reserved,
                "wall_s": round(r.wall_s, 3),
                "oom": r.oom,
                "returncode": r.returncode,
                "status": r.status,
                "error": r.error,
            }
            for r in results
        },
    }


def unknown_policies(policies: Sequence[str]) -> str | None:
    """None when every name is one compare can run, else one line naming the bad ones and the valid ones."""
    valid = list(DEFAULT_POLICIES)
    bad = [p for p in policies if p not in valid]
    if not bad:
        return None
    parts = []
    for name in bad:
        close = difflib.get_close_matches(name, valid, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown policy {', '.join(parts)} in --policies; valid: {', '.join(valid)}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="torchalloc compare",
        description="Run a PyTorch script once per allocator policy (separate processes, on the GPU) and compare "
        "peak memory and wall time. The script needs no change.",
        epilog="example: torchalloc compare --policies native,caching,phase_arena -- python train.py --epochs 1",
    )
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                    help="comma-separated; 'native' is PyTorch's own allocator (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--timeout", type=float, help="seconds per run")
    ap.add_argument("--show-output", action="store_true", help="let the runs print to this terminal")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. python train.py ARGS")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("torchalloc compare: error: no command given (torchalloc compare -- python train.py ARGS)",
              file=sys.stderr)
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        print("torchalloc compare: error: --policies is empty", file=sys.stderr)
        return 2
    unknown = unknown_policies(policies)
    if unknown:  # before anything runs: a typo must not cost a run per policy and end in "install failed"
        print(f"torchalloc compare: error: {unknown}", file=sys.stderr)
        return 2
    results: list[RunResult] = []
    environment_error: str | None = None  # an install failure every torchalloc policy would repeat
    with tempfile.TemporaryDirectory(prefix="torchalloc-compare-") as tmp:
        for policy in policies:
            if environment_error and policy != NATIVE:
                results.append(RunResult(policy, _SKIPPED, 0.0, None, None, False,
                                         f"not run: {environment_error}"))
                continue
            if not args.json:
                print(f"running {policy} ...", file=sys.stderr, flush=True)
            result = run_one(policy, command, Path(tmp), args.timeout, args.show_output)
            results.append(result)
            if result.status == "install failed" and (result.error or "").startswith(_ENVIRONMENT_ERRORS):
                environment_error = f"torchalloc cannot be installed in this environment ({result.policy} failed)"
    if args.json:
        print(json.dumps(results_json(command, results), indent=2))
    else:
        print(format_table(command, results))
    return 0 if all(r.returncode == 0 or r.oom for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
