"""The one decoder of torchalloc logs: slots in, in file order and in pieces of any size; event records out,
with the strings, frames, stacks and phase names, and a note for every slot skipped or dropped.

    decoder = Decoder(header, path)
    for slots in ...:                        # rows of 64 bytes, the slots after the header, in order
        events = decoder.piece(slots)        # RECORD_DTYPE event records (may be a view of `slots`)
        if decoder.stopped: break            # damage: nothing after it is decoded
    decoded = decoder.finish(tail, size)     # the metadata, the damage notes, truncated, complete

`read_log` (log/reader.py) gives it a whole file as one piece; `ChunkedLog` (log/chunks.py) a piece at a
time, so that a log of any size is read in bounded memory. Either gets the same records and the same notes:
a piece ends nowhere in particular, so whatever the decoder learns about a slot it carries to the next
piece (a zero slot is torn if a complete record comes after it, even pieces later; damage is named by the
first few byte offsets of each kind, counted over the whole log).

A slot is decoded when its kind is known, its sequence number is its index and (version 2) its bytes XOR
to zero. One that fails its checksum was changed after it was written (a disk or copy error): it is
dropped alone. One that passes but cannot be where it is ends the decoding: nothing after it is trusted.
A zero slot before the last complete record was never completed (its writer was killed mid-record); zero
slots after it are unused space.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .._records import (END, FRAME, MAX_KIND, PHASE_BEGIN, STACK, STATUS_CUT_SHORT, STATUS_NO_SPACE, STRING,
                        TRUNCATED)
from .format import (CHECKSUMS_FROM, FRAME_DTYPE, RECORD_DTYPE, RECORD_SIZE, SLOT_ITEM, STACK_DTYPE, STRING_CHUNK,
                     STRING_DTYPES, Frame, LogHeader, xor_folded)
from .strings import StringTable

__all__ = ["DAMAGE_LISTED", "Decoded", "Decoder", "slot_states"]

DAMAGE_LISTED = 5  # byte offsets named per kind of damage; the rest are counted


def slot_states(slots: np.ndarray, base: int, version: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per slot of `slots` (rows of 64 bytes, the first being slot `base`), three masks: never completed (kind
    0); failed its checksum; a record that can be where it is (checksum, kind and sequence number hold)."""
    raw = slots.view(RECORD_DTYPE).reshape(-1)
    kinds = raw["kind"]
    zero = kinds == 0
    if zero.all():  # nothing written here (often unused space): no checksum nor sequence number to look at
        return zero, np.zeros(len(slots), dtype=bool), np.zeros(len(slots), dtype=bool)
    if version >= CHECKSUMS_FROM:
        failed = ~zero & (xor_folded(slots) != 0)
    else:
        failed = np.zeros(len(slots), dtype=bool)
    index = np.arange(base, base + len(slots), dtype=np.uint64)
    good = ~zero & ~failed & (kinds <= MAX_KIND) & (raw["seq"] == index)
    return zero, failed, good


class _Listed:
    """Slot indices of one kind of damage: how many, and the first DAMAGE_LISTED of them."""

    def __init__(self) -> None:
        self.count = 0
        self.first: list[int] = []

    def add(self, idx: np.ndarray) -> None:
        room = DAMAGE_LISTED - len(self.first)
        if room > 0:
            self.first += [int(i) for i in idx[:room]]
        self.count += int(idx.size)

    def merge(self, other: "_Listed") -> None:
        self.count += other.count
        self.first = (self.first + other.first)[:DAMAGE_LISTED]


class _Scan:
    """Which slots to decode, piece by piece, and the damage seen so far (the module's docstring)."""

    def __init__(self, header: LogHeader) -> None:
        self.header = header
        self.stop: int | None = None  # first slot that cannot be where it is: nothing from there is decoded
        self.bad_note = ""
        self.dropped = _Listed()  # failed their checksum
        self.torn = _Listed()  # kind 0 before the last complete record
        self.pending_zero = _Listed()  # kind 0 since the last complete record
        self.pending_dirty = _Listed()  # ... of them, those with bytes in them

    def piece(self, base: int, slots: np.ndarray) -> np.ndarray:
        """The mask of slots to decode among `slots` (rows of 64 bytes, the first being slot `base`); shorter
        than `slots` when damage stops the decoding in this piece."""
        n = len(slots)
        zero, failed, good = slot_states(slots, base, self.header.version)
        if zero.all() and not slots.view(np.uint64).any():
            # Unused space (a killed writer's, or a padded file's): what the general case below gives for
            # all-zero slots, at a fraction of its cost; a small file can inflate to gigabytes of these.
            self.pending_zero.add(np.arange(base, base + n, dtype=np.uint64))
            return np.zeros(n, dtype=bool)
        raw = slots.view(RECORD_DTYPE).reshape(-1)
        kinds = raw["kind"]
        bad = np.flatnonzero(~(zero | failed | good))  # records that cannot be where they are
        if bad.size:
            end = int(bad[0])
            stop = base + end
            k = int(kinds[end])
            what = f"kind {k}" if k > MAX_KIND else f"sequence number {int(raw['seq'][end])}"
            self.bad_note = (f"damaged record at byte offset {self.offset(stop)} ({what}, expected sequence number "
                             f"{stop}); decoded the {stop} slots before it")
            self.stop = stop
            good = good[:end]
            zero, failed = zero[:end], failed[:end]
            slots = slots[:end]
        self.dropped.add(base + np.flatnonzero(failed))
        good_idx = np.flatnonzero(good)
        zero_idx = np.flatnonzero(zero)
        if good_idx.size:
            last = int(good_idx[-1])
            before = zero_idx[zero_idx < last]
            self.pending_zero.add(base + before)
            self.torn.merge(self.pending_zero)
            self.pending_zero, self.pending_dirty = _Listed(), _Listed()
            zero_idx = zero_idx[zero_idx > last]
        self.pending_zero.add(base + zero_idx)
        if zero_idx.size:
            self.pending_dirty.add(base + zero_idx[slots[zero_idx].any(axis=1)])
        return good

    def offset(self, slot: int) -> int:
        return self.header.header_size + int(slot) * RECORD_SIZE

    def offsets(self, listed: _Listed) -> str:
        """The byte offsets of the slots listed: the first few, then how many more."""
        shown = ", ".join(str(self.offset(i)) for i in listed.first)
        return shown + (f" and {listed.count - DAMAGE_LISTED} more" if listed.count > DAMAGE_LISTED else "")

    def notes(self, slots_read: int, tail: bytes) -> list[str]:
        """One note per kind of damage, in a fixed order: what stopped the decoding, the checksums that failed,
        the slots never completed, a record the data ends inside."""
        out = [self.bad_note] if self.bad_note else []
        if self.dropped.count:
            d = self.dropped
            out.append(f"{d.count} record{'s' if d.count > 1 else ''} failed the checksum (bytes changed after they "
                       f"were written: a disk or copy error) and were dropped, at byte offset {self.offsets(d)}")
        # Slots never completed: a writer killed between reserving and finishing. Past the last complete
        # record, all-zero slots are just unused space.
        torn = _Listed()
        torn.merge(self.torn)
        torn.merge(self.pending_dirty)
        for i in torn.first:
            out.append(f"incomplete record at byte offset {self.offset(i)} (its writer stopped mid-record); skipped")
        if torn.count > DAMAGE_LISTED:
            out.append(f"... and {torn.count - DAMAGE_LISTED} more incomplete records")
        if self.stop is None and any(tail):
            out.append(f"the file ends inside a record at byte offset {self.offset(slots_read)} ({len(tail)} of "
                       f"{RECORD_SIZE} bytes)")
        return out


class _Metadata:
    """Strings, frames and stacks gathered piece by piece, resolved into each other once the pass has ended."""

    def __init__(self, version: int, strings: StringTable | None = None) -> None:
        self.version = version
        # An earlier whole pass's table, added to again (the same slots give the same strings): one table
        # alive, not one a pass
        self.strings = strings if strings is not None else StringTable(STRING_CHUNK[version])
        self.frames: dict[int, tuple[int, int, int]] = {}  # id -> (line, file string id, function string id)
        self.stack_ids: dict[int, list[int]] = {}
        self.begins: set[tuple[int, int]] = set()  # (phase, label) of every phase_begin

    def piece(self, kept: np.ndarray) -> None:
        kinds = kept["kind"]
        self.strings.add(kept[kinds == STRING].view(STRING_DTYPES[self.version]))
        frames = kept[kinds == FRAME].view(FRAME_DTYPE)
        for fid, line, f, fn in zip(frames["id"].tolist(), frames["line"].tolist(), frames["file"].tolist(),
                                    frames["func"].tolist()):
            self.frames[fid] = (line, f, fn)
        stacks = kept[kinds == STACK].view(STACK_DTYPE)
        for sid, nframes, chunk_frames in zip(stacks["id"].tolist(), stacks["nframes"].tolist(),
                                              stacks["frames"].tolist()):
            got = self.stack_ids.setdefault(sid, [])
            got.extend(chunk_frames[: nframes - len(got)])

    def phase_begins(self, events: np.ndarray) -> None:
        begins = events[events["kind"] == PHASE_BEGIN]
        self.begins.update(zip(begins["phase"].tolist(), begins["stack"].tolist()))

    def stack_now(self, sid: int) -> list[Frame]:
        """Stack `sid` from what was read so far (a stack, its frames and strings come before the first record
        that uses them), for a reader that needs it before the pass ends."""
        out = []
        for fid in self.stack_ids.get(sid, []):
            line, f, fn = self.frames.get(fid, (0, -1, -1))
            out.append(Frame(self.strings.get(f, "?"), line, self.strings.get(fn, "?")) if fid in self.frames
                       else Frame("?", 0, "?"))
        return out

    def resolve(self) -> tuple[dict[int, Frame], dict[int, list[Frame]]]:
        strings = self.strings
        frames = {fid: Frame(strings.get(f, "?"), line, strings.get(fn, "?"))
                  for fid, (line, f, fn) in self.frames.items()}
        unknown = Frame("?", 0, "?")
        stacks = {sid: [frames.get(f, unknown) for f in fids] for sid, fids in self.stack_ids.items()}
        return frames, stacks


@dataclass
class Decoded:
    """What a whole pass of a Decoder learned beside the event records (read_log's Log fields)."""

    strings: StringTable
    frames: dict[int, Frame]
    stacks: dict[int, list[Frame]]
    phase_names: dict[int, str]
    truncated: bool  # the writer stopped early: log_max reached, disk full
    complete: bool  # closed cleanly: an END record is last
    damage: list[str]  # what was skipped or dropped, one line each, naming the log
    records: int  # event records given


class Decoder:
    """One pass over a log's slots (the module's docstring)."""

    def __init__(self, header: LogHeader, path: str, *, strings: StringTable | None = None,
                 screen: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """`strings`: an earlier pass's table over the same log, added to again. `screen`: given each piece's
        event records, the mask of those to leave out (ChunkedLog's checks of records no writer produces,
        log/checks.py); they count as never read (not for `truncated`, `complete` nor `records`)."""
        self.header, self.path = header, path
        self._scan = _Scan(header)
        self._meta = _Metadata(header.version, strings)
        self._screen = screen
        self.slots_read = 0
        self._records = 0
        self._truncated = False
        self._last_kind = -1

    @property
    def stopped(self) -> bool:
        """Damage stopped the decoding: no slot from it on is decoded."""
        return self._scan.stop is not None

    def piece(self, slots: np.ndarray) -> np.ndarray:
        """The event records among the next `slots` (rows of 64 bytes), as RECORD_DTYPE: a view of `slots` where
        every one is an event record kept, else a copy."""
        n = len(slots)
        keep = self._scan.piece(self.slots_read, slots)
        self.slots_read += n
        kinds = slots[: len(keep), RECORD_SIZE - 1]
        is_meta = (kinds >= STRING) & (kinds <= STACK)
        if is_meta.any():
            self._meta.piece(slots[: len(keep)][keep & is_meta].view(RECORD_DTYPE).reshape(-1))
        wanted = keep & ~is_meta
        if len(keep) == n and wanted.all():
            events = slots.view(RECORD_DTYPE).reshape(-1)  # the common case in a piece with no metadata
        else:
            events = slots[: len(keep)].view(SLOT_ITEM).reshape(-1)[wanted].view(RECORD_DTYPE)
        if len(events):
            self._meta.phase_begins(events)
        if len(events) and self._screen is not None:
            out = self._screen(events)
            if out.any():
                events = events[~out]
        if len(events):
            self._truncated = self._truncated or bool(np.any(events["kind"] == TRUNCATED))
            self._last_kind = int(events["kind"][-1])
            self._records += len(events)
        return events

    def string_now(self, sid: int, default: str) -> str:
        """String `sid` as far as the pass has read."""
        return self._meta.strings.get(sid, default)

    def stack_now(self, sid: int) -> list[Frame]:
        """Stack `sid` as far as the pass has read."""
        return self._meta.stack_now(sid)

    def finish(self, tail: bytes, size: int) -> Decoded:
        """The pass's end: `tail`, the bytes after the last whole slot read (a record cut short); `size`, where the
        log's data ends (the file's size, that of its content when compressed), checked against the header's."""
        header = self.header
        notes: list[str] = []
        if not header.checksum_ok:
            notes.append("the header failed its checksum (bytes changed after it was written): its status, end "
                         "offset, pid or times may be wrong")
        if header.status != 0 and header.end_offset > size:
            notes.append(f"the file ends at byte offset {size}, but its header says the writer wrote "
                         f"{header.end_offset} bytes (copied or cut short?)")
        notes += self._scan.notes(self.slots_read, tail)
        strings = self._meta.strings
        missing = strings.missing_note()
        if missing:
            notes.append(missing)
        frames, stacks = self._meta.resolve()
        if header.status == STATUS_NO_SPACE:
            notes.append(f"the writer could not grow the file (disk full?); it stopped at byte offset "
                         f"{header.end_offset}")
        phase_names = {0: "default"}
        for phase, label in self._meta.begins:
            phase_names[phase] = strings.get(label, f"phase{phase}")
        return Decoded(strings, frames, stacks, phase_names, self._truncated or header.status in STATUS_CUT_SHORT,
                       self._last_kind == END, [f"{self.path}: {note}" for note in notes], self._records)

