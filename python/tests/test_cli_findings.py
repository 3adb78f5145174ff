"""Issue 35, item 6: the smaller findings about the command lines.

An empty file got two messages ("not a torchalloc log (it starts with
b'')" from report, "empty file" from replay); `export -o /proc/x.pickle`
exited 1 with the OS's message where every other bad output names its flag
and exits 2; `--capacity 40GB` was read as decimal without a word;
`bench_pairs --help` ran the benchmark with 0 pairs and printed "inf ns";
two moments one event apart read the same time with different figures; the
policy table's last column had no header.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_logs as H  # noqa: E402
from cli_in_process import cli  # noqa: E402

from torchalloc.units import fmt_times  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    b = H.LogBuilder()
    b.segment(0x1000, 20 << 20)
    b.alloc(0x1000, 1 << 20)
    path = tmp_path / "run.talog"
    path.write_bytes(b.to_bytes())
    return path


def test_an_empty_file_gets_one_message_from_every_verb(tmp_path: Path) -> None:
    empty = tmp_path / "empty.talog"
    empty.write_bytes(b"")
    said = set()
    for args in (["report"], ["report", "--json"], ["replay"], ["export", "-o", str(tmp_path / "s.pickle")]):
        status, out, err = cli(*args, str(empty))
        assert status == 2 and out == "", (args, err)
        said.add(err.split("error: ", 1)[1])
    assert said == {f"{empty}: empty file (0 bytes): neither a torchalloc log nor a PyTorch snapshot\n"}


@pytest.mark.skipif(not os.path.isdir("/proc") or os.getuid() != 0 and not os.access("/proc", os.W_OK),
                    reason="needs /proc, where access() says writable to root but nothing can be created")
@pytest.mark.parametrize("args", [["export", "-o", "/proc/x.pickle"], ["report", "--html", "/proc/x.html"]])
def test_an_output_that_cannot_be_created_names_its_flag(log: Path, args: list[str]) -> None:
    status, out, err = cli(*args[:1], str(log), *args[1:])
    assert status == 2, err
    assert f"error: {args[1]} {args[2]}: cannot create a file in /proc" in err and "Traceback" not in err


def test_a_decimal_capacity_is_said(log: Path, library_path: Path) -> None:
    status, out, err = cli("replay", str(log), "--capacity", "40GB", "--no-search")
    assert status == 0, err
    assert "--capacity 40GB is decimal: 40,000,000,000 bytes (37.25 GiB); write 40GiB for 42,949,672,960" in err
    status, out, err = cli("replay", str(log), "--capacity", "40GiB", "--no-search")
    assert status == 0 and "decimal" not in err, err


def test_moments_that_differ_read_differently() -> None:
    # the phases trace: the peak reserved is the event before the peak allocated, 372 ns earlier
    assert fmt_times([21.815759004, 21.815758632]) == ["t=21.8157590 s", "t=21.8157586 s"]
    assert fmt_times([1.5, 2.5]) == ["t=1.500 s", "t=2.500 s"]  # three decimals when they tell them apart
    assert fmt_times([1.5, 1.5]) == ["t=1.500 s", "t=1.500 s"]  # one moment twice: the same


def test_every_column_of_every_section_has_a_header(library_path: Path) -> None:
    from torchalloc.analysis import analyze
    from torchalloc.analysis.sections import SECTIONS

    a = analyze(REPO / "python" / "torchalloc" / "data" / "demo_trace.talog.xz")
    tables = [v.table for v in (s.view(a, 15) for s in SECTIONS) if v is not None and v.table is not None]
    assert any("TORCHALLOC_CONF" in t.headers for t in tables)  # the policy table is among them
    for t in tables:
        assert all(h.strip() for h in t.headers), t.headers


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_bench_pairs_help_and_a_bad_count(tmp_path: Path, library_path: Path) -> None:
    exe = tmp_path / "bench_pairs"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", f"-I{REPO / 'include'}",
                    str(REPO / "bench" / "bench_pairs.c"), str(library_path), f"-Wl,-rpath,{library_path.parent}",
                    "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True)
    for flag in ("--help", "-h"):
        run = subprocess.run([str(exe), flag], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stdout.startswith("usage: bench_pairs") and "ns per" not in run.stdout
    for args in (["0"], ["-5"], ["many"], ["--one", "caching", "mixed", "1", "1", "0"]):
        run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and run.stdout == "", (args, run.stdout)
        assert "give a positive whole number" in run.stderr
