"""Decode torchalloc event logs (TORCHALLOC_CONF=log:PATH) into numpy.

    from torchalloc.log import read_log, to_csv
    log = read_log("run.talog")
    allocs = log.of_kind("alloc")            # numpy structured array
    print(allocs["size"].sum(), log.strings, log.stack(allocs[0]["stack"]))
    to_csv(log, "run.csv")

The format is documented in docs/LOG_FORMAT.md; this module needs only numpy
(no torch, no C library), so logs can be read anywhere. Every record is 64
bytes, so the whole file is one numpy array, given as one piece to the
decoder the tools feed in pieces (log/decode.py); only the few
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
import warnings
from dataclasses import dataclass, field
from typing import IO, Iterator, Mapping, Union

import numpy as np

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
# The decoder's, the file's and the format's public names, re-exported: this module is where a user of the
# decoder imports them from, as before they moved.
from .decode import DAMAGE_LISTED, Decoder  # noqa: F401
from .files import (  # noqa: F401
    WRITER_CLOSED,
    WRITER_KILLED,
    WRITER_RUNNING,
    WRITER_STOPPED,
    WRITER_UNKNOWN,
    load,
    open_log_file,
    read_header,
    writer_state,
)
from .format import (  # noqa: F401
    BYTE_ORDER_MARK,
    CHECKSUMS_FROM,
    HEADER_SIZE,
    MAGIC,
    RECORD_DTYPE,
    RECORD_SIZE,
    SLOT_ITEM,
    VERSION,
    VERSIONS,
    Frame,
    LogDamageWarning,
    LogFormatError,
    LogHeader,
    empty_file,
    kind_names,
    parse_header,
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
    "read_header",
    "kind_names",
    "to_csv",
    "to_jsonl",
]


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


def read_log(source: Union[str, os.PathLike, bytes, bytearray, memoryview], *, warn: bool = False) -> Log:
    """Decode a torchalloc log (a path, or its bytes).

    Raises LogFormatError when it is not a torchalloc log or of an unknown
    version. Damage (a cut or corrupted file) is decoded up to the damage,
    said in ``Log.damage`` (one line each) and, with ``warn``, also raised
    as LogDamageWarning.
    """
    path, data, is_file, size = load(source)
    header = parse_header(path, data)
    end = size
    if header.status != 0 and header.header_size <= header.end_offset < size:
        end = header.end_offset  # anything after the end the writer declared is not log data
    body = data[header.header_size:end]  # a compressed log's data may stop short of `end`: the rest is zeros
    n = len(body) // RECORD_SIZE
    decoder = Decoder(header, path)  # the whole log as one piece
    records = decoder.piece(body[: n * RECORD_SIZE].reshape(n, RECORD_SIZE))
    if isinstance(source, (bytes, bytearray, memoryview)) and (np.may_share_memory(records, data)
                                                               or not records.flags.writeable):
        records = records.view(SLOT_ITEM).copy().view(RECORD_DTYPE)  # the log's own: no view of the caller's bytes
    decoded = decoder.finish(body[n * RECORD_SIZE:].tobytes(), size)
    if warn:
        for message in decoded.damage:
            warnings.warn(message, LogDamageWarning, stacklevel=2)
    return Log(path, header, records, decoded.strings, decoded.frames, decoded.stacks, decoded.phase_names,
               decoded.truncated, decoded.complete, decoded.damage, writer_state(header, path, is_file))


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
