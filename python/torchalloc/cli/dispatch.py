"""The `torchalloc` command: `torchalloc <subcommand> [args]`.

Each subcommand lives in its own module of this package (torchalloc.cli)
and is imported only when it runs, so `torchalloc info` works without
numpy, torch or a GPU. Commands call the engines (log/, analysis/, replay/,
report/); no engine imports a command. To add one, add a module here and a
line to COMMANDS; its function takes the remaining arguments (a list of
str, to parse with its own argparse parser, prog="torchalloc NAME") and
returns an exit status (None means 0).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import sys
import traceback
from typing import Any, Callable, Sequence

from ..printable import printable


@dataclasses.dataclass(frozen=True)
class Command:
    module: str  # relative to the torchalloc package
    function: str
    summary: str


COMMANDS: dict[str, Command] = {
    "info": Command("cli.info", "main", "library path, version, config keys and devices"),
    "replay": Command("cli.replay", "main", "replay a trace (PyTorch snapshot or torchalloc log) through each policy "
                      "on a simulated device"),
    "report": Command("cli.report", "main", "explain a log: timeline, peak anatomy, lifetimes, phases (--json, --html, --png)"),
    "plan": Command("cli.plan", "main", "predict from a logged run what fits at another batch size, per policy"),
    "export": Command("cli.export", "main", "convert a log to a PyTorch memory snapshot pickle (memory_viz)"),
    "top": Command("cli.top", "main", "watch a log being written: allocated, reserved, live sites, growth, OOMs"),
    "compare": Command("cli.compare", "main", "run a script once per policy on the GPU; compare peaks and time"),
}


def _resolve(name: str) -> Callable[[list[str]], Any]:
    command = COMMANDS[name]
    try:
        module = importlib.import_module(f"torchalloc.{command.module}")
    except ModuleNotFoundError as e:
        if e.name != f"torchalloc.{command.module}":
            raise  # the module exists but needs something missing: say what
        raise SystemExit(f"torchalloc {name}: not available in this installation (no torchalloc.{command.module})")
    try:
        function: Callable[[list[str]], Any] = getattr(module, command.function)
    except AttributeError:
        raise SystemExit(f"torchalloc {name}: torchalloc.{command.module} has no {command.function}()") from None
    return function


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: torchalloc <command> [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()]
    lines += ["", "`torchalloc <command> --help` describes one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from .. import __version__

        print(f"torchalloc {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"torchalloc: unknown command {printable(name)!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        status = _resolve(name)(rest)
    except KeyboardInterrupt:
        print(f"torchalloc {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every tool error is one line; the traceback only on request
        if os.environ.get("TORCHALLOC_DEBUG"):
            traceback.print_exc()
        print(printable(f"torchalloc {name}: error: {describe_error(e)}"), file=sys.stderr)
        return 1
    return 0 if status is None else int(status)


# Errors a user's input or machine can cause (by class name, so this module imports none of the tools);
# subclasses count too (UnicodeDecodeError is a ValueError). Anything else is a bug in torchalloc.
_EXPECTED = ("LogFormatError", "TraceError", "ReplayError", "LibraryError", "ValueError", "ImportError")


def describe_error(e: BaseException) -> str:
    """One line for an exception that escaped a subcommand."""
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or e}"
    if isinstance(e, RecursionError):
        return "the input is nested too deeply to read"
    if isinstance(e, MemoryError):
        return "out of memory while reading the input"
    text = " ".join(str(e).split()) or type(e).__name__
    if any(c.__name__ in _EXPECTED for c in type(e).__mro__):
        return text
    return (f"internal error ({type(e).__name__}: {text}); this is a bug in torchalloc: please report it "
            "with the output of TORCHALLOC_DEBUG=1, which shows the traceback")


if __name__ == "__main__":
    sys.exit(main())
