r"""Text from elsewhere made safe to print: control characters shown as escapes, never sent as they are.

A log is input from another process, machine or person: its phase names,
marker texts, file and function names can hold ESC sequences (which move the
cursor, retitle or clear the terminal, and in some terminals write the
clipboard), carriage returns and backspaces (which overwrite what was
printed), bells, and newlines (which forge report lines). So do file names
and arguments echoed in error messages. Every text the tools print passes
through `printable`, as the HTML page passes through html.escape:

    printable("fwd" + chr(27) + "[2J")  # the 11 characters fwd\x1b[2J
    printable(report, newlines=True)    # a whole report: its own line breaks kept

Escaped: C0 controls (tab and newline too, unless `newlines`), DEL, the C1
controls (0x80-0x9f: 0x9b is a one-byte ESC [ to some terminals), and the
Unicode line separators and bidirectional overrides that reorder or split
what is shown. Plain Python: both sides of the package may use it.
"""
from __future__ import annotations

_CONTROLS = [*range(0x20), *range(0x7F, 0xA0)]
_INVISIBLE = [0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES: dict[int, str] = {c: f"\\x{c:02x}" for c in _CONTROLS}
_ESCAPES.update({c: f"\\u{c:04x}" for c in _INVISIBLE})
_ESCAPES_KEEPING_NEWLINES = {c: e for c, e in _ESCAPES.items() if c != 0x0A}


def printable(text: str, *, newlines: bool = False) -> str:
    r"""`text` with every control character written as an escape (\x1b, \u202e); with `newlines`, line
    breaks are kept (for a whole report whose own lines are made of escaped parts)."""
    return text.translate(_ESCAPES_KEEPING_NEWLINES if newlines else _ESCAPES)
