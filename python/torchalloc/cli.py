"""The `torchalloc` command: `torchalloc <subcommand> [args]`.

Each subcommand lives in its own module and is imported only when it runs,
so `torchalloc info` works without numpy, torch or a GPU. To add one, add a
line to COMMANDS; its function takes the remaining arguments (a list of
str, to parse with its own argparse parser, prog="torchalloc NAME") and
returns an exit status (None means 0).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import traceback
from typing import Any, Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Command:
    module: str  # relative to the torchalloc package
    function: str
    summary: str


COMMANDS: dict[str, Command] = {
    "info": Command("cli", "info_main", "library path, version, config keys and devices"),
    "replay": Command("replay", "main", "replay a trace (PyTorch snapshot or torchalloc log) through each policy "
                      "on a simulated device"),
    "report": Command("report", "main", "explain a log: timeline, peak anatomy, lifetimes, phases (--json, --html, --png)"),
    "export": Command("export", "main", "convert a log to a PyTorch memory snapshot pickle (memory_viz)"),
    "compare": Command("compare", "main", "run a script once per policy on the GPU; compare peaks and time"),
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
        from . import __version__

        print(f"torchalloc {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"torchalloc: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        status = _resolve(name)(rest)
    except KeyboardInterrupt:
        print(f"torchalloc {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every tool error is one line; the traceback only on request
        if os.environ.get("TORCHALLOC_DEBUG"):
            traceback.print_exc()
        print(f"torchalloc {name}: error: {describe_error(e)}", file=sys.stderr)
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


# ---------------------------------------------------------------------------
# torchalloc info
# ---------------------------------------------------------------------------


def _collect_info() -> dict[str, Any]:
    """What `info` reports; never raises for a missing library or GPU, it says so."""
    from . import __version__, _lib

    info: dict[str, Any] = {"package_version": __version__, "stats_abi_version": _lib.STATS_VERSION}
    try:
        cdll = _lib.lib()
    except _lib.LibraryError as e:
        info["library"] = None
        info["library_error"] = str(e)
        return info
    info["library"] = str(_lib.library_path())
    info["config_keys"] = _lib.config_keys()
    info["event_log"] = all(_lib.has(f) for f in ("torchalloc_mark", "torchalloc_log_open", "torchalloc_log_close"))
    # Initialise explicitly from $TORCHALLOC_CONF: on failure (no GPU, bad conf)
    # this returns the reason instead of printing it as first use would.
    try:
        _lib.init(None)
    except ValueError as e:
        info["devices"] = None
        info["device_error"] = str(e)
        # The library's configuration errors all start so (config.c); no GPU is a state, a bad conf a mistake.
        info["config_error"] = str(e).startswith("TORCHALLOC_CONF")
        return info
    info["policy"] = cdll.torchalloc_policy_name().decode()
    info["devices"] = int(cdll.torchalloc_device_count())
    if info["devices"] > 0:
        info["segments"], info["segments_asked"] = _lib.segment_mode(0)
    return info


# What each `expandable` mode does, for `info`.
_SEGMENT_MODES = {
    "off": "ordinary segments (PyTorch's caching allocator, byte for byte)",
    "on": "expandable segments, grown by granules",
    "compact": "expandable segments, compacted after a device synchronize",
    "reclaim": "expandable segments, free memory moved where it is needed without synchronizing",
}


def _segments_line(info: dict[str, Any]) -> str:
    mode, asked = info["segments"], info["segments_asked"]
    if mode != asked:  # said once, here: install() takes ordinary segments quietly
        return (f"{mode}: {_SEGMENT_MODES[mode]}; expandable:{asked} needs the driver's virtual memory management, "
                "which this device does not have")
    return f"{mode}: {_SEGMENT_MODES[mode]}" + (" (the default)" if mode == "reclaim" else "")


def _route_info() -> dict[str, Any]:
    """Which route torchalloc.install() takes here, and why (builds nothing)."""
    from . import bridge

    found = bridge.describe()
    if found["bridge"] == "unavailable":
        return {"route": "plain", "route_reason": found["bridge_reason"], **found}
    return {"route": "bridge", "route_reason": f"C++ bridge {found['bridge']}", **found}


def _print_info(info: dict[str, Any]) -> None:
    print(f"torchalloc {info['package_version']} (stats ABI version {info['stats_abi_version']})")
    if info["library"] is None:
        print(f"library:     not found\n{info['library_error']}")
        return
    print(f"library:     {info['library']}")
    print(f"event log:   {'yes' if info['event_log'] else 'not in this build'}")
    print(f"config keys: {' '.join(info['config_keys'])}")
    if info["devices"] is None:
        print(f"devices:     unavailable: {info['device_error']}")
    else:
        print(f"policy:      {info['policy']}")
        print(f"devices:     {info['devices']}")
        if "segments" in info:
            print(f"segments:    {_segments_line(info)}")
    print(f"route:       {info['route']}: {info['route_reason']}")
    if info.get("bridge_path"):
        print(f"bridge:      {info['bridge_path']}")


def info_main(argv: list[str]) -> int:
    """`torchalloc info [--json]`."""
    parser = argparse.ArgumentParser(prog="torchalloc info", description="Describe the installed torchalloc.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    info = _collect_info()
    info.update(_route_info())
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_info(info)
    return 0 if info["library"] is not None and not info.get("config_error") else 1


if __name__ == "__main__":
    sys.exit(main())
