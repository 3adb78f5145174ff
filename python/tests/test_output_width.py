"""Every command's output fits $COLUMNS on the bundled data (issue 50): replay, compare, info, top, the report of
one log and of a job. `export` writes data (CSV, JSON lines), not lines for a terminal, and is left out. A word
longer than the terminal (a path) stands on a line of its own.

Each command runs in this process (cli_in_process) with COLUMNS set; a line is measured in characters (the
report's sparklines are one column each).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cli_in_process import cli

DATA = Path(__file__).resolve().parents[2] / "python" / "torchalloc" / "data"
DEMO, PHASES = str(DATA / "demo_trace.talog.xz"), str(DATA / "phases_trace.talog.xz")
COMMANDS = {
    "replay": ("replay",),
    "report": ("report", DEMO),
    "report of a job": ("report", DEMO, PHASES),
    "info": ("info",),
    "info --keys": ("info", "--keys"),
    "top --once": ("top", "--once", DEMO),
    "compare": ("compare", "--rounds", "1", "--policies", "native,caching", "--", sys.executable, "-c", "pass"),
}
# The cheap commands are checked narrower too; replay and the reports take seconds each.
NARROW = ("info", "info --keys", "top --once", "compare")


def too_wide(lines: str, width: int) -> list[str]:
    """Lines past `width`, but for a line that is one word alone (a path longer than the terminal, such as the
    C++ bridge's in the per-user cache): it cannot be broken without breaking a copy of it, so it is given a line
    of its own instead."""
    return [f"{len(line)}: {line}" for line in lines.splitlines() if len(line) > width and len(line.split()) != 1]


@pytest.mark.parametrize("name,width", [(name, 100) for name in COMMANDS] + [(name, 72) for name in NARROW])
def test_every_line_fits_the_terminal(name: str, width: int, monkeypatch: pytest.MonkeyPatch,
                                      library_path: Path) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.delenv("TORCHALLOC_CONF", raising=False)
    status, out, err = cli(*COMMANDS[name])
    assert out.strip(), f"{name} printed nothing (exit {status}): {err}"
    assert not too_wide(out, width), f"{name} at {width} columns:\n" + "\n".join(too_wide(out, width))


def test_without_columns_the_width_is_100(monkeypatch: pytest.MonkeyPatch, library_path: Path) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(os, "get_terminal_size", lambda *a: (_ for _ in ()).throw(OSError("not a terminal")))
    status, out, _ = cli("info", "--keys")
    assert status == 0 and max(len(line) for line in out.splitlines()) <= 100


def test_a_figure_and_its_unit_stay_on_one_line() -> None:
    from torchalloc.text_fit import paragraph

    lines = paragraph("trace: x (pytorch-snapshot: 220,128 events replayed; peak requested 5.62 GiB)", 74)
    assert lines[-1].endswith("5.62 GiB)") and not any(line.endswith("5.62") for line in lines)
