"""`torchalloc compare`: the env-driven hook and the tabulation, without a GPU.

The scripts here do not use torch: they check what the hook does to the
process (environment, arguments, chaining, exit paths). A run with torch on
a GPU is in test_compare_gpu below (skipped without CUDA).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from torchalloc.cli import compare


def run_compare(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = compare.main(list(args))
    return status, out.getvalue(), err.getvalue()


def script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def test_native_run_passes_arguments_and_unhooks_children(tmp_path: Path) -> None:
    report = tmp_path / "seen.json"
    s = script(tmp_path, f"""
        import json, os, subprocess, sys
        child = subprocess.run([sys.executable, "-c",
            "import os, sys; print(int('TORCHALLOC_COMPARE_POLICY' in os.environ))"],
            capture_output=True, text=True).stdout.strip()
        json.dump({{"argv": sys.argv[1:], "env_left": "TORCHALLOC_COMPARE_POLICY" in os.environ,
                   "child_sees_policy": child, "hooked": "sitecustomize" in sys.modules}},
                  open({str(report)!r}, "w"))
    """)
    status, out, err = run_compare("--policies", "native", "--json", "--", sys.executable, str(s), "--lr", "3e-4")
    assert status == 0, err
    doc = json.loads(out)
    r = doc["policies"]["native"]
    assert r["status"] == "ok" and r["returncode"] == 0 and r["oom"] is False
    assert r["peak_allocated"] is None and r["peak_reserved"] is None  # no torch in this script
    assert r["wall_s"] > 0
    seen = json.loads(report.read_text())
    assert seen["argv"] == ["--lr", "3e-4"]
    assert seen["env_left"] is False  # the hook took its variables out of the environment
    assert seen["child_sees_policy"] == "0"  # so a child process is not hooked again
    assert seen["hooked"] is True


def test_install_failure_is_reported_and_the_script_does_not_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    s = script(tmp_path, f"open({str(ran)!r}, 'w').close()\n")
    env_has_torch = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
    if env_has_torch:
        pytest.skip("torch is installed here: install() may succeed")
    status, out, err = run_compare("--policies", "caching", "--json", "--", sys.executable, str(s))
    r = json.loads(out)["policies"]["caching"]
    assert r["status"] == "install failed" and r["returncode"] == 97
    assert "torch" in r["error"]
    assert not ran.exists()
    assert status == 1


def test_an_install_failure_of_the_environment_skips_the_other_policies(tmp_path: Path) -> None:
    """No torch, or no GPU: every torchalloc policy would fail alike, so the first says why and the rest are
    skipped (each printed the same error twice and ran before); native still runs."""
    has_gpu = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                             capture_output=True).returncode == 0
    if has_gpu:
        pytest.skip("a CUDA GPU is visible: install() would succeed")
    s = script(tmp_path, "pass\n")
    status, out, err = run_compare("--policies", "caching,exact,native", "--", sys.executable, str(s))
    assert status == 1
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["caching"], ["exact"],
                                                                                          ["native"])}
    assert "install failed" in rows["caching"] and "skipped" in rows["exact"] and " ok " in rows["native"]
    assert "exact: not run: torchalloc cannot be installed in this environment (caching failed)" in out
    install_error = next(line for line in out.splitlines() if line.startswith("caching: "))
    assert out.count(install_error.split(": ", 2)[-1]) == 1, out  # the reason once, not echoed from stderr
    assert "running exact" not in err


def test_uncaught_oom_is_an_oom(tmp_path: Path) -> None:
    s = script(tmp_path, """
        class OutOfMemoryError(RuntimeError):
            pass
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    """)
    status, out, err = run_compare("--policies", "native", "--json", "--", sys.executable, str(s))
    r = json.loads(out)["policies"]["native"]
    assert r["oom"] is True and r["status"] == "OOM" and r["returncode"] == 1
    assert "out of memory" in r["error"]
    assert status == 0  # an OOM is a result, not a failure of compare


def test_other_failures_are_shown_with_stderr(tmp_path: Path) -> None:
    s = script(tmp_path, "import sys\nprint('boom: bad flag', file=sys.stderr)\nsys.exit(3)\n")
    status, out, err = run_compare("--policies", "native", "--", sys.executable, str(s))
    assert status == 1
    assert "failed (exit 3)" in out and "boom: bad flag" in out


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "theirs_ran"
    (theirs / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    s = script(tmp_path, "pass\n")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(theirs)
    try:
        status, out, err = run_compare("--policies", "native", "--json", "--", sys.executable, str(s))
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    assert status == 0, err
    assert marker.exists()


def test_table_and_errors(tmp_path: Path) -> None:
    s = script(tmp_path, "pass\n")
    status, out, err = run_compare("--policies", "native", "--", sys.executable, str(s))
    assert status == 0
    assert "policy" in out and "native" in out and "wall time" in out
    assert run_compare()[0] == 2
    assert run_compare("--policies", "", "--", "true")[0] == 2
    status, out, err = run_compare("--policies", "native", "--json", "--", str(tmp_path / "no-such-program"))
    assert status == 1 and "cannot run" in json.loads(out)["policies"]["native"]["error"]


def test_timeout(tmp_path: Path) -> None:
    s = script(tmp_path, "import time\ntime.sleep(30)\n")
    status, out, err = run_compare("--policies", "native", "--json", "--timeout", "1", "--", sys.executable, str(s))
    r = json.loads(out)["policies"]["native"]
    assert "timed out" in r["error"] and status == 1


def test_cli_dispatches_compare(tmp_path: Path) -> None:
    from torchalloc.cli import dispatch as cli

    s = script(tmp_path, "pass\n")
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        status = cli.main(["compare", "--policies", "native", "--json", "--", sys.executable, str(s)])
    assert status == 0 and "native" in json.loads(out.getvalue())["policies"]


GPU_SCRIPT = """
import sys, torch
x = [torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
del x[1]
y = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(torch.cuda.max_memory_allocated())
"""


def test_compare_gpu(tmp_path: Path, library_path: Path) -> None:
    probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("needs torch with a CUDA GPU")
    s = script(tmp_path, GPU_SCRIPT)
    status, out, err = run_compare("--json", "--", sys.executable, str(s), "8")
    assert status == 0, out + err
    doc = json.loads(out)["policies"]
    for name in ("native", "caching", "exact", "phase_arena"):
        assert doc[name]["status"] == "ok", (name, doc[name])
        assert doc[name]["peak_allocated"] == 32 << 20, (name, doc[name])  # 4 x 8 MiB, before the del
    assert doc["exact"]["peak_reserved"] == 32 << 20
    # Native: two 20 MiB segments (8 + 8 + 4 left, then 8 + 8 + 4); y takes a 4 MiB tail: no growth. caching
    # runs as install() leaves it (expandable:reclaim): four 8 MiB handles, exactly the tensors; y takes x[1]'s
    # free 8 MiB: no growth either.
    assert doc["native"]["peak_reserved"] == 40 << 20
    assert doc["caching"]["peak_reserved"] == 32 << 20


def test_rounds_interleave_and_a_round_that_writes_nothing_is_not_read_as_the_last(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    s = script(tmp_path, f"""
        import os, sys
        path = {str(counter)!r}
        n = int(open(path).read()) + 1 if os.path.exists(path) else 1
        open(path, "w").write(str(n))
        if n == 2:
            os._exit(3)  # the second round dies before the hook writes its statistics
    """)
    status, out, err = run_compare("--policies", "native", "--rounds", "3", "--json", "--", sys.executable, str(s))
    r = json.loads(out)["policies"]["native"]
    assert [x["status"] for x in r["rounds"]] == ["ok", "failed (exit 3)", "ok"]
    assert r["status"] == "failed (exit 3)" and status == 1
    assert counter.read_text() == "3"
    assert run_compare("--policies", "native", "--rounds", "0", "--", sys.executable, str(s))[0] == 2


def _run(policy: str, wall: float, setup: float | None) -> compare.RunResult:
    return compare.RunResult(policy, 0, wall, 1 << 30, 1 << 30, False, None, setup_s=setup)


def test_the_table_takes_set_up_out_of_the_run_time_and_says_when_a_difference_is_noise() -> None:
    results = [_run("native", 10.0, None), _run("caching", 12.0, 1.5), _run("exact", 13.0, 0.5),
               _run("native", 10.4, None), _run("caching", 11.0, 1.5), _run("exact", 13.2, 0.5)]
    groups = {g.policy: g for g in compare.group_runs(results)}
    assert [round(r.run_s, 3) for r in groups["caching"].runs] == [10.5, 9.5]
    native = groups["native"]
    assert compare.versus_native(groups["caching"], native) == f"{10.0 / 10.2:.3f} (noise)"  # 9.5-10.5 meets 10-10.4
    assert compare.versus_native(groups["exact"], native) == f"{12.6 / 10.2:.3f}"  # 12.5-12.7: no overlap
    table = compare.format_table(["python3", "train.py"], results)
    assert "10.0 s (9.5-10.5)" in table and "1.5 s" in table and "(noise)" in table
    assert "over 2 interleaved rounds" in table
    doc = compare.results_json(["python3", "train.py"], results)["policies"]
    assert doc["caching"]["run_s"] == 10.0 and doc["caching"]["setup_s"] == 1.5 and doc["native"]["setup_s"] is None
    assert len(doc["exact"]["rounds"]) == 2
