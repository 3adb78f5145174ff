"""The `torchalloc` command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchalloc import cli

PYTHON_DIR = Path(__file__).resolve().parents[1]


def run_cli(*args: str, conf: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("TORCHALLOC_CONF", None)
    if conf is not None:
        env["TORCHALLOC_CONF"] = conf
    env["PYTHONPATH"] = str(PYTHON_DIR)
    return subprocess.run(
        [sys.executable, "-m", "torchalloc.cli", *args], capture_output=True, text=True, env=env, check=False
    )


def test_info_on_the_sim_backend(library_path: Path) -> None:
    done = run_cli("info", "--json", conf="backend:sim,sim_devices:3")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["library"] == str(library_path.resolve())
    assert info["devices"] == 3 and info["policy"] == "caching"
    assert "sim_capacity" in info["config_keys"]


def test_info_explains_a_bad_configuration(library_path: Path) -> None:
    done = run_cli("info", conf="policy:nope")
    assert done.returncode == 0
    assert "devices:     unavailable:" in done.stdout and "'policy'" in done.stdout
    assert "library:" in done.stdout and "config keys:" in done.stdout


def test_help_lists_every_command() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    for name in cli.COMMANDS:
        assert name in done.stdout


def test_unknown_command() -> None:
    done = run_cli("frobnicate")
    assert done.returncode == 2 and "unknown command 'frobnicate'" in done.stderr


def test_dispatch_is_lazy_and_extensible(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setitem(cli.COMMANDS, "echo", cli.Command("cli", "_test_echo", "test"))
    monkeypatch.setattr(cli, "_test_echo", lambda argv: calls.append(argv) or 3, raising=False)
    assert cli.main(["echo", "a", "--b"]) == 3
    assert calls == [["a", "--b"]]


def test_missing_subcommand_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.COMMANDS, "later", cli.Command("not_written_yet", "main", "test"))
    with pytest.raises(SystemExit, match="not available in this installation"):
        cli.main(["later"])
