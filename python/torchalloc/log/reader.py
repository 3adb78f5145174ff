"""Decode torchalloc event logs (TORCHALLOC_CONF=log:PATH) into numpy.

    from torchalloc.log import read_log, to_csv
    log = read_log("run.talog")
    allocs = log.of_kind("alloc")            # numpy structured array
    print(allocs["size"].sum(), log.strings, log.stack(allocs[0]["stack"]))
    to_csv(log, "run.csv")

The format is documented in docs/LOG_FORMAT.md; this module needs only numpy
(no torch, no C library), so logs can be read anywhere. Every record is 64
bytes, so the whole file is one ``np.frombuffer`` call; only the few
string/frame/stack records are assembled in Python.

A log cut short (the writer was killed, the file was copied while being
written, the disk filled) decodes up to the damage. In a version-2 log every
slot and the header carry a checksum: a record whose bytes changed (a
flipped bit on disk or in a copy) is dropped, never decoded as different
numbers. Whatever was skipped or dropped is said in ``Log.damage``, one line
each naming the byte offset: the tools print those lines as their own notes
(``read_log(..., warn=True)`` also raises them as ``LogDamageWarning``, for
callers that want Python's warnings). A file that is not a torchalloc log
raises ``LogFormatError``.

``Log.writer`` says what became of the writer: "closed", "stopped early"
(log_max, a full disk), and for a log that was never closed, "running"
(a process still holds the file's lock: it is being written) or "killed"
(no one does: the writer died mid-run); "unknown" where that cannot be
asked (a compressed copy, bytes, a version-1 log).
"""
from __future__ import annotations

import csv
import io
import json
import os
import struct
import warnings
from dataclasses import dataclass, field
from typing import IO, Iterator, Mapping, NamedTuple, Union

import numpy as np

from .._compressed import (CompressedError, NotAFileError, file_kind, is_compressed, open_decompressed, open_file,
                           read_trimmed)
# The record kinds, flags, statuses, policy and pool names: defined in _records
# (one source for the whole package), re-exported here for users of the decoder.
from .._records import (  # noqa: F401
    ALLOC,
    END,
    FRAME,
    FREE,
    FREE_DEFERRED,
    KIND_IDS,
    KIND_NAMES,
    LABELLED_KINDS,
    LOG_MAGIC,
    MARKER,
    MAX_KIND,
    METADATA_KINDS,
    OOM,
    PHASE_BEGIN,
    PHASE_END,
    POLICY_NAMES,
    POOL_NAMES,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    STACK,
    STATUS_CLOSED,
    STATUS_CUT_SHORT,
    STATUS_NAMES,
    STATUS_NO_SPACE,
    STATUS_OPEN,
    STRING,
    TRIM,
    TRIM_REASONS,
    TRUNCATED,
)
from .strings import StringTable

__all__ = [
    "MAGIC",
    "VERSION",
    "KIND_NAMES",
    "RECORD_DTYPE",
    "Frame",
    "Log",
    "LogHeader",
    "LogFormatError",
    "LogDamageWarning",
    "read_log",
    "read_header",
    "kind_names",
    "to_csv",
    "to_jsonl",
]

MAGIC = LOG_MAGIC
VERSION = 2  # what the library writes; VERSIONS are what this decoder reads
VERSIONS = (1, 2)
HEADER_SIZE = 128
RECORD_SIZE = 64
BYTE_ORDER_MARK = 0x01020304
CHECKSUMS_FROM = 2  # the first version whose slots (byte 62) and header (byte 60) carry a checksum
DAMAGE_LISTED = 5  # byte offsets named per kind of damage; the rest are counted

# What became of a log's writer (Log.writer).
WRITER_CLOSED = "closed"
WRITER_STOPPED = "stopped early"  # log_max reached, disk full, address space used up
WRITER_RUNNING = "running"  # not closed, and a process holds the file's lock
WRITER_KILLED = "killed"  # not closed, and no process holds the lock
WRITER_UNKNOWN = "unknown"  # not closed, and no way to ask (a copy, bytes, a version-1 log)


# Event records: docs/LOG_FORMAT.md, "Event records".
RECORD_DTYPE = np.dtype(
    {
        # Every byte is named: a masked selection copies only named fields. Byte
        # 62 is the checksum (version 2); version 1 left it 0 (and used it for
        # text in string slots).
        "names": ["time_ns", "seq", "addr", "size", "block_size", "stream", "tid", "stack", "phase", "device",
                  "policy", "pool", "flags", "checksum", "kind"],
        "formats": ["<u8", "<u8", "<u8", "<u8", "<u8", "<u8", "<u4", "<u4", "<u2", "i1", "u1", "u1", "u1", "u1",
                    "u1"],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 52, 56, 58, 59, 60, 61, 62, 63],
        "itemsize": RECORD_SIZE,
    }
)
# Metadata records, the same 64 bytes seen differently ("Metadata records").
# A string slot carries 46 bytes of text (version 2: byte 62 is the checksum), 47 in version 1.
_STRING_CHUNK = {1: 47, 2: 46}
_STRING_DTYPES = {
    version: np.dtype({"names": ["id", "len", "chunk", "seq", "text"],
                       "formats": ["<u4", "<u2", "<u2", "<u8", ("u1", chunk)],
                       "offsets": [0, 4, 6, 8, 16], "itemsize": RECORD_SIZE})
    for version, chunk in _STRING_CHUNK.items()
}
_FRAME_DTYPE = np.dtype(
    {"names": ["id", "line", "seq", "file", "func"], "formats": ["<u4", "<u4", "<u8", "<u4", "<u4"],
     "offsets": [0, 4, 8, 16, 20], "itemsize": RECORD_SIZE}
)
_STACK_DTYPE = np.dtype(
    {"names": ["id", "nframes", "chunk", "seq", "frames"], "formats": ["<u4", "<u2", "<u2", "<u8", ("<u4", 11)],
     "offsets": [0, 4, 6, 8, 16], "itemsize": RECORD_SIZE}
)
_STACK_CHUNK = 11

_HEADER = struct.Struct("<8sIIIIQQIiQIIQ16si")  # the first 92 bytes of the header

_KIND_NAME_TABLE = np.array([KIND_NAMES.get(k, f"kind{k}") for k in range(256)], dtype=object)


class LogFormatError(ValueError):
    """The file is not a torchalloc log, or one of a version this decoder cannot read."""


class LogDamageWarning(UserWarning):
    """The log is cut short or damaged; it was decoded up to the damage."""


class Frame(NamedTuple):
    """One Python frame of a captured stack."""

    filename: str
    line: int
    function: str


@dataclass(frozen=True)
class LogHeader:
    version: int
    header_size: int
    record_size: int
    created_realtime_ns: int   # CLOCK_REALTIME when the log was opened
    created_monotonic_ns: int  # CLOCK_MONOTONIC at the same moment (records' time base)
    pid: int
    rank: int                  # $RANK (else $LOCAL_RANK) of the writer, -1 when unset
    max_bytes: int             # log_max, 0 for none
    status: int                # STATUS_NAMES: open (or killed), closed, log_max reached, disk full, ...
    end_offset: int            # with status != 0: bytes of valid data
    producer: str
    checksum_ok: bool = True   # version 2: the header's bytes are as written (always True for version 1)
    world_size: int = 0        # $WORLD_SIZE of the writer; 0 when unset, or written before the field (reserved 0s)

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"status {self.status}")


@dataclass
class Log:
    """A decoded log. ``records`` holds the event records in file order
    (every kind except the string/frame/stack metadata, which is resolved
    into ``strings``, ``frames`` and ``stacks``)."""

    path: str
    header: LogHeader
    records: np.ndarray
    strings: Mapping[int, str] = field(default_factory=dict)  # a StringTable: decoded when looked up
    frames: dict[int, Frame] = field(default_factory=dict)
    stacks: dict[int, list[Frame]] = field(default_factory=dict)
    phase_names: dict[int, str] = field(default_factory=dict)
    truncated: bool = False  # the writer stopped early: log_max reached, disk full
    complete: bool = False   # closed cleanly: an END record is last
    damage: list[str] = field(default_factory=list)  # what was skipped or dropped, one line each
    writer: str = WRITER_UNKNOWN  # WRITER_*: closed, stopped early, running, killed, unknown

    @property
    def warnings(self) -> list[str]:
        """The damage notes under their old name (the same list)."""
        return self.damage

    def __len__(self) -> int:
        return len(self.records)

    def of_kind(self, *names: str) -> np.ndarray:
        """The records of the given kinds ("alloc", "free", ...)."""
        unknown = [n for n in names if n not in KIND_IDS]
        if unknown:
            raise ValueError(f"unknown record kind(s) {unknown}; known: {sorted(KIND_IDS)}")
        return self.records[np.isin(self.records["kind"], [KIND_IDS[n] for n in names])]

    def stack(self, stack_id: int) -> list[Frame]:
        """Frames of a stack id, innermost first ([] for 0 or an unknown id)."""
        return self.stacks.get(int(stack_id), [])

    def label(self, record: np.void) -> str:
        """The name of a phase_begin/phase_end record, the text of a marker; "" otherwise."""
        if int(record["kind"]) in LABELLED_KINDS:
            return self.strings.get(int(record["stack"]), "")
        return ""

    def wall_time_ns(self) -> np.ndarray:
        """Each record's time as nanoseconds since the Unix epoch.

        The header's two clocks are u64: their difference is added modulo 2**64, as the C side's arithmetic
        would, so a damaged header gives wrong times rather than an OverflowError."""
        offset = (self.header.created_realtime_ns - self.header.created_monotonic_ns) % (1 << 64)
        return (self.records["time_ns"].astype(np.uint64) + np.uint64(offset)).view(np.int64)


def kind_names(kinds: Union[np.ndarray, int]) -> Union[np.ndarray, str]:
    """Names of record kinds: an array of kind numbers gives an array of str."""
    if np.isscalar(kinds):
        return KIND_NAMES.get(int(kinds), f"kind{int(kinds)}")  # type: ignore[arg-type]
    return _KIND_NAME_TABLE[np.asarray(kinds, dtype=np.uint8)]


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


_WHAT = "a torchalloc log"


def _check_regular_file(path: str) -> None:
    """LogFormatError for a directory, FIFO or device: reading one fails or never ends."""
    kind = file_kind(os.stat(path).st_mode)  # FileNotFoundError and PermissionError go to the caller as they are
    if kind is not None:
        raise LogFormatError(f"{path}: is {kind}, not {_WHAT}")


def open_log_file(path: str, buffering: int = -1, compressed: bool = False) -> IO[bytes]:
    """The log file at `path` open for reading (inflated as read when `compressed`), never blocking on a FIFO or
    device put there since it was checked: LogFormatError for one (open_file checks the open descriptor)."""
    try:
        return open_decompressed(path, what=_WHAT) if compressed else open_file(path, buffering, what=_WHAT)
    except NotAFileError as e:
        raise LogFormatError(str(e)) from None


def _load(source: Union[str, os.PathLike, bytes, bytearray, memoryview]) -> tuple[str, np.ndarray, bool, int]:
    """The log's name, its bytes, whether they are the file itself (not bytes, not decompressed), and its size.

    A compressed log is inflated a piece at a time and the zeros it ends with are not kept (issue 36: 300 KB
    of xz held a record and 2 GiB of zero slots), so the bytes may be shorter than the size: what is
    missing is zeros, which decode to nothing (past the last complete record, a zero slot is unused space).
    Kept are the header and the whole slot holding the last non-zero byte."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = np.frombuffer(source, dtype=np.uint8)
        return "<bytes>", data, False, len(data)
    path = os.fspath(source)
    _check_regular_file(path)
    with open_log_file(path) as f:
        compressed = is_compressed(f.read(8))
        if not compressed:
            f.seek(0)
            data = np.fromfile(f, dtype=np.uint8)
            return str(path), data, True, len(data)
    try:
        with open_log_file(path, compressed=True) as f:
            kept, size = read_trimmed(f, keep_at_least=HEADER_SIZE, pad=RECORD_SIZE - 1)
    except CompressedError as e:
        raise LogFormatError(f"{path}: {e}") from None
    return str(path), np.frombuffer(kept, dtype=np.uint8), False, size


def _lock_held(path: str) -> bool | None:
    """Whether a process holds the log's lock (its writer, still running); None when that cannot be asked.

    The writer holds an exclusive flock while the log is open. A shared
    one taken here is dropped at once (closing the descriptor), so a new
    writer is never kept out for longer than this call.
    """
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def _writer_state(header: LogHeader, path: str, is_file: bool) -> str:
    if header.status == STATUS_CLOSED:
        return WRITER_CLOSED
    if header.status != STATUS_OPEN:
        return WRITER_STOPPED
    if not is_file or header.version < CHECKSUMS_FROM:  # version-1 writers took no lock
        return WRITER_UNKNOWN
    held = _lock_held(path)
    return WRITER_UNKNOWN if held is None else WRITER_RUNNING if held else WRITER_KILLED


def _xor_folded(rows: np.ndarray) -> np.ndarray:
    """Per row of bytes (a multiple of 8 wide), the XOR of all its bytes: 0 where a checksum holds."""
    x = np.bitwise_xor.reduce(np.ascontiguousarray(rows).view("<u8"), axis=1)
    x ^= x >> np.uint64(32)
    x ^= x >> np.uint64(16)
    x ^= x >> np.uint64(8)
    return (x & np.uint64(0xFF)).astype(np.uint8)


def empty_file(path: object) -> str:
    """What every tool says of a file with no bytes (its content, when compressed), whichever reads it."""
    return f"{path}: empty file (0 bytes): neither a torchalloc log nor a PyTorch snapshot"


def _parse_header(path: str, data: np.ndarray) -> LogHeader:
    head = data[:HEADER_SIZE].tobytes()
    if not head:
        raise LogFormatError(empty_file(path))
    if len(head) < len(MAGIC) or head[: len(MAGIC)] != MAGIC:
        raise LogFormatError(
            f"{path}: not a torchalloc log (it starts with {head[:8]!r}; a torchalloc log starts with {MAGIC!r})"
        )
    if len(head) < HEADER_SIZE:
        raise LogFormatError(f"{path}: the header is cut short ({len(head)} of {HEADER_SIZE} bytes)")
    (_, version, header_size, record_size, bom, realtime, monotonic, pid, rank, max_bytes, status, _, end_offset,
     producer, world_size) = _HEADER.unpack_from(head)
    if version not in VERSIONS:
        raise LogFormatError(
            f"{path}: torchalloc log format version {version}; this decoder reads versions "
            f"{', '.join(map(str, VERSIONS))} (use a torchalloc release that matches the writer)"
        )
    if bom != BYTE_ORDER_MARK:
        raise LogFormatError(f"{path}: byte-order mark {bom:#010x}, expected {BYTE_ORDER_MARK:#010x} (little-endian)")
    if record_size != RECORD_SIZE or header_size < HEADER_SIZE or header_size % 8:
        raise LogFormatError(f"{path}: record size {record_size} / header size {header_size} not understood")
    checksum_ok = version < CHECKSUMS_FROM or int(_xor_folded(data[None, :HEADER_SIZE])[0]) == 0
    return LogHeader(version, header_size, record_size, realtime, monotonic, pid, rank, max_bytes, status,
                     end_offset, producer.rstrip(b"\0").decode("utf-8", "replace"), checksum_ok, max(world_size, 0))


class _Damage:
    """Collects damage notes; each names a byte offset."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[str] = []

    def note(self, message: str) -> None:
        self.messages.append(f"{self.path}: {message}")


def _offsets(header: LogHeader, idx: np.ndarray) -> str:
    """The byte offsets of slots `idx`: the first few, then how many more."""
    shown = ", ".join(str(header.header_size + int(i) * RECORD_SIZE) for i in idx[:DAMAGE_LISTED])
    return shown + (f" and {idx.size - DAMAGE_LISTED} more" if idx.size > DAMAGE_LISTED else "")


def _scan(raw: np.ndarray, slots: np.ndarray, header: LogHeader, tail: bytes, damage: _Damage) -> np.ndarray:
    """Which slots to decode (a mask over the leading ones); notes every torn or damaged one.
    `slots` is the same bytes as `raw`, one row of 64 per slot."""
    n = len(raw)
    kinds = raw["kind"]
    zero = kinds == 0
    # Version 2: a slot whose bytes no longer XOR to zero was changed after it
    # was written. It is dropped alone; the records around it stand.
    if header.version >= CHECKSUMS_FROM:
        failed = ~zero & (_xor_folded(slots) != 0)
    else:
        failed = np.zeros(n, dtype=bool)
    candidate = ~zero & ~failed
    good = candidate & (kinds <= MAX_KIND) & (raw["seq"] == np.arange(n, dtype=np.uint64))

    def offset(i: int) -> int:
        return header.header_size + int(i) * RECORD_SIZE

    # A record that passes its checksum (or has none) but cannot be where it
    # is: the rest of the file is not to be trusted.
    bad = np.flatnonzero(candidate & ~good)
    stop = int(bad[0]) if bad.size else n
    if bad.size:
        what = f"kind {int(kinds[stop])}" if kinds[stop] > MAX_KIND else f"sequence number {int(raw['seq'][stop])}"
        damage.note(f"damaged record at byte offset {offset(stop)} ({what}, expected sequence number {stop}); "
                    f"decoded the {stop} slots before it")
    dropped = np.flatnonzero(failed[:stop])
    if dropped.size:
        damage.note(f"{dropped.size} record{'s' if dropped.size > 1 else ''} failed the checksum (bytes changed "
                    f"after they were written: a disk or copy error) and were dropped, at byte offset "
                    f"{_offsets(header, dropped)}")
    good_idx = np.flatnonzero(good[:stop])
    last = int(good_idx[-1]) + 1 if good_idx.size else 0
    # Slots never completed: a writer killed between reserving and finishing.
    # Past the last complete record, all-zero slots are just unused space.
    torn = np.flatnonzero(zero[:last])
    if stop > last:
        torn = np.concatenate([torn, last + np.flatnonzero(slots[last:stop].any(axis=1) & zero[last:stop])])
    for i in torn[:DAMAGE_LISTED]:
        damage.note(f"incomplete record at byte offset {offset(i)} (its writer stopped mid-record); skipped")
    if torn.size > DAMAGE_LISTED:
        damage.note(f"... and {torn.size - DAMAGE_LISTED} more incomplete records")
    if stop == n and any(tail):
        damage.note(f"the file ends inside a record at byte offset {offset(n)} ({len(tail)} of {RECORD_SIZE} bytes)")
    return good[:last]


def _strings(raw: np.ndarray, version: int, damage: _Damage) -> StringTable:
    table = StringTable(_STRING_CHUNK[version])
    table.add(raw[raw["kind"] == STRING].view(_STRING_DTYPES[version]))
    note = table.missing_note()
    if note:
        damage.note(note)
    return table


def _frames(raw: np.ndarray, strings: Mapping[int, str]) -> dict[int, Frame]:
    slots = raw[raw["kind"] == FRAME].view(_FRAME_DTYPE)
    return {
        fid: Frame(strings.get(f, "?"), line, strings.get(fn, "?"))
        for fid, line, f, fn in zip(slots["id"].tolist(), slots["line"].tolist(), slots["file"].tolist(),
                                    slots["func"].tolist())
    }


def _stacks(raw: np.ndarray, frames: dict[int, Frame]) -> dict[int, list[Frame]]:
    slots = raw[raw["kind"] == STACK].view(_STACK_DTYPE)
    ids: dict[int, list[int]] = {}
    for sid, nframes, chunk_frames in zip(slots["id"].tolist(), slots["nframes"].tolist(), slots["frames"].tolist()):
        got = ids.setdefault(sid, [])
        got.extend(chunk_frames[: nframes - len(got)])
    unknown = Frame("?", 0, "?")
    return {sid: [frames.get(f, unknown) for f in fids] for sid, fids in ids.items()}


def read_header(path: Union[str, os.PathLike]) -> LogHeader:
    """The header of the log at `path` alone (its rank, world size, pid, clocks): the first bytes of a plain
    log; a compressed one is decompressed, as read_log would."""
    name = os.fspath(path)
    _check_regular_file(name)
    with open_log_file(name) as f:
        head = f.read(HEADER_SIZE)
    if is_compressed(head[:8]):  # only the header is inflated, not the log
        try:
            with open_log_file(name, compressed=True) as f:
                head = f.read(HEADER_SIZE)
        except CompressedError as e:
            raise LogFormatError(f"{name}: {e}") from None
    return _parse_header(name, np.frombuffer(head, dtype=np.uint8))


def read_log(source: Union[str, os.PathLike, bytes, bytearray, memoryview], *, warn: bool = False) -> Log:
    """Decode a torchalloc log (a path, or its bytes).

    Raises LogFormatError when it is not a torchalloc log or of an unknown
    version. Damage (a cut or corrupted file) is decoded up to the damage,
    said in ``Log.damage`` (one line each) and, with ``warn``, also raised
    as LogDamageWarning.
    """
    path, data, is_file, size = _load(source)
    header = _parse_header(path, data)
    damage = _Damage(path)
    if not header.checksum_ok:
        damage.note("the header failed its checksum (bytes changed after it was written): its status, end offset, "
                    "pid or times may be wrong")
    if header.status != 0 and header.end_offset > size:
        damage.note(f"the file ends at byte offset {size}, but its header says the writer wrote "
                    f"{header.end_offset} bytes (copied or cut short?)")
    if header.status != 0 and header.header_size <= header.end_offset < size:
        size = header.end_offset  # anything after the end the writer declared is not log data
    body = data[header.header_size:size]  # a compressed log's data may stop short of `size`: the rest is zeros
    n = len(body) // RECORD_SIZE
    raw = np.frombuffer(body, dtype=RECORD_DTYPE, count=n)
    slots = body[: n * RECORD_SIZE].reshape(n, RECORD_SIZE)
    keep = _scan(raw, slots, header, body[n * RECORD_SIZE:].tobytes(), damage)
    last = len(keep)
    whole = bool(keep.all())
    raw = raw[:last] if whole else raw[:last][keep]
    kinds = raw["kind"]
    strings = _strings(raw, header.version, damage)
    frames = _frames(raw, strings)
    stacks = _stacks(raw, frames)
    # Select on opaque 64-byte items (a plain memcpy each), not the padded
    # structured dtype (numpy copies that field by field, 5x slower).
    events = (kinds < STRING) | (kinds > STACK)
    kept = slots[:last] if whole else slots[:last][keep]
    records = kept.view(np.dtype((np.void, RECORD_SIZE))).reshape(-1)[events].view(RECORD_DTYPE)
    truncated = bool(np.any(records["kind"] == TRUNCATED)) or header.status in STATUS_CUT_SHORT
    complete = bool(len(records)) and int(records["kind"][-1]) == END
    if header.status == STATUS_NO_SPACE:
        damage.note(f"the writer could not grow the file (disk full?); it stopped at byte offset {header.end_offset}")
    phase_names = {0: "default"}
    begins = records[records["kind"] == PHASE_BEGIN]
    for phase, label in set(zip(begins["phase"].tolist(), begins["stack"].tolist())):
        phase_names[phase] = strings.get(label, f"phase{phase}")
    if warn:
        for message in damage.messages:
            warnings.warn(message, LogDamageWarning, stacklevel=2)
    return Log(path, header, records, strings, frames, stacks, phase_names, truncated, complete, damage.messages,
               _writer_state(header, path, is_file))


# ---------------------------------------------------------------------------
# CSV / JSON lines
# ---------------------------------------------------------------------------

COLUMNS = ("seq", "time_ns", "kind", "device", "stream", "addr", "size", "block_size", "phase", "phase_name",
           "policy", "pool", "flags", "tid", "stack", "label", "location")


def _rows(log: Log) -> Iterator[tuple]:
    r = log.records
    kinds = kind_names(r["kind"]).tolist()
    labelled = np.isin(r["kind"], LABELLED_KINDS).tolist()
    columns = [r[name].tolist() for name in ("seq", "time_ns", "device", "stream", "addr", "size", "block_size",
                                              "phase", "policy", "pool", "flags", "tid", "stack")]
    for i, (seq, t, dev, stream, addr, size, block, phase, policy, pool, flags, tid, stack) in enumerate(zip(*columns)):
        is_label = labelled[i]
        label = log.strings.get(stack, "") if is_label else ""
        frames = [] if is_label else log.stacks.get(stack, [])
        location = f"{frames[0].filename}:{frames[0].line}:{frames[0].function}" if frames else ""
        about_memory = pool != 0  # blocks and segments; the policy field means nothing elsewhere
        yield (seq, t, kinds[i], dev, stream, addr, size, block, phase, log.phase_names.get(phase, ""),
               POLICY_NAMES.get(policy, policy) if about_memory else "", POOL_NAMES.get(pool, pool), flags, tid,
               0 if is_label else stack, label, location)


def _open_text(target: Union[str, os.PathLike, IO[str]]) -> tuple[IO[str], bool]:
    if isinstance(target, (str, os.PathLike)):
        return open(target, "w", newline="", encoding="utf-8"), True
    return target, False


def to_csv(log: Log, target: Union[str, os.PathLike, IO[str]]) -> None:
    """One row per event record; `location` is the innermost Python frame."""
    out, owned = _open_text(target)
    try:
        writer = csv.writer(out)
        writer.writerow(COLUMNS)
        writer.writerows(_rows(log))
    finally:
        if owned:
            out.close()


def to_jsonl(log: Log, target: Union[str, os.PathLike, IO[str]], *, frames: bool = True) -> None:
    """One JSON object per event record; with `frames`, alloc/free/oom records
    carry their whole stack as [[filename, line, function], ...]."""
    out, owned = _open_text(target)
    try:
        for row in _rows(log):
            obj = dict(zip(COLUMNS, row))
            if frames:
                stack = log.stacks.get(obj["stack"], [])
                obj["frames"] = [list(f) for f in stack]
            out.write(json.dumps(obj, separators=(",", ":")))
            out.write("\n")
    finally:
        if owned:
            out.close()


def to_text(log: Log) -> str:
    """A short human summary: counts per kind, the state, the damage notes."""
    buf = io.StringIO()
    buf.write(f"{log.path}: {len(log.records)} records, pid {log.header.pid}, {log.header.status_name}"
              f"{', truncated' if log.truncated else ''}, writer {log.writer}\n")
    names, counts = np.unique(log.records["kind"], return_counts=True)
    for k, c in zip(names.tolist(), counts.tolist()):
        buf.write(f"  {KIND_NAMES.get(k, k):>14} {c}\n")
    for note in log.damage:
        buf.write(f"  damage: {note}\n")
    return buf.getvalue()
