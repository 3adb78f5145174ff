"""`torchalloc top` never shows a stale answer as live (issue 47).

One zeroed slot inside the written part of a running writer's log, or the file cut short by another program
while the writer lives, left top waiting at that slot for ever, showing the run as it was there as "running"
while the writer went on. Now a slot still incomplete at a poll although a later one was complete at the
poll before is passed over, named; and a cut file ends the view saying so.

The "running writer" here is this process holding the log's lock (as a live writer does), so nothing
depends on timing: each poll is called by the test.
"""
from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_logs as H  # noqa: E402
from cli_in_process import cli  # noqa: E402

from torchalloc.cli.top_frame import frame  # noqa: E402
from torchalloc.cli.top_reader import LiveReader  # noqa: E402
from torchalloc.cli.top_state import LiveState  # noqa: E402

MiB = 1 << 20
STEPS = 17000  # steps after the damage (past 2 MiB of log): the run the old top never showed
SLOT = 64


def _running_log(path: Path) -> tuple[int, int]:
    """A log of a writer still running (status open, the file a whole number of 2 MiB), 1 MiB allocated and
    freed STEPS times after a 4 MiB block. (the slot index of the first step's alloc, the slot count)."""
    b = H.LogBuilder()
    H._base(b)
    first = len(b.slots)
    for k in range(STEPS):
        b.alloc(0x9000_0000, MiB)
        b.free(0x9000_0000, MiB)
    b.alloc(0x9000_0000, 3 * MiB)  # the last record: 7 MiB allocated at the end
    data = b.to_bytes(closed=False)
    size = -(-len(data) // (2 * MiB)) * (2 * MiB)  # grown in whole steps, zeros after the last record
    path.write_bytes(data.ljust(size, b"\0"))
    return first, len(b.slots)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """The log's path, its lock held as its writer holds it while it runs."""
    path = tmp_path / "run.talog"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield path
    os.close(fd)


def _zero_slot(path: Path, slot: int) -> None:
    with open(path, "r+b") as f:
        f.seek(H.HEADER_SIZE + slot * SLOT)
        f.write(bytes(SLOT))


def test_a_zeroed_slot_is_passed_over_at_the_next_poll_and_named(held: Path) -> None:
    first, total = _running_log(held)
    hole = first + 10  # an alloc: its free then finds nothing to free, as for a block from before the log
    _zero_slot(held, hole)
    state = LiveState(LiveReader(str(held)))
    state.refresh()
    reader = state.reader
    assert state.writer == "running" and reader.next_slot == hole and reader.waiting_at == hole
    status, out, _ = cli("top", "--once", str(held))
    assert status == 0 and f"stopped at slot {hole} (byte offset {H.HEADER_SIZE + hole * SLOT})" in out, out
    state.refresh()  # still incomplete, though later slots were complete at the poll before: never will be
    assert reader.holes == 1 and reader.hole_slots == [hole] and reader.waiting_at is None
    assert reader.next_slot == total and state.records == total - 2  # all but the hole and the phase name's slot
    assert state.allocated == 7 * MiB and state.writer == "running"


def test_an_incomplete_slot_is_waited_for_once(held: Path) -> None:
    """A slot being written when a poll comes is not passed over at that poll: the next finds it complete."""
    first, total = _running_log(held)
    original = held.read_bytes()[H.HEADER_SIZE + first * SLOT:H.HEADER_SIZE + (first + 1) * SLOT]
    _zero_slot(held, first)
    state = LiveState(LiveReader(str(held)))
    state.refresh()
    assert state.reader.next_slot == first
    with open(held, "r+b") as f:  # its writer finishes it
        f.seek(H.HEADER_SIZE + first * SLOT)
        f.write(original)
    state.refresh()
    assert state.reader.holes == 0 and state.reader.next_slot == total and state.allocated == 7 * MiB


@pytest.mark.parametrize("cut", [8_000_000, 2 * MiB])
def test_a_file_cut_under_its_running_writer_ends_the_view_saying_so(held: Path, cut: int) -> None:
    _running_log(held)
    state = LiveState(LiveReader(str(held)))
    if cut % (2 * MiB) == 0:  # a cut to a whole step: below what was read already
        state.refresh()
        assert state.writer == "running" and state.reader.next_slot * SLOT > cut
        with open(held, "r+b") as f:
            f.truncate(cut)
            f.seek(H.HEADER_SIZE)
            f.write(bytes(SLOT))  # and something else written over it: nothing read again
    else:  # a size no running writer gives its file: cut, once it is seen so at two asks in a row
        with open(held, "ab") as f:
            f.truncate(cut)
        state.refresh()
    state.refresh()
    said = f"log cut to {cut} bytes by another program; its process runs on, no longer logging"
    assert state.writer == said
    lines = frame([state], 200)
    assert "running" not in lines[0] and said in lines[0], lines[0]
    if cut % (2 * MiB):  # a top started after the cut knows it too
        status, out, _ = cli("top", "--once", str(held))
        assert status == 0 and f"writer {said}" in out, out
