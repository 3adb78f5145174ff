"""Read a torchalloc log in pieces: the records of a log of any size, in bounded memory.

    from torchalloc.log.chunks import ChunkedLog
    log = ChunkedLog("run.talog", chunk_records=1 << 20)
    for first, records in log.chunks():       # RECORD_DTYPE event records, in file order, piece by piece
        ...                                    # `first`: how many event records came before this piece
    log.strings, log.stacks, log.phase_names, log.damage, log.truncated, log.writer   # after a whole pass

`read_log` (log/reader.py) decodes a whole file at once; a log of 10^8 records is
6.4 GB, and its decoded arrays more. The report, replay and export read
every log with this instead: the same file
`chunk_records` slots at a time (plain reads into one buffer, so the
file's pages never count against the process) and gives exactly what
read_log gives: the same event records in the same order, the same
strings, frames, stacks and phase names, the same damage notes in the same
order, the same `truncated`, `complete` and `writer`. Each call of
`chunks()` reads the file again from the start (the analysis makes two
passes); the metadata and the notes are complete once one pass has ended.

A compressed log (gzip, xz, bz2) is decompressed as it is read; bytes are
read from memory.
"""
from __future__ import annotations

import lzma
import os
import zlib
from typing import IO, Any, Iterator, Mapping, Union

import numpy as np

from .._compressed import CompressedError, is_compressed
from .._records import END, FRAME, MAX_KIND, PHASE_BEGIN, STACK, STATUS_CUT_SHORT, STATUS_NO_SPACE, STRING, TRUNCATED
from .checks import Checker
from .files import WRITER_UNKNOWN, check_regular_file, open_log_file, writer_state
from .format import (CHECKSUMS_FROM, FRAME_DTYPE, HEADER_SIZE, RECORD_DTYPE, RECORD_SIZE, SLOT_ITEM, STACK_DTYPE,
                     STRING_CHUNK, STRING_DTYPES, Frame, LogFormatError, LogHeader, parse_header, xor_folded)
from .reader import DAMAGE_LISTED
from .strings import StringTable
from .trace_events import TraceError

__all__ = ["ChunkedLog", "DEFAULT_CHUNK_RECORDS"]

# 16 MiB of log per piece (larger pieces: more memory, no faster). Every tool reads every log this way; a log
# smaller than a piece is one piece.
DEFAULT_CHUNK_RECORDS = 1 << 18
_STREAM_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError)  # CompressedError is a ValueError


def _phase_labels(events: np.ndarray) -> Any:
    """(phase, label) of each phase_begin record: read_log names the phases from their set."""
    begins = events[events["kind"] == PHASE_BEGIN]
    return zip(begins["phase"].tolist(), begins["stack"].tolist())


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
    """log._scan over a file in pieces: which slots to keep, and the damage seen so far."""

    def __init__(self, header: LogHeader) -> None:
        self.header = header
        self.stop: int | None = None  # first slot that cannot be where it is: nothing from there is decoded
        self.bad_note = ""
        self.dropped = _Listed()  # failed their checksum
        self.torn = _Listed()  # kind 0 before the last complete record
        self.pending_zero = _Listed()  # kind 0 since the last complete record
        self.pending_dirty = _Listed()  # ... of them, those with bytes in them

    def piece(self, base: int, slots: np.ndarray) -> np.ndarray:
        """The mask of slots to decode among `slots` (rows of 64 bytes, the first being slot `base`)."""
        n = len(slots)
        if not slots.view(np.uint64).any():
            # Unused space (a killed writer's, or a padded file's): what the general case below gives for
            # all-zero slots, at a fraction of its cost; a small file can inflate to gigabytes of these.
            self.pending_zero.add(np.arange(base, base + n, dtype=np.uint64))
            return np.zeros(n, dtype=bool)
        raw = slots.view(RECORD_DTYPE).reshape(-1)
        kinds = raw["kind"]
        zero = kinds == 0
        if self.header.version >= CHECKSUMS_FROM:
            failed = ~zero & (xor_folded(slots) != 0)
        else:
            failed = np.zeros(n, dtype=bool)
        candidate = ~zero & ~failed
        index = np.arange(base, base + n, dtype=np.uint64)
        good = candidate & (kinds <= MAX_KIND) & (raw["seq"] == index)
        bad = np.flatnonzero(candidate & ~good)
        end = n
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
        shown = ", ".join(str(self.offset(i)) for i in listed.first)
        return shown + (f" and {listed.count - DAMAGE_LISTED} more" if listed.count > DAMAGE_LISTED else "")

    def notes(self, slots_read: int, tail: bytes) -> list[str]:
        """The notes log._scan writes, in its order."""
        out = [self.bad_note] if self.bad_note else []
        if self.dropped.count:
            d = self.dropped
            out.append(f"{d.count} record{'s' if d.count > 1 else ''} failed the checksum (bytes changed after they "
                       f"were written: a disk or copy error) and were dropped, at byte offset {self.offsets(d)}")
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
    """Strings, frames and stacks as log._strings, _frames and _stacks build them, gathered piece by piece."""

    def __init__(self, version: int, strings: StringTable | None = None) -> None:
        self.version = version
        # An earlier whole pass's table, added to again (the same slots give the same strings): one table
        # alive, not one a pass
        self.strings = strings if strings is not None else StringTable(STRING_CHUNK[version])
        self.frames: dict[int, tuple[int, int, int]] = {}  # id -> (line, file string id, function string id)
        self.stack_ids: dict[int, list[int]] = {}
        self.begins: set[tuple[int, int]] = set()  # (phase, label) of every phase_begin: read_log's set

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

    def text(self, string_id: int) -> str:
        """String `string_id` from what was read so far ("?" when none)."""
        return self.strings.get(string_id, "?")

    def stack_now(self, sid: int) -> list[Frame]:
        """Stack `sid` from what this pass has read so far (a stack, its frames and strings come before the
        first record that uses them), for a reader that needs it before the pass ends."""
        out = []
        for fid in self.stack_ids.get(sid, []):
            line, f, fn = self.frames.get(fid, (0, -1, -1))
            out.append(Frame(self.text(f), line, self.text(fn)) if fid in self.frames else Frame("?", 0, "?"))
        return out

    def resolve(self, notes: list[str], path: str) -> tuple[StringTable, dict[int, Frame], dict[int, list[Frame]]]:
        strings = self.strings
        note = strings.missing_note()
        if note:
            notes.append(f"{path}: {note}")
        frames = {fid: Frame(strings.get(f, "?"), line, strings.get(fn, "?"))
                  for fid, (line, f, fn) in self.frames.items()}
        unknown = Frame("?", 0, "?")
        stacks = {sid: [frames.get(f, unknown) for f in fids] for sid, fids in self.stack_ids.items()}
        return strings, frames, stacks


class ChunkedLog:
    """A torchalloc log read piece by piece (module docstring). Raises LogFormatError as read_log does."""

    def __init__(self, source: Union[str, os.PathLike[str], bytes, bytearray, memoryview],
                 chunk_records: int = DEFAULT_CHUNK_RECORDS, check: str = "none") -> None:
        """`check`: what to do with records no writer produces (log/checks.py): "none" gives them as read_log
        does, "drop" leaves them out of the pieces and names them in `dropped` (report, export), "refuse" raises
        TraceError at the first piece holding one (replay)."""
        if chunk_records < 1:
            raise ValueError("chunk_records must be at least 1")
        if check not in ("none", "drop", "refuse"):
            raise ValueError(f"check must be none, drop or refuse, not {check!r}")
        self.check = check
        self.dropped: list[str] = []  # checks.impossible's notes, after a whole pass with check="drop"
        # A record every pass gives first, before the log's own (analysis/front.py: the 'log opened' row of a
        # log opened mid-run); None: none.
        self.opening: np.ndarray | None = None
        self.chunk_records = int(chunk_records)
        self._bytes: memoryview | None = None
        self._compressed = False
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.path, self._bytes, self.is_file = "<bytes>", memoryview(source).cast("B"), False
        else:
            self.path = str(os.fspath(source))
            check_regular_file(self.path)
            with open_log_file(self.path) as f:
                self._compressed = is_compressed(f.read(8))
            self.is_file = not self._compressed
        with self._open() as f:
            head = self._read(f, HEADER_SIZE)
        self.header = parse_header(self.path, np.frombuffer(head, dtype=np.uint8))
        # What a whole pass fills in (read_log's Log fields).
        self.strings: Mapping[int, str] = {}
        self.frames: dict[int, Frame] = {}
        self.stacks: dict[int, list[Frame]] = {}
        self.phase_names: dict[int, str] = {0: "default"}
        self.truncated = False
        self.complete = False
        self.damage: list[str] = []
        self.writer = WRITER_UNKNOWN
        self.records_total = 0  # event records in the log
        self.passes = 0  # whole passes made

    def last_event_time(self, device: int | None, probe: int = 4096, reach: int = 64 << 20) -> int | None:
        """The time of the log's last event record about `device` (or no device; None: any), found by reading
        the file backwards, `probe` slots at a time, at most `reach` bytes (a killed writer leaves up to 32 MiB
        of zeros after its last record); None when they hold none, or the log is compressed. A guess for planning
        a pass (the timeline's time buckets): the pass checks it."""
        if self._compressed:
            return None
        header = self.header
        with self._open() as f:
            end = f.seek(0, os.SEEK_END)
            if header.status != 0 and header.header_size <= header.end_offset < end:
                end = header.end_offset
            total = max(0, (end - header.header_size) // RECORD_SIZE)
            stop = max(0, total - reach // RECORD_SIZE)
            while total > stop:
                first = max(stop, total - probe)
                f.seek(header.header_size + first * RECORD_SIZE)
                data = self._read(f, (total - first) * RECORD_SIZE)
                assert isinstance(data, bytes)
                found = self._last_in(np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_SIZE), first, device)
                if found is not None:
                    return found
                total = first
        return None

    def _last_in(self, slots: np.ndarray, first: int, device: int | None) -> int | None:
        raw = slots.view(RECORD_DTYPE).reshape(-1)
        kinds = raw["kind"]
        ok = (kinds != 0) & (kinds <= MAX_KIND) & ((kinds < STRING) | (kinds > STACK))
        ok &= raw["seq"] == np.arange(first, first + len(raw), dtype=np.uint64)
        if self.header.version >= CHECKSUMS_FROM:
            ok &= xor_folded(slots) == 0
        if device is not None:
            ok &= (raw["device"] == device) | (raw["device"] < 0)
        hits = np.flatnonzero(ok)
        return int(raw["time_ns"][hits[-1]]) if hits.size else None

    def string_now(self, sid: int, default: str) -> str:
        """During a pass: string `sid` as far as the pass has read (as read_log resolves it); after it, `strings`."""
        meta = getattr(self, "_meta", None)
        if meta is None:
            return self.strings.get(sid, default)
        return meta.strings.get(sid, default)

    def stack_now(self, sid: int) -> list[Frame]:
        """During a pass: stack `sid` as far as the pass has read (_Metadata.stack_now); after it, `stacks`."""
        meta = getattr(self, "_meta", None)
        return meta.stack_now(sid) if meta is not None else self.stacks.get(sid, [])

    # -- reading -------------------------------------------------------------
    def _open(self) -> IO[bytes]:
        if self._bytes is not None:
            import io

            return io.BytesIO(self._bytes)  # type: ignore[arg-type]
        if self._compressed:
            return open_log_file(self.path, compressed=True)
        return open_log_file(self.path, buffering=0)

    def _read(self, f: IO[bytes], n: int, into: np.ndarray | None = None) -> bytes | int:
        """Up to n bytes (or into `into`: how many were read), reading again until EOF or n."""
        try:
            if into is None:
                parts, got = [], 0
                while got < n:
                    part = f.read(n - got)
                    if not part:
                        break
                    parts.append(part)
                    got += len(part)
                return b"".join(parts)
            view, got = memoryview(into).cast("B"), 0
            while got < n:
                k = f.readinto(view[got:n])  # type: ignore[attr-defined]
                if not k:
                    break
                got += k
            return got
        except CompressedError as e:  # it says what is wrong already (cut short, or refused: _compressed.py)
            raise LogFormatError(f"{self.path}: {e}") from None
        except _STREAM_ERRORS as e:
            raise LogFormatError(f"{self.path}: truncated or corrupt compressed file ({e})") from None

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(event records before the piece, the piece's event records as RECORD_DTYPE), in file order.

        A piece may be a view of the read buffer: it holds until the next piece is asked for (copy what
        must live longer; columns taken from it are copies)."""
        header = self.header
        limit = header.end_offset if header.status != 0 and header.end_offset >= header.header_size else None
        known = self.strings if isinstance(self.strings, StringTable) else None
        scan, meta = _Scan(header), _Metadata(header.version, known)
        checker = Checker(header_size=header.header_size, path=self.path) if self.check != "none" else None
        self._meta = meta
        buf = np.empty(self.chunk_records * RECORD_SIZE, dtype=np.uint8)
        position, slot, emitted = 0, 0, 0
        truncated, last_kind = False, -1
        tail = b""
        if self.opening is not None:
            yield 0, self.opening
            emitted += len(self.opening)
        with self._open() as f:
            skip = header.header_size
            while skip:  # the header (and any longer header's extra bytes)
                got = self._read(f, min(skip, len(buf)), buf)
                assert isinstance(got, int)
                if not got:
                    break
                skip -= got
                position += got
            while scan.stop is None:
                want = len(buf) if limit is None else max(0, min(len(buf), limit - position))
                got = self._read(f, want, buf) if want else 0
                assert isinstance(got, int)
                position += got
                n = got // RECORD_SIZE
                if n == 0:
                    tail = buf[:got].tobytes()
                    break
                slots = buf[: n * RECORD_SIZE].reshape(n, RECORD_SIZE)
                keep = scan.piece(slot, slots)
                kinds = slots[: len(keep), RECORD_SIZE - 1]
                is_meta = (kinds >= STRING) & (kinds <= STACK)
                if is_meta.any():
                    meta.piece(slots[: len(keep)][keep & is_meta].view(RECORD_DTYPE).reshape(-1))
                wanted = keep & ~is_meta
                if len(keep) == n and wanted.all():
                    events = slots.view(RECORD_DTYPE).reshape(-1)  # a view of the buffer: the common case
                else:  # select opaque 64-byte items (a memcpy each, as read_log does)
                    events = slots[: len(keep)].view(SLOT_ITEM).reshape(-1)[wanted].view(RECORD_DTYPE)
                if len(events):
                    meta.begins.update(_phase_labels(events))
                if len(events) and checker is not None:
                    bad = checker.piece(events)
                    checker.check_sum()  # first, as `impossible` checks it: no record is to blame for it
                    if bad.any() and self.check == "refuse":  # a replay of them would simulate a run that never was
                        raise TraceError(f"{self.path}: a damaged or hand-made log: {checker.notes()[0]}; replay "
                                         "refuses it (report and export drop such records)")
                    if bad.any():
                        events = events[~bad]
                if len(events):
                    truncated = truncated or bool(np.any(events["kind"] == TRUNCATED))
                    last_kind = int(events["kind"][-1])
                    yield emitted, events
                    emitted += len(events)
                slot += n
                if got % RECORD_SIZE:  # the end of the data: a partial record
                    tail = buf[n * RECORD_SIZE: got].tobytes()
                    break
                if got < want:
                    break
            # read_log compares the end offset with the whole file's size: reading stopped at the end offset
            # or at the file's end, so what was read stands for it, unless damage stopped the reading first
            if scan.stop is not None:
                position += self._rest(f, None if limit is None else limit - position)
        self._meta = None
        self._finish(scan, meta, slot, tail, position, emitted, truncated, last_kind)
        if checker is not None:
            self.dropped = checker.notes()

    def _rest(self, f: IO[bytes], limit: int | None) -> int:
        """How many bytes are left to read (at most `limit`, where reading would stop)."""
        if not self._compressed:
            here = f.tell()
            left = f.seek(0, os.SEEK_END) - here
            return left if limit is None else min(left, limit)
        n = 0
        while limit is None or n < limit:
            part = self._read(f, 1 << 20 if limit is None else min(1 << 20, limit - n))
            assert isinstance(part, bytes)
            if not part:
                break
            n += len(part)
        return n

    def _finish(self, scan: _Scan, meta: _Metadata, slots_read: int, tail: bytes, size: int, emitted: int,
                truncated: bool, last_kind: int) -> None:
        """What read_log adds to its Log after decoding, from a whole pass."""
        header, path = self.header, self.path
        notes: list[str] = []
        if not header.checksum_ok:
            notes.append(f"{path}: the header failed its checksum (bytes changed after it was written): its status, "
                         "end offset, pid or times may be wrong")
        if header.status != 0 and header.end_offset > size:
            notes.append(f"{path}: the file ends at byte offset {size}, but its header says the writer wrote "
                         f"{header.end_offset} bytes (copied or cut short?)")
        notes += [f"{path}: {n}" for n in scan.notes(slots_read, tail)]
        self.strings, self.frames, self.stacks = meta.resolve(notes, path)
        if header.status == STATUS_NO_SPACE:
            notes.append(f"{path}: the writer could not grow the file (disk full?); it stopped at byte offset "
                         f"{header.end_offset}")
        self.phase_names = {0: "default"}
        for phase, label in meta.begins:
            self.phase_names[phase] = self.strings.get(label, f"phase{phase}")
        self.truncated = truncated or header.status in STATUS_CUT_SHORT
        self.complete = bool(emitted) and last_kind == END
        self.damage = notes
        self.writer = writer_state(header, path, self.is_file)
        self.records_total = emitted
        self.passes += 1
