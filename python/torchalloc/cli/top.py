"""`torchalloc top LOG...`: where memory is going now, from a log another process is still writing.

The view refreshes every `--interval` seconds from the records appended
since the last refresh (top_reader.py), never reading the log again from
its start; the state it keeps is what is live now (top_state.py), so a
refresh costs what was appended and the viewer's memory stays bounded
however long it runs. Keys: q quits, p pauses (and resumes), v cycles the
table through sites, phases and modules.

When every writer has ended (its log closed, stopped at log_max, or its
process gone without closing it), the last frame is printed below the view
with "the writer ended (...)" and top exits 0 at once: nothing more can
come, and a script waiting on top should not wait on a keypress.

The terminal view is drawn with curses from the standard library: no new
dependency, and it works over ssh and inside tmux (rich and textual would
have to be installed). `--once` prints one frame as plain text instead (no
terminal needed: CI logs, tests), the end state for a finished log.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from ..log.reader import LogFormatError
from .args import bundled_demo, expand_logs, fail, snapshot_pointer
from .top_frame import ASCII_BARS, BARS, VIEWS, frame
from .top_reader import LiveReader
from .top_state import LiveState

DEFAULT_WIDTH = 100


def _width() -> int:
    try:
        return max(int(os.environ.get("COLUMNS", "")), 40)
    except ValueError:
        return DEFAULT_WIDTH


def _ended_line(states: Sequence[LiveState]) -> str:
    if any(s.writer == "unknown" for s in states):  # a compressed copy, a version-1 log: nothing will be appended
        return "nothing more to follow: a compressed copy or a version-1 log is shown as it is"
    if any(s.writer.startswith("log cut") for s in states):  # the process may still run; its log has ended
        return "nothing more to follow (" + ", ".join(f"{os.path.basename(s.reader.path)}: {s.writer}"
                                                      for s in states) + ")"
    if len(states) == 1:
        return f"the writer ended ({states[0].writer})"
    return "every writer ended (" + ", ".join(f"{os.path.basename(s.reader.path)}: {s.writer}" for s in states) + ")"


def _loop(screen: Any, states: list[LiveState], interval: float, rows: int) -> list[str] | None:
    """Refresh and draw until q (None) or every writer has ended (the last frame's lines)."""
    import curses

    try:
        curses.curs_set(0)
    except curses.error:  # a terminal that cannot hide the cursor
        pass
    screen.timeout(int(interval * 1000))
    try:
        BARS.encode(screen.encoding)
        bars = BARS
    except (UnicodeEncodeError, LookupError):
        bars = ASCII_BARS
    paused, view = False, 0
    while True:
        if not paused:
            for s in states:
                s.refresh()
        height, width = screen.getmaxyx()
        lines = frame(states, width - 1, VIEWS[view], rows, bars)
        if all(s.writer != "running" for s in states):
            return lines + ["", _ended_line(states)]
        keys = (f"q quit   p {'resume' if paused else 'pause'}   v {'/'.join(VIEWS)} (now {VIEWS[view]})   "
                f"every {interval:g} s{'   PAUSED' if paused else ''}")
        screen.erase()
        try:
            for y, line in enumerate(lines[: height - 2]):
                # a name the terminal's encoding cannot show (a path in an ASCII locale) is drawn with "?"
                screen.addstr(y, 0, line[: width - 1].encode(screen.encoding, "replace").decode(screen.encoding))
            screen.addstr(height - 1, 0, keys[: width - 1], curses.A_REVERSE)
        except curses.error:  # a terminal too small for a line: it shows what fits
            pass
        screen.refresh()
        key = screen.getch()  # waits up to the interval
        if key in (ord("q"), ord("Q")):
            return None
        if key in (ord("p"), ord("P")):
            paused = not paused
        elif key in (ord("v"), ord("V")):
            view = (view + 1) % len(VIEWS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchalloc top",
        description="Watch a running job: allocated and reserved now and at the peak, the live allocation sites, "
        "what grew since the last marker, the last OOM; refreshed from the records the writer appends. "
        "Keys: q quit, p pause, v sites/phases/modules.",
    )
    parser.add_argument("log", nargs="*", help="the log being written (TORCHALLOC_CONF=log:PATH); several, or a "
                        "quoted pattern such as 'run.*.talog', for every rank side by side; default: the bundled "
                        "demo trace, torchalloc/data/demo_trace.talog.xz, as report reports it")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true", help="print one frame as plain text and exit (width: "
                        f"$COLUMNS, else {DEFAULT_WIDTH})")
    parser.add_argument("--rows", type=int, default=8, help="rows of the live table (default 8)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logs, problem = expand_logs(args.log or bundled_demo(parser.prog))
    problem = problem or next(filter(None, (snapshot_pointer(p, "top") for p in logs)), None)
    if not problem and not 0 < args.interval <= 3600:  # nan fails too; curses waits at most so long
        problem = "--interval must be more than 0 seconds and at most 3600"
    if not problem and args.rows < 1:
        problem = "--rows must be at least 1"
    if problem:
        fail(parser.prog, problem)
    try:
        states = [LiveState(LiveReader(p)) for p in logs]
    except LogFormatError as e:
        fail(parser.prog, str(e))
    if args.once:
        try:
            for s in states:
                s.refresh()
        except LogFormatError as e:  # blocks adding up past what int64 levels hold (log/checks.py)
            fail(parser.prog, str(e))
        print("\n".join(frame(states, _width(), "sites", args.rows)))
        return 0
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail(parser.prog, "not a terminal: the live view needs one; --once prints one frame as plain text")
    import curses

    try:
        last = curses.wrapper(_loop, states, args.interval, args.rows)  # the terminal is restored first
    except LogFormatError as e:
        fail(parser.prog, str(e))
    if last is not None:
        print("\n".join(last))
    return 0
