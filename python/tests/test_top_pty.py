"""`torchalloc top` used as a person would: in a terminal (a pseudo-terminal), beside a running job.

A writer process (top_writer.py) runs steps on the simulated device; top
runs under a pty with TERM=xterm. What it draws is played onto a small
screen model (`Screen`: the cursor moves, erases and scroll regions curses
sends to an xterm), so the test reads the screen a person would see, not
the stream of bytes that redraws only what changed. The test waits for
content (never for a fixed time), checks the writer's own figures on two
successive screens, then presses q; and sees top leave by itself, saying so,
when the writer ends.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
from test_top import HERE, Writer

from torchalloc.units import fmt_bytes

ROWS, COLS = 40, 120
WAIT_S = 120  # generous: the test waits for content, this only ends a hung run

_CONTROL = re.compile(rb"\x1b\[([?>=]?)([0-9;]*)([ -/]*)([@-~])|\x1b([()*+].)|\x1b([ -/]*[0-~])|([\x00-\x1f])|([^\x00-\x1f\x1b]+)")


class Screen:
    """The characters on an xterm screen, from the bytes sent to it (the sequences curses uses; colours and
    modes are ignored)."""

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.cells = [[" "] * cols for _ in range(rows)]
        self.y = self.x = 0
        self.top, self.bottom = 0, rows - 1
        self.saved = (0, 0)
        self.everything = ""  # every character written, in order (what scrolled away too)
        self._pending = b""

    def _scroll(self, n: int) -> None:
        """Up by n lines within the scroll region (down for n < 0)."""
        region = self.cells[self.top: self.bottom + 1]
        blank = [[" "] * self.cols for _ in range(abs(n))]
        region = region[n:] + blank if n > 0 else blank + region[:n]
        self.cells[self.top: self.bottom + 1] = region[: self.bottom - self.top + 1]

    def _newline(self) -> None:
        if self.y == self.bottom:
            self._scroll(1)
        else:
            self.y = min(self.y + 1, self.rows - 1)

    def _csi(self, private: bytes, params: bytes, final: str) -> None:
        nums = [int(p) if p else 0 for p in params.split(b";")] if params else []
        n = max(nums[0], 1) if nums else 1
        if private or final in "mhlt":
            return  # modes, colours, the window's title
        if final in "Hf":
            self.y = min(max((nums[0] if nums else 1), 1) - 1, self.rows - 1)
            self.x = min(max((nums[1] if len(nums) > 1 else 1), 1) - 1, self.cols - 1)
        elif final == "A":
            self.y = max(self.y - n, 0)
        elif final in "Be":
            self.y = min(self.y + n, self.rows - 1)
        elif final in "Ca":
            self.x = min(self.x + n, self.cols - 1)
        elif final == "D":
            self.x = max(self.x - n, 0)
        elif final in "G`":
            self.x = min(n - 1, self.cols - 1)
        elif final == "d":
            self.y = min(n - 1, self.rows - 1)
        elif final == "K":
            mode = nums[0] if nums else 0
            row = self.cells[self.y]
            lo, hi = {0: (self.x, self.cols), 1: (0, self.x + 1), 2: (0, self.cols)}[mode]
            row[lo:hi] = [" "] * (hi - lo)
        elif final == "J":
            mode = nums[0] if nums else 0
            self._csi(b"", str(mode).encode(), "K")
            span = range(self.y + 1, self.rows) if mode == 0 else range(0, self.y) if mode == 1 else range(self.rows)
            for y in span:
                self.cells[y] = [" "] * self.cols
        elif final == "r":
            self.top = (nums[0] if nums else 1) - 1 if nums and nums[0] else 0
            self.bottom = (nums[1] - 1) if len(nums) > 1 and nums[1] else self.rows - 1
            self.y = self.x = 0
        elif final in "@PX":
            row = self.cells[self.y]
            if final == "@":
                row[self.x:] = ([" "] * n + row[self.x:])[: self.cols - self.x]
            elif final == "P":
                row[self.x:] = row[self.x + n:] + [" "] * min(n, self.cols - self.x)
            else:
                row[self.x: self.x + n] = [" "] * len(row[self.x: self.x + n])
        elif final in "LM":
            saved_top, self.top = self.top, self.y
            self._scroll(-n if final == "L" else n)
            self.top = saved_top
        elif final in "ST":
            self._scroll(n if final == "S" else -n)
        else:
            raise AssertionError(f"the screen model does not know CSI {private!r}{params!r}{final}")

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        # keep an escape sequence or a UTF-8 character cut at the end of this read for the next one
        cut = data.rfind(b"\x1b")
        if cut >= 0 and not _CONTROL.match(data, cut):
            data, self._pending = data[:cut], data[cut:]
        else:
            self._pending = b""
        while data and 0x80 <= data[-1] and not data.decode("utf-8", "ignore") == data.decode("utf-8", "replace"):
            data, self._pending = data[:-1], data[-1:] + self._pending
        for m in _CONTROL.finditer(data):
            csi_private, csi_params, _, csi_final, _, esc, ctrl, text = m.groups()
            if csi_final is not None:
                self._csi(csi_private, csi_params, csi_final.decode())
            elif esc is not None:
                if esc == b"7":
                    self.saved = (self.y, self.x)
                elif esc == b"8":
                    self.y, self.x = self.saved
                elif esc == b"M":
                    if self.y == self.top:
                        self._scroll(-1)
                    else:
                        self.y = max(self.y - 1, 0)
                elif esc in (b"D", b"E"):
                    self._newline()
                    if esc == b"E":
                        self.x = 0
            elif ctrl is not None:
                c = ctrl[0]
                if c == 0x0D:
                    self.x = 0
                elif c == 0x0A:
                    self._newline()
                    self.everything += "\n"
                elif c == 0x08:
                    self.x = max(self.x - 1, 0)
            elif text is not None:
                for ch in text.decode("utf-8", "replace"):
                    if self.x >= self.cols:
                        self.x = 0
                        self._newline()
                    self.cells[self.y][self.x] = ch
                    self.x += 1
                    self.everything += ch

    def text(self) -> str:
        return "\n".join("".join(row).rstrip() for row in self.cells)


@pytest.fixture
def terminal_top(tmp_path: Path, library_path: Path) -> Iterator[Callable[[Path], tuple[subprocess.Popen, int]]]:
    """Starts `torchalloc top --interval 0.2 LOG` on a pty of ROWS x COLS; gives the process and the pty's master."""
    started: list[tuple[subprocess.Popen, int]] = []

    def start(log: Path) -> tuple[subprocess.Popen, int]:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        env = dict(os.environ, TERM="xterm", LINES=str(ROWS), COLUMNS=str(COLS), LC_ALL="C.UTF-8",
                   PYTHONPATH=str(HERE.parent), TORCHALLOC_LIB=str(library_path))
        proc = subprocess.Popen([sys.executable, "-m", "torchalloc.cli", "top", "--interval", "0.2", str(log)],
                                stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
                                cwd=tmp_path)
        os.close(slave)
        started.append((proc, master))
        return proc, master

    yield start
    for proc, master in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        os.close(master)


def _until(screen: Screen, master: int, proc: subprocess.Popen, done: Callable[[], bool]) -> None:
    """Plays top's output onto `screen` until `done()` (or top exits and says nothing more)."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"top never showed what was expected; the screen:\n{screen.text()}"
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the pty closed: top has exited
                data = b""
            if data:
                screen.feed(data)
                continue
        if proc.poll() is not None and not ready:
            assert done(), f"top exited ({proc.returncode}) before showing what was expected:\n{screen.everything}"


def _figures_line(figures: dict[str, int]) -> tuple[str, str]:
    return (f"allocated {fmt_bytes(figures['allocated'])} (peak {fmt_bytes(figures['peak_allocated'])} at",
            f"reserved {fmt_bytes(figures['reserved'])} (peak {fmt_bytes(figures['peak_reserved'])} at")


def test_two_screens_follow_the_job_and_q_quits(tmp_path: Path, library_path: Path, terminal_top) -> None:
    log = tmp_path / "job.talog"
    writer = Writer(log, 2, library_path)
    try:
        first = writer.figures()
        proc, master = terminal_top(log)
        screen = Screen(ROWS, COLS)
        # a screen is drawn in several writes: wait until all that is checked is on it
        expected = [*_figures_line(first), "marker 'step 1'", "writer running", "q quit", "top_writer.py:"]
        _until(screen, master, proc, lambda: all(e in screen.text() for e in expected))
        writer.say("more")
        second = writer.figures()
        assert second["allocated"] != first["allocated"]  # the second screen must show new figures
        expected = [*_figures_line(second), "marker 'step 3'"]
        _until(screen, master, proc, lambda: all(e in screen.text() for e in expected))
        os.write(master, b"v")  # the table by phase
        _until(screen, master, proc, lambda: "Live by the phase that allocated" in screen.text())
        os.write(master, b"q")
        assert proc.wait(timeout=WAIT_S) == 0
        assert writer.finish() == 0
    finally:
        writer.kill()


def test_top_leaves_by_itself_when_the_writer_ends(tmp_path: Path, library_path: Path, terminal_top) -> None:
    log = tmp_path / "job.talog"
    writer = Writer(log, 2, library_path)
    try:
        figures = writer.figures()
        proc, master = terminal_top(log)
        screen = Screen(ROWS, COLS)
        _until(screen, master, proc, lambda: "writer running" in screen.text())
        assert writer.finish() == 0
        _until(screen, master, proc, lambda: "the writer ended (closed)" in screen.everything)
        assert proc.wait(timeout=WAIT_S) == 0
        # the last frame stays printed below the view, with the job's end figures
        assert _figures_line(figures)[0] in screen.everything
    finally:
        writer.kill()
