"""`torchalloc info [--json] [--keys]`: which library, configuration, devices and route this installation has;
with --keys, what each TORCHALLOC_CONF key takes, as the library's own table says (config.c)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..printable import printable
from ..text_fit import paragraph, terminal_width


def _collect_info() -> dict[str, Any]:
    """What `info` reports; never raises for a missing library or GPU, it says so."""
    from .. import __version__, _lib

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
    from .. import bridge

    found = bridge.describe()
    if found["bridge"] == "unavailable":
        return {"route": "plain", "route_reason": found["bridge_reason"], **found}
    return {"route": "bridge", "route_reason": f"C++ bridge {found['bridge']}", **found}


# "library:     " and the like: a value's next lines start under its first.
_VALUE_INDENT = " " * len("config keys: ")


def _print_info(info: dict[str, Any]) -> None:
    width = terminal_width()
    for line in _info_lines(info):
        # Library errors and the configuration's come from the environment ($TORCHALLOC_CONF, $TORCHALLOC_LIB):
        # a bad value echoed as it is could send ESC sequences to the terminal or forge a line.
        for fitted in paragraph(printable(line), width, more=_VALUE_INDENT):
            print(fitted)


def _info_lines(info: dict[str, Any]) -> list[str]:
    """What `info` prints, one line each, not yet escaped."""
    lines = [f"torchalloc {info['package_version']} (stats ABI version {info['stats_abi_version']})"]
    if info["library"] is None:
        # its own line breaks (the places it looked) kept; each line escaped on its own
        return lines + ["library:     not found", *str(info["library_error"]).splitlines()]
    lines.append(f"library:     {info['library']}")
    lines.append(f"event log:   {'yes' if info['event_log'] else 'not in this build'}")
    lines.append(f"config keys: {' '.join(info['config_keys'])}")
    if info.get("config_error"):
        lines.append("config:      invalid (see the error below)")
        lines.append("devices:     unknown until the configuration is fixed")
    elif info["devices"] is None:
        lines.append(f"devices:     unavailable: {info['device_error']}")
    else:
        lines.append(f"policy:      {info['policy']}")
        lines.append(f"devices:     {info['devices']}")
        if "segments" in info:
            lines.append(f"segments:    {_segments_line(info)}")
    lines.append(f"route:       {info['route']}: {info['route_reason']}")
    if info.get("bridge_path"):
        lines.append(f"bridge:      {info['bridge_path']}")
    return lines


def _keys_lines(keys: list[dict[str, str]]) -> list[str]:
    """What `info --keys` prints: a key, what it takes and its default on one line, its help indented below."""
    width = terminal_width()
    lines = ["TORCHALLOC_CONF keys (comma-separated key:value):"]
    for key in keys:
        lines += paragraph(f"{key['key']}: {key['values']} (default: {key['default']})", width, "  ", "    ")
        lines += paragraph(key["help"], width, "      ", "")
    return lines


def _print_keys(as_json: bool) -> int:
    from .. import _lib

    try:
        keys = _lib.config_help()
    except _lib.LibraryError as e:
        print(printable(f"torchalloc info: error: {e}"), file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(keys, indent=2))
    else:
        print("\n".join(_keys_lines(keys)))
    return 0


def main(argv: list[str]) -> int:
    """`torchalloc info [--json] [--keys]`."""
    parser = argparse.ArgumentParser(prog="torchalloc info", description="Describe the installed torchalloc.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keys", action="store_true",
                        help="describe each TORCHALLOC_CONF key instead: what it takes, its default, what it does")
    args = parser.parse_args(argv)
    if args.keys:
        return _print_keys(args.json)
    info = _collect_info()
    info.update(_route_info())
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_info(info)
    if info.get("config_error"):  # a mistake to fix, said where errors go (a machine without a GPU is not one)
        print(printable(f"torchalloc info: error: {info['device_error']}"), file=sys.stderr)
    return 0 if info["library"] is not None and not info.get("config_error") else 1

