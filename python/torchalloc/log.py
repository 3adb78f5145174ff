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
written, the disk filled) decodes up to the damage: a ``LogDamageWarning``
names the byte offset and ``Log.warnings`` keeps the messages. A file that
is not a torchalloc log raises ``LogFormatError``.
"""
from __future__ import annotations

import csv
import io
import json
import os
import struct
import warnings
from dataclasses import dataclass, field
from typing import IO, Iterator, NamedTuple, Union

import numpy as np

from ._compressed import decompress, is_compressed
# The record kinds, flags, statuses, policy and pool names: defined in _records
# (one source for the whole package), re-exported here for users of the decoder.
from ._records import (  # noqa: F401
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
    STATUS_CUT_SHORT,
    STATUS_NAMES,
    STATUS_NO_SPACE,
    STRING,
    TRIM,
    TRIM_REASONS,
    TRUNCATED,
)

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
    "kind_names",
    "to_csv",
    "to_jsonl",
]

MAGIC = LOG_MAGIC
VERSION = 1
HEADER_SIZE = 128
RECORD_SIZE = 64
BYTE_ORDER_MARK = 0x01020304


# Event records: docs/LOG_FORMAT.md, "Event records".
RECORD_DTYPE = np.dtype(
    {
        # Every byte is named ("reserved" at 62): a masked selection copies only
        # named fields, and metadata slots reuse byte 62 for text.
        "names": ["time_ns", "seq", "addr", "size", "block_size", "stream", "tid", "stack", "phase", "device",
                  "policy", "pool", "flags", "reserved", "kind"],
        "formats": ["<u8", "<u8", "<u8", "<u8", "<u8", "<u8", "<u4", "<u4", "<u2", "i1", "u1", "u1", "u1", "u1",
                    "u1"],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 52, 56, 58, 59, 60, 61, 62, 63],
        "itemsize": RECORD_SIZE,
    }
)
# Metadata records, the same 64 bytes seen differently ("Metadata records").
_STRING_DTYPE = np.dtype(
    {"names": ["id", "len", "chunk", "seq", "text"], "formats": ["<u4", "<u2", "<u2", "<u8", ("u1", 47)],
     "offsets": [0, 4, 6, 8, 16], "itemsize": RECORD_SIZE}
)
_FRAME_DTYPE = np.dtype(
    {"names": ["id", "line", "seq", "file", "func"], "formats": ["<u4", "<u4", "<u8", "<u4", "<u4"],
     "offsets": [0, 4, 8, 16, 20], "itemsize": RECORD_SIZE}
)
_STACK_DTYPE = np.dtype(
    {"names": ["id", "nframes", "chunk", "seq", "frames"], "formats": ["<u4", "<u2", "<u2", "<u8", ("<u4", 11)],
     "offsets": [0, 4, 6, 8, 16], "itemsize": RECORD_SIZE}
)
_STRING_CHUNK, _STACK_CHUNK = 47, 11

_HEADER = struct.Struct("<8sIIIIQQIiQIIQ16s")  # the first 88 bytes of the header

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
    rank: int                  # $RANK of the writer, -1 when unset
    max_bytes: int             # log_max, 0 for none
    status: int                # STATUS_NAMES: open (or killed), closed, log_max reached, disk full, ...
    end_offset: int            # with status != 0: bytes of valid data
    producer: str

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
    strings: dict[int, str] = field(default_factory=dict)
    frames: dict[int, Frame] = field(default_factory=dict)
    stacks: dict[int, list[Frame]] = field(default_factory=dict)
    phase_names: dict[int, str] = field(default_factory=dict)
    truncated: bool = False  # the writer stopped early: log_max reached, disk full
    complete: bool = False   # closed cleanly: an END record is last
    warnings: list[str] = field(default_factory=list)

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
        """Each record's time as nanoseconds since the Unix epoch."""
        return self.records["time_ns"].astype(np.int64) + (
            self.header.created_realtime_ns - self.header.created_monotonic_ns
        )


def kind_names(kinds: Union[np.ndarray, int]) -> Union[np.ndarray, str]:
    """Names of record kinds: an array of kind numbers gives an array of str."""
    if np.isscalar(kinds):
        return KIND_NAMES.get(int(kinds), f"kind{int(kinds)}")  # type: ignore[arg-type]
    return _KIND_NAME_TABLE[np.asarray(kinds, dtype=np.uint8)]


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


def _load(source: Union[str, os.PathLike, bytes, bytearray, memoryview]) -> tuple[str, np.ndarray]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "<bytes>", np.frombuffer(source, dtype=np.uint8)
    path = os.fspath(source)
    with open(path, "rb") as f:
        compressed = is_compressed(f.read(8))
    if not compressed:
        return str(path), np.fromfile(path, dtype=np.uint8)
    with open(path, "rb") as f:
        try:
            data = decompress(f.read())
        except ValueError as e:
            raise LogFormatError(f"{path}: {e}") from None
    return str(path), np.frombuffer(data, dtype=np.uint8)


def _parse_header(path: str, data: np.ndarray) -> LogHeader:
    head = data[:HEADER_SIZE].tobytes()
    if len(head) < len(MAGIC) or head[: len(MAGIC)] != MAGIC:
        raise LogFormatError(
            f"{path}: not a torchalloc log (it starts with {head[:8]!r}; a torchalloc log starts with {MAGIC!r})"
        )
    if len(head) < HEADER_SIZE:
        raise LogFormatError(f"{path}: the header is cut short ({len(head)} of {HEADER_SIZE} bytes)")
    (_, version, header_size, record_size, bom, realtime, monotonic, pid, rank, max_bytes, status, _, end_offset,
     producer) = _HEADER.unpack_from(head)
    if version != VERSION:
        raise LogFormatError(
            f"{path}: torchalloc log format version {version}; this decoder reads version {VERSION} "
            "(use a torchalloc release that matches the writer)"
        )
    if bom != BYTE_ORDER_MARK:
        raise LogFormatError(f"{path}: byte-order mark {bom:#010x}, expected {BYTE_ORDER_MARK:#010x} (little-endian)")
    if record_size != RECORD_SIZE or header_size < HEADER_SIZE or header_size % 8:
        raise LogFormatError(f"{path}: record size {record_size} / header size {header_size} not understood")
    return LogHeader(version, header_size, record_size, realtime, monotonic, pid, rank, max_bytes, status,
                     end_offset, producer.rstrip(b"\0").decode("utf-8", "replace"))


class _Damage:
    """Collects warnings; each names a byte offset."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[str] = []

    def note(self, message: str) -> None:
        self.messages.append(f"{self.path}: {message}")


def _scan(raw: np.ndarray, slots: np.ndarray, header: LogHeader, tail: bytes, damage: _Damage) -> int:
    """Number of leading slots to decode; notes every torn or damaged one.
    `slots` is the same bytes as `raw`, one row of 64 per slot."""
    n = len(raw)
    kinds = raw["kind"]
    zero = kinds == 0
    good = ~zero & (kinds <= MAX_KIND) & (raw["seq"] == np.arange(n, dtype=np.uint64))

    def offset(i: int) -> int:
        return header.header_size + int(i) * RECORD_SIZE

    bad = np.flatnonzero(~good & ~zero)
    stop = int(bad[0]) if bad.size else n
    if bad.size:
        what = f"kind {int(kinds[stop])}" if kinds[stop] > MAX_KIND else f"sequence number {int(raw['seq'][stop])}"
        damage.note(f"damaged record at byte offset {offset(stop)} ({what}, expected sequence number {stop}); "
                    f"decoded the {stop} slots before it")
    good_idx = np.flatnonzero(good[:stop])
    last = int(good_idx[-1]) + 1 if good_idx.size else 0
    # Slots never completed: a writer killed between reserving and finishing.
    # Past the last complete record, all-zero slots are just unused space.
    torn = np.flatnonzero(zero[:last])
    if stop > last:
        torn = np.concatenate([torn, last + np.flatnonzero(slots[last:stop].any(axis=1))])
    for i in torn[:5]:
        damage.note(f"incomplete record at byte offset {offset(i)} (its writer stopped mid-record); skipped")
    if torn.size > 5:
        damage.note(f"... and {torn.size - 5} more incomplete records")
    if stop == n and any(tail):
        damage.note(f"the file ends inside a record at byte offset {offset(n)} ({len(tail)} of {RECORD_SIZE} bytes)")
    return last


def _strings(raw: np.ndarray, damage: _Damage) -> dict[int, str]:
    slots = raw[raw["kind"] == STRING].view(_STRING_DTYPE)
    parts: dict[int, list[tuple[int, bytes]]] = {}
    lengths: dict[int, int] = {}
    texts = slots["text"]
    for i, (sid, length, chunk) in enumerate(zip(slots["id"].tolist(), slots["len"].tolist(),
                                                  slots["chunk"].tolist())):
        parts.setdefault(sid, []).append((chunk, texts[i].tobytes()))
        lengths[sid] = length
    out: dict[int, str] = {}
    for sid, chunks in parts.items():
        chunks.sort()
        length = lengths[sid]
        if [c for c, _ in chunks] != list(range((length + _STRING_CHUNK - 1) // _STRING_CHUNK or 1)):
            damage.note(f"string {sid} is missing chunks; shown as far as it goes")
        out[sid] = b"".join(t for _, t in chunks)[:length].decode("utf-8", "replace")
    return out


def _frames(raw: np.ndarray, strings: dict[int, str]) -> dict[int, Frame]:
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


def read_log(source: Union[str, os.PathLike, bytes, bytearray, memoryview], *, warn: bool = True) -> Log:
    """Decode a torchalloc log (a path, or its bytes).

    Raises LogFormatError when it is not a torchalloc log or of an unknown
    version. Damage (a cut or corrupted file) is decoded up to the damage,
    reported in ``Log.warnings`` and, with ``warn``, as LogDamageWarning.
    """
    path, data = _load(source)
    header = _parse_header(path, data)
    damage = _Damage(path)
    size = len(data)
    if header.status != 0 and header.end_offset > size:
        damage.note(f"the file ends at byte offset {size}, but its header says the writer wrote "
                    f"{header.end_offset} bytes (copied or cut short?)")
    if header.status != 0 and header.header_size <= header.end_offset < size:
        size = header.end_offset  # anything after the end the writer declared is not log data
    body = data[header.header_size:size]
    n = len(body) // RECORD_SIZE
    raw = np.frombuffer(body, dtype=RECORD_DTYPE, count=n)
    slots = body[: n * RECORD_SIZE].reshape(n, RECORD_SIZE)
    last = _scan(raw, slots, header, body[n * RECORD_SIZE:].tobytes(), damage)
    raw = raw[:last]
    kinds = raw["kind"]
    strings = _strings(raw, damage)
    frames = _frames(raw, strings)
    stacks = _stacks(raw, frames)
    # Select on opaque 64-byte items (a plain memcpy each), not the padded
    # structured dtype (numpy copies that field by field, 5x slower).
    events = (kinds != 0) & ((kinds < STRING) | (kinds > STACK))
    records = slots[:last].view(np.dtype((np.void, RECORD_SIZE))).reshape(-1)[events].view(RECORD_DTYPE)
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
    return Log(path, header, records, strings, frames, stacks, phase_names, truncated, complete, damage.messages)


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
    """A short human summary: counts per kind, the state, the warnings."""
    buf = io.StringIO()
    buf.write(f"{log.path}: {len(log.records)} records, pid {log.header.pid}, {log.header.status_name}"
              f"{', truncated' if log.truncated else ''}\n")
    names, counts = np.unique(log.records["kind"], return_counts=True)
    for k, c in zip(names.tolist(), counts.tolist()):
        buf.write(f"  {KIND_NAMES.get(k, k):>14} {c}\n")
    for w in log.warnings:
        buf.write(f"  warning: {w}\n")
    return buf.getvalue()
