"""Read a torchalloc log in pieces: the records of a log of any size, in bounded memory.

    from torchalloc.log.chunks import ChunkedLog
    log = ChunkedLog("run.talog", chunk_records=1 << 20)
    for first, records in log.chunks():       # RECORD_DTYPE event records, in file order, piece by piece
        ...                                    # `first`: how many event records came before this piece
    log.strings, log.stacks, log.phase_names, log.damage, log.truncated, log.writer   # after a whole pass

`read_log` (log/reader.py) decodes a whole file at once; a log of 10^8 records is
6.4 GB, and its decoded arrays more. The report, replay and export read
every log with this instead: the same file `chunk_records` slots at a time
(plain reads into one buffer, so the file's pages never count against the
process) through the same decoder (log/decode.py), which gives what it gives
read_log: the same event records in the same order, the same strings,
frames, stacks and phase names, the same damage notes in the same order, the
same `truncated`, `complete` and `writer`. Each call of `chunks()` reads the
file again from the start (the analysis makes two passes); the metadata and
the notes are complete once one pass has ended.

A compressed log (gzip, xz, bz2) is decompressed as it is read; bytes are
read from memory.
"""
from __future__ import annotations

import lzma
import os
import zlib
from typing import IO, Callable, Iterator, Mapping, Union

import numpy as np

from .._compressed import CompressedError, is_compressed
from .._records import STACK, STRING
from .checks import Checker
from .decode import Decoded, Decoder, slot_states
from .files import WRITER_UNKNOWN, check_regular_file, open_log_file, writer_state
from .format import HEADER_SIZE, RECORD_DTYPE, RECORD_SIZE, Frame, LogFormatError, parse_header
from .strings import StringTable
from .trace_events import TraceError

__all__ = ["ChunkedLog", "DEFAULT_CHUNK_RECORDS"]

# 16 MiB of log per piece (larger pieces: more memory, no faster). Every tool reads every log this way; a log
# smaller than a piece is one piece.
DEFAULT_CHUNK_RECORDS = 1 << 18
_STREAM_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError)  # CompressedError is a ValueError


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
        self._decoder: Decoder | None = None  # the pass under way

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
        ok = slot_states(slots, first, self.header.version)[2] & ((kinds < STRING) | (kinds > STACK))
        if device is not None:
            ok &= (raw["device"] == device) | (raw["device"] < 0)
        hits = np.flatnonzero(ok)
        return int(raw["time_ns"][hits[-1]]) if hits.size else None

    def string_now(self, sid: int, default: str) -> str:
        """During a pass: string `sid` as far as the pass has read (as read_log resolves it); after it, `strings`."""
        if self._decoder is None:
            return self.strings.get(sid, default)
        return self._decoder.string_now(sid, default)

    def stack_now(self, sid: int) -> list[Frame]:
        """During a pass: stack `sid` as far as the pass has read; after it, `stacks`."""
        return self._decoder.stack_now(sid) if self._decoder is not None else self.stacks.get(sid, [])

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
        checker = Checker(header_size=header.header_size, path=self.path) if self.check != "none" else None
        decoder = Decoder(header, self.path, strings=known, screen=None if checker is None else self._screen(checker))
        self._decoder = decoder
        buf = np.empty(self.chunk_records * RECORD_SIZE, dtype=np.uint8)
        position, emitted = 0, 0
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
            while not decoder.stopped:
                want = len(buf) if limit is None else max(0, min(len(buf), limit - position))
                got = self._read(f, want, buf) if want else 0
                assert isinstance(got, int)
                position += got
                n = got // RECORD_SIZE
                if n == 0:
                    tail = buf[:got].tobytes()
                    break
                events = decoder.piece(buf[: n * RECORD_SIZE].reshape(n, RECORD_SIZE))
                if len(events):
                    yield emitted, events
                    emitted += len(events)
                if got % RECORD_SIZE:  # the end of the data: a partial record
                    tail = buf[n * RECORD_SIZE: got].tobytes()
                    break
                if got < want:
                    break
            # read_log compares the end offset with the whole file's size: reading stopped at the end offset
            # or at the file's end, so what was read stands for it, unless damage stopped the reading first
            if decoder.stopped:
                position += self._rest(f, None if limit is None else limit - position)
        self._decoder = None
        self._finish(decoder.finish(tail, position), emitted)
        if checker is not None:
            self.dropped = checker.notes()

    def _screen(self, checker: Checker) -> Callable[[np.ndarray], np.ndarray]:
        """The decoder's screen for this log's `check`: the mask of the records no writer produces, to drop; with
        "refuse", TraceError at the first."""
        def screen(events: np.ndarray) -> np.ndarray:
            bad = checker.piece(events)
            checker.check_sum()  # first, as `impossible` checks it: no record is to blame for it
            if bad.any() and self.check == "refuse":  # a replay of them would simulate a run that never was
                raise TraceError(f"{self.path}: a damaged or hand-made log: {checker.notes()[0]}; replay refuses it "
                                 "(report and export drop such records)")
            return bad
        return screen

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

    def _finish(self, decoded: Decoded, emitted: int) -> None:
        """A whole pass's end: what read_log gives in its Log beside the records."""
        self.strings, self.frames, self.stacks = decoded.strings, decoded.frames, decoded.stacks
        self.phase_names = decoded.phase_names
        self.truncated, self.complete = decoded.truncated, decoded.complete
        self.damage = decoded.damage
        self.writer = writer_state(self.header, self.path, self.is_file)
        self.records_total = emitted
        self.passes += 1
