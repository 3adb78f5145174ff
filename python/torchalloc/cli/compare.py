"""`torchalloc compare`: run a training script once per policy on the GPU and tabulate.

    torchalloc compare [--policies native,caching,exact,phase_arena] [--rounds N] [--json] [--timeout S]
                       -- python train.py ARGS

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
peak allocated, peak reserved, run time and whether it ran out of memory.
So that the run times differ only by the allocator:

- the time inside torchalloc.install() (loading the C++ bridge, starting
  the library), which native's run does not pay, is taken out of the run
  time and shown in a column of its own (torch is imported before it, so
  its import counts for every policy alike);
- the C++ bridge is built, if it must be, before the first run, by the
  parent, not by whichever run comes first;
- the policies run in interleaved rounds (native, caching, ..., native,
  caching, ...; --rounds, 2 by default), each row gives the median and the
  range over its rounds, and a ratio to native whose ranges overlap is
  marked as within the spread of a rerun.

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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from .. import text_fit
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
             "peak_reserved": None, "num_ooms": None, "seconds": None, "setup_seconds": None}
    started = _time.perf_counter()

    def write():
        state["seconds"] = _time.perf_counter() - started
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            _json.dump(state, f)
        _os.replace(tmp, out)

    if policy != "native":
        try:  # the script imports torch anyway: its import is not torchalloc's set-up
            import torch as _torch  # noqa: F401
        except BaseException:
            pass  # install() says what is missing
        try:
            set_up = _time.perf_counter()
            import torchalloc
            torchalloc.install(policy=policy, patch_torch=True)
            state["setup_seconds"] = _time.perf_counter() - set_up
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
    setup_s: float | None = None  # inside torchalloc.install(); None for native (or when it failed)

    @property
    def run_s(self) -> float:
        """The wall time less torchalloc's set-up: what the allocator's work cost."""
        return self.wall_s - (self.setup_s or 0.0)

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
    out.unlink(missing_ok=True)  # an earlier round's: a run that writes none must not read it as its own
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
        setup_s=state.get("setup_seconds"),
    )


def _fmt_peak(n: int | None) -> str:
    """A peak in GiB (two decimals) or, below 1 GiB, in MiB (one): a script's peaks come in those two sizes."""
    if n is None or n < GiB:
        return fmt_bytes(n, 1, unit="MiB")
    return fmt_bytes(n, 2)


@dataclasses.dataclass
class PolicyRuns:
    """One policy's runs, one a round, in round order."""

    policy: str
    runs: list[RunResult]

    @property
    def worst(self) -> RunResult:
        """The first run that did not end well, else the last: the row's status and errors."""
        return next((r for r in self.runs if r.status != "ok"), self.runs[-1])

    def _peak(self, field: str) -> int | None:
        values = [getattr(r, field) for r in self.runs if getattr(r, field) is not None]
        return max(values) if values else None

    @property
    def peak_allocated(self) -> int | None:
        return self._peak("peak_allocated")

    @property
    def peak_reserved(self) -> int | None:
        return self._peak("peak_reserved")

    def timed(self) -> list[RunResult]:
        return [r for r in self.runs if r.returncode == 0 or r.oom]

    def run_range(self) -> tuple[float, float, float] | None:
        """Median, least and most run time over the runs that ran to the end; None when none did."""
        times = [r.run_s for r in self.timed()]
        return (statistics.median(times), min(times), max(times)) if times else None

    def setup(self) -> float | None:
        values = [r.setup_s for r in self.timed() if r.setup_s is not None]
        return statistics.median(values) if values else None


def group_runs(results: list[RunResult]) -> list[PolicyRuns]:
    """Runs of every round, by policy, in the order the policies first ran."""
    groups: dict[str, PolicyRuns] = {}
    for r in results:
        groups.setdefault(r.policy, PolicyRuns(r.policy, [])).runs.append(r)
    return list(groups.values())


def versus_native(row: PolicyRuns, native: PolicyRuns | None) -> str:
    """The ratio of the medians to native's, marked when the two ranges overlap (a rerun may order them either way)."""
    mine, theirs = row.run_range(), native.run_range() if native is not None else None
    if row is native or mine is None or theirs is None or theirs[0] <= 0:
        return "-"
    overlap = mine[1] <= theirs[2] and theirs[1] <= mine[2]
    return f"{mine[0] / theirs[0]:.3f}" + (" (noise)" if overlap and len(row.timed()) > 1 else "")


def format_table(command: Sequence[str], results: list[RunResult], width: int | None = None) -> str:
    """The runs' table and what its columns mean; within `width` when given (text_fit)."""
    groups = group_runs(results)
    native = next((g for g in groups if g.policy == NATIVE), None)
    rounds = max((len(g.runs) for g in groups), default=0)
    header = ["policy", "status", "peak allocated", "peak reserved", "reserved/alloc", "run time", "x native",
              "set-up"]
    rows = []
    for g in groups:
        allocated, reserved = g.peak_allocated, g.peak_reserved
        ratio = f"{reserved / allocated:.3f}" if allocated and reserved else "-"
        span = g.run_range()
        if span is None:
            run = "-"
        elif len(g.timed()) > 1:
            run = f"{span[0]:.1f} s ({span[1]:.1f}-{span[2]:.1f})"
        else:
            run = f"{span[0]:.1f} s"
        setup = g.setup()
        rows.append([g.policy, g.worst.status, _fmt_peak(allocated), _fmt_peak(reserved), ratio, run,
                     versus_native(g, native), "-" if setup is None else f"{setup:.1f} s"])
    room = sys.maxsize if width is None else width
    lines = [*text_fit.paragraph(f"command: {shlex.join(command)}", room), ""]
    lines += text_fit.table(header, rows, room, left=2)
    lines.append("")
    for legend in (f"run time: the command's wall time less torchalloc's set-up, median (least-most) over {rounds} "
                   f"interleaved round{'s' if rounds != 1 else ''}",
                   "x native: ratio of median run times; (noise): the ranges overlap, a rerun may order them "
                   "either way",
                   "set-up: seconds inside torchalloc.install() (C++ bridge loaded, library started), not in the "
                   "run time"):
        lines += text_fit.paragraph(legend, room)
    for g in groups:
        r = g.worst
        if r.error or r.status != "ok":
            lines.append("")
            lines += text_fit.paragraph(f"{r.policy}: {r.error or r.status}", room)
            if r.stderr_tail and r.status not in ("ok", "install failed", "skipped"):  # those say why in one line
                lines.extend("  | " + line for line in r.stderr_tail.splitlines()[-10:])
    return "\n".join(lines)


def results_json(command: Sequence[str], results: list[RunResult]) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    groups = group_runs(results)
    native = next((g for g in groups if g.policy == NATIVE), None)
    for g in groups:
        r, span, setup = g.worst, g.run_range(), g.setup()
        policies[g.policy] = {
            "peak_allocated": g.peak_allocated,
            "peak_reserved": g.peak_reserved,
            "wall_s": round(statistics.median(x.wall_s for x in g.runs), 3),
            "run_s": None if span is None else round(span[0], 3),
            "run_s_least": None if span is None else round(span[1], 3),
            "run_s_most": None if span is None else round(span[2], 3),
            "setup_s": None if setup is None else round(setup, 3),
            "versus_native": versus_native(g, native),
            "oom": any(x.oom for x in g.runs),
            "returncode": r.returncode,
            "status": r.status,
            "error": r.error,
            "rounds": [{"wall_s": round(x.wall_s, 3), "setup_s": x.setup_s, "status": x.status} for x in g.runs],
        }
    return {"command": list(command), "policies": policies}


def prepare_bridge(policies: Sequence[str], quiet: bool) -> None:
    """Build the C++ bridge now if a torchalloc run would build it, so that no run's time includes a compile."""
    if all(p == NATIVE for p in policies):
        return
    try:
        from .. import bridge

        found = bridge.find_or_build()
    except Exception as e:  # the runs take the plain route and say why; nothing to do here
        if not quiet:
            print(f"C++ bridge not prepared ({type(e).__name__}: {str(e)[:200]}); the runs say which route they took",
                  file=sys.stderr, flush=True)
        return
    if found.built_now and not quiet:
        print(f"built the C++ bridge in {found.build_seconds:.1f} s (before the runs)", file=sys.stderr, flush=True)


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
    ap.add_argument("--rounds", type=int, default=2,
                    help="interleaved rounds of every policy, for the spread of the run times (default: %(default)s)")
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
    if not 1 <= args.rounds <= 100:
        print(f"torchalloc compare: error: --rounds {args.rounds} is outside 1-100", file=sys.stderr)
        return 2
    results: list[RunResult] = []
    environment_error: str | None = None  # an install failure every torchalloc policy would repeat
    prepare_bridge(policies, args.json)
    with tempfile.TemporaryDirectory(prefix="torchalloc-compare-") as tmp:
        for round_number in range(1, args.rounds + 1):
            for policy in policies:
                if environment_error and policy != NATIVE:
                    results.append(RunResult(policy, _SKIPPED, 0.0, None, None, False,
                                             f"not run: {environment_error}"))
                    continue
                if not args.json:
                    print(f"round {round_number}/{args.rounds}: running {policy} ...", file=sys.stderr, flush=True)
                result = run_one(policy, command, Path(tmp), args.timeout, args.show_output)
                results.append(result)
                if result.status == "install failed" and (result.error or "").startswith(_ENVIRONMENT_ERRORS):
                    environment_error = f"torchalloc cannot be installed in this environment ({result.policy} failed)"
    if args.json:
        print(json.dumps(results_json(command, results), indent=2))
    else:
        print(format_table(command, results, text_fit.terminal_width()))
    return 0 if all(r.returncode == 0 or r.oom for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
