"""A log read as it grows: each `poll()` gives the complete records appended since the last one.

`torchalloc top` refreshes from a log another process is still writing
(docs/LOG_FORMAT.md, "Complete records, crashes and truncation"). Reading
the whole file again at every refresh would cost more with every second of
the run, so `LiveReader` keeps the byte offset of the next slot and reads
from there only: the header again (its status and end offset say whether
the writer has closed the log), then whole 64-byte slots up to the first
one that is not complete yet (kind 0: a writer has reserved it and not
finished; a half-written slot at the end of the file is left for the next
poll). Strings, frames and stacks are kept as they arrive, so the event
records can be named; those tables grow with the distinct names and code
locations of the run, not with its length.

A slot whose checksum fails is dropped and counted (`dropped`); a slot left
incomplete between complete ones is skipped once the writer is gone (while
it runs, another thread may still be finishing it). While it runs, a slot
still incomplete at a poll although a later slot was complete at the poll
before never will be (zeroed by another program, or its thread killed
mid-record: a writer finishes a slot within microseconds of the ones after
it): it is skipped and counted (`holes`, the first named in `hole_slots`),
and reading goes on past it instead of showing the run as it was there.

A running writer sizes its file in whole steps of 2 MiB (log_file.c: the
growth and the helper's steps), or to its log_max. A file shorter than what
was read already, or of another size at two asks in a row, was cut by
another program: the writer's guard has stopped its log, so nothing more
will come, and the writer state says so (`CUT`) instead of "running". Event records go
through the checks `report` applies (log/checks.py): one no writer produces
(a block of 2^63 bytes, a time past 2^63 ns) is dropped and counted
(`impossible`, named in `impossible_notes()`). A compressed log (a
finished run's copy) is decompressed once and read the same way.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from .._compressed import is_compressed
from .._records import FRAME, STACK, STATUS_CLOSED, STATUS_NAMES, STATUS_OPEN, STRING
from ..log.checks import Checker
from ..log.strings import StringTable
from ..log.files import load, lock_held, open_log_file
from ..log.format import (
    CHECKSUMS_FROM,
    FRAME_DTYPE,
    HEADER_SIZE,
    RECORD_DTYPE,
    RECORD_SIZE,
    SLOT_ITEM,
    STACK_CHUNK,
    STACK_DTYPE,
    STRING_CHUNK,
    STRING_DTYPES,
    Frame,
    LogFormatError,
    LogHeader,
    parse_header,
    xor_folded,
)

# Slots read per piece: a refresh after a long pause (or the first one on a big log) reads the backlog in
# pieces of this many, so the reader's memory stays bounded however much is waiting.
PIECE_SLOTS = 1 << 18
# A poll reads this many slots first, and twice as many each time a read is all complete records: a running
# writer grows its file 16 MiB at a time, and a poll should not read megabytes of zeros to find the end.
FIRST_SLOTS = 1 << 12
# The writer state once the file no longer holds the run that was followed (emptied, removed, or opened again by
# a new process: a log path is reused by emptying the file).
RESTARTED = "gone: the file was emptied or reused by another run"
# The writer state once another program cut the file of a running writer (formatted with the file's size).
CUT = "log cut to {size} bytes by another program; its process runs on, no longer logging"
WRITER_STEP = 2 << 20  # a running writer's file is a whole number of these long (STEP, GROW_CHUNK in log_file.c)
HOLES_NAMED = 5  # slots named among those skipped as never completed


class LiveReader:
    """The records of one log, as they are appended. `poll(sink)` hands `sink` the new event records (RECORD_DTYPE,
    in file order, metadata resolved into `strings`, `frames` and `stacks` first), piece by piece."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open_log_file(path) as f:  # never a FIFO: its reads would wait for ever
            head = f.read(8)
        self._bytes: np.ndarray | None = None  # a compressed log, inflated once: it no longer grows
        if is_compressed(head):
            _, self._bytes, _, _ = load(path)
            self.header = parse_header(path, self._bytes)
        else:
            self.header = self._read_header()
        self.next_slot = 0  # the index of the next slot to read
        self._last_size: int | None = None  # the file's size at the last ask
        self.writer = ""  # not asked yet (_ask_writer reads it)
        self.writer = self._ask_writer()  # as of the last poll: "running", or how the writer ended
        self.strings = StringTable(STRING_CHUNK[self.header.version])  # decoded when looked up
        self.frames: dict[int, Frame] = {}
        self.stacks: dict[int, list[Frame]] = {}
        self._stack_parts: dict[int, dict[int, list[int]]] = {}
        self.dropped = 0  # slots that failed their checksum
        self.impossible = 0  # event records no writer produces (log/checks.py), dropped
        self._checker = Checker(header_size=self.header.header_size, path=path)
        self.skipped = 0  # incomplete slots passed over once the writer was gone
        self.holes = 0  # slots the running writer never completed, passed over
        self.hole_slots: list[int] = []  # the first HOLES_NAMED of them
        self._complete_through = -1  # the last complete slot the previous poll saw (its index)
        self.waiting_at: int | None = None  # the incomplete slot the last poll stopped at, later ones complete

    def _read_header(self) -> LogHeader:
        with open_log_file(self.path) as f:
            head = f.read(HEADER_SIZE)
        return parse_header(self.path, np.frombuffer(head, dtype=np.uint8))

    def _ask_writer(self) -> str:
        """"running", or how the writer ended: "closed", "log_max reached" ..., "killed" (status open, nobody
        holds the log's lock); "unknown" where that cannot be asked (a compressed copy, a version-1 log).
        Reads the header again. The lock is asked first: a writer sets the status before it lets the lock go,
        so a header read after the lock was free says how it ended."""
        if self.writer == RESTARTED:
            return RESTARTED
        held = lock_held(self.path) if self._bytes is None else None
        if self._bytes is None:
            try:
                header = self._read_header()
            except (LogFormatError, OSError):  # emptied, or gone
                return RESTARTED
            if (header.pid, header.created_realtime_ns) != (self.header.pid, self.header.created_realtime_ns):
                return RESTARTED  # another run reuses the path: what was followed is gone
            self.header = header
        status = self.header.status
        if status != STATUS_OPEN:
            return "closed" if status == STATUS_CLOSED else STATUS_NAMES.get(status, f"status {status}")
        if held is None or self.header.version < CHECKSUMS_FROM:
            return "unknown"
        if not held:
            return "killed"
        size = self._cut_size()
        return "running" if size is None else CUT.format(size=size)

    def _cut_size(self) -> int | None:
        """The file's size when another program cut it under its running writer (see the module's docstring)."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return None
        read = self.header.header_size + self.next_slot * RECORD_SIZE
        last, self._last_size = self._last_size, size
        if size < read or (size % WRITER_STEP and size != self.header.max_bytes and size == last):
            return size
        return None

    def _slots(self, first: int, count: int) -> np.ndarray:
        """Up to `count` whole slots from slot `first` (fewer at the end of the data), as rows of 64 bytes."""
        start = self.header.header_size + first * RECORD_SIZE
        end = start + count * RECORD_SIZE
        if self.header.status != STATUS_OPEN and self.header.end_offset >= self.header.header_size:
            end = min(end, self.header.end_offset)  # nothing past the end the writer declared is log data
        if self._bytes is not None:
            data = self._bytes[start:end]
        else:
            with open_log_file(self.path) as f:
                f.seek(start)
                data = np.frombuffer(f.read(max(end - start, 0)), dtype=np.uint8)
        n = len(data) // RECORD_SIZE
        return data[: n * RECORD_SIZE].reshape(n, RECORD_SIZE)

    def poll(self, sink: Callable[[np.ndarray], None]) -> int:
        """Read what was appended since the last poll; `sink` gets its event records piece by piece. Returns how
        many slots were consumed."""
        self.writer = self._ask_writer()  # before the records: once it has ended, every record is in the file
        ended = self.writer != "running"
        if self.writer == RESTARTED:
            return 0
        consumed = 0
        want = FIRST_SLOTS
        complete_before = self._complete_through  # as the previous poll left it
        self.waiting_at = None
        while True:
            slots = self._slots(self.next_slot, want)
            if not len(slots):
                break
            raw = slots.view(RECORD_DTYPE).reshape(-1)
            zero = raw["kind"] == 0
            skipped_hole = False
            # stop at the first incomplete slot: its writer may finish it before the next poll; once the writer
            # is gone, a torn slot between complete ones is skipped, and zeros after the last one are unused space
            if ended:
                complete = np.flatnonzero(~zero)
                take = int(complete[-1]) + 1 if complete.size else 0
                self.skipped += int(np.count_nonzero(zero[:take]))
            else:
                first_zero = np.flatnonzero(zero)
                take = int(first_zero[0]) if first_zero.size else len(raw)
                complete = np.flatnonzero(~zero)
                if complete.size and complete[-1] > take:  # a later slot is complete: remember the last
                    if self.next_slot + take < complete_before:  # incomplete since the poll before
                        self._hole(self.next_slot + take)
                        take += 1  # it goes with the slots before it (a zero slot is never taken as a record)
                        skipped_hole = True
                    else:
                        self.waiting_at = self.next_slot + take
                    self._complete_through = max(self._complete_through, self.next_slot + int(complete[-1]))
            if take == 0:
                break
            raw, slots = raw[:take], slots[:take]
            good = raw["kind"] != 0
            good &= raw["seq"] == np.arange(self.next_slot, self.next_slot + take, dtype=np.uint64)
            if self.header.version >= CHECKSUMS_FROM:
                checksum_ok = xor_folded(slots) == 0
                self.dropped += int(np.count_nonzero(good & ~checksum_ok))
                good &= checksum_ok
            # select on opaque 64-byte items (one copy each), not the structured dtype (copied field by field)
            items = slots.view(SLOT_ITEM).reshape(-1)
            kinds = raw["kind"]
            meta = (kinds >= STRING) & (kinds <= STACK)
            if meta.any():
                self._metadata(items[good & meta].view(RECORD_DTYPE))
            events = items[good & ~meta].view(RECORD_DTYPE)
            if len(events):
                bad = self._checker.piece(events)
                self._checker.check_sum()  # LogFormatError: levels summed in int64 could overflow
                if bad.any():
                    self.impossible += int(np.count_nonzero(bad))
                    events = events[~bad]
            if len(events):
                sink(events)
            self.next_slot += take
            consumed += take
            if take < want and not skipped_hole:
                break
            want = min(want * 2, PIECE_SLOTS)
        return consumed

    def _hole(self, slot: int) -> None:
        self.holes += 1
        if len(self.hole_slots) < HOLES_NAMED:
            self.hole_slots.append(slot)

    def impossible_notes(self) -> list[str]:
        """One line per kind of impossible record dropped so far, naming the first few (as report's note does)."""
        return self._checker.notes()

    def _metadata(self, raw: np.ndarray) -> None:
        kinds = raw["kind"]
        self.strings.add(raw[kinds == STRING].view(STRING_DTYPES[self.header.version]))
        frames = raw[kinds == FRAME].view(FRAME_DTYPE)
        for fid, line, file_id, func_id in zip(frames["id"].tolist(), frames["line"].tolist(),
                                               frames["file"].tolist(), frames["func"].tolist()):
            self.frames[fid] = Frame(self.strings.get(file_id, "?"), line, self.strings.get(func_id, "?"))
        stacks = raw[kinds == STACK].view(STACK_DTYPE)
        unknown = Frame("?", 0, "?")
        for sid, nframes, chunk, chunk_frames in zip(stacks["id"].tolist(), stacks["nframes"].tolist(),
                                                     stacks["chunk"].tolist(), stacks["frames"].tolist()):
            parts = self._stack_parts.setdefault(sid, {})
            parts[chunk] = chunk_frames
            if len(parts) >= (nframes + STACK_CHUNK - 1) // STACK_CHUNK:
                del self._stack_parts[sid]
                ids = [f for c in sorted(parts) for f in parts[c]][:nframes]
                self.stacks[sid] = [self.frames.get(f, unknown) for f in ids]

