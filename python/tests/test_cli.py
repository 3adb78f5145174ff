"""The `torchalloc` command line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchalloc.cli import dispatch as cli

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
    assert done.returncode == 1  # a mistake to fix, unlike a machine without a GPU
    assert "config:      invalid" in done.stdout
    assert "torchalloc info: error: TORCHALLOC_CONF: bad value 'nope' for key 'policy'" in done.stderr
    assert "caching, exact or phase_arena" in done.stderr  # the valid names
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
    monkeypatch.setitem(cli.COMMANDS, "echo", cli.Command("cli.dispatch", "_test_echo", "test"))
    monkeypatch.setattr(cli, "_test_echo", lambda argv: calls.append(argv) or 3, raising=False)
    assert cli.main(["echo", "a", "--b"]) == 3
    assert calls == [["a", "--b"]]


def test_missing_subcommand_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.COMMANDS, "later", cli.Command("not_written_yet", "main", "test"))
    with pytest.raises(SystemExit, match="not available in this installation"):
        cli.main(["later"])


def test_every_command_resolves() -> None:
    """Each COMMANDS entry names a module and function that exist (a moved module would break one)."""
    for name in cli.COMMANDS:
        assert callable(cli._resolve(name)), name


def test_version_is_written_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """setup.py takes the version from torchalloc/__init__.py instead of writing it again."""
    import runpy

    import setuptools

    import torchalloc

    setup_py = PYTHON_DIR.parent / "setup.py"
    assert not re.search(r"version\s*=\s*['\"]\d", setup_py.read_text()), "setup.py writes a version literal"
    captured: dict[str, object] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    runpy.run_path(str(setup_py), run_name="setup_under_test")
    assert captured["version"] == torchalloc.__version__
    done = run_cli("--version")
    assert done.stdout.strip() == f"torchalloc {torchalloc.__version__}"


def test_report_without_a_log_reports_the_bundled_demo_or_says_it_is_missing(monkeypatch, tmp_path, capsys) -> None:
    """Issue 25: `torchalloc report` with no argument reports the bundled demo trace, as replay replays its own."""
    import pytest as _pytest

    from torchalloc.cli import report as report_cli

    monkeypatch.setattr(report_cli, "DEMO_TRACE", tmp_path / "demo_trace.talog.xz")
    with _pytest.raises(SystemExit) as e:
        report_cli.main([])
    assert e.value.code != 0
    assert "no bundled demo trace" in capsys.readouterr().err
    phases = report_cli.Path(report_cli.__file__).resolve().parents[1] / "data" / "phases_trace.talog.xz"
    monkeypatch.setattr(report_cli, "DEMO_TRACE", phases)  # stands in for the demo until it is recorded
    assert report_cli.main(["--top", "2"]) in (0, None)
    assert "phases_trace.talog.xz" in capsys.readouterr().out
