"""Every command that reads a log has a default (issue 50): with none given, `top --once` and `export` read the
bundled demo trace, as `report` reports it and `replay` replays its own trace."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from cli_in_process import cli
from torchalloc.cli import args as cli_args


def test_top_once_without_a_log_shows_the_bundled_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    status, out, err = cli("top", "--once")
    assert status == 0, err
    assert out.startswith("demo_trace.talog.xz ") and "writer closed" in out.splitlines()[0]
    assert out == cli("top", "--once", str(cli_args.BUNDLED_DEMO))[1]


def test_export_without_a_log_writes_the_bundled_demo_as_a_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "demo.pickle"
    status, _, err = cli("export", "-o", str(out))
    assert status == 0, err
    snapshot = pickle.loads(out.read_bytes())
    assert snapshot["segments"] and sum(len(t) for t in snapshot["device_traces"]) > 0
    assert f"wrote {out}:" in err


@pytest.mark.parametrize("command", [("top", "--once"), ("export", "-o", "never-written.pickle")])
def test_an_installation_without_the_demo_says_so_in_one_line(command: tuple[str, ...], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_args, "BUNDLED_DEMO", tmp_path / "demo_trace.talog.xz")
    monkeypatch.chdir(tmp_path)
    status, out, err = cli(*command)
    assert status == 2 and not out
    assert err.count("\n") == 1 and "no log given, and this installation has no bundled demo trace" in err
    assert not (tmp_path / "never-written.pickle").exists()
