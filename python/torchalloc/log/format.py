"""The torchalloc log format (docs/LOG_FORMAT.md) as data: its sizes, its slots as numpy dtypes, its header,
its checksum, and the errors of a file that is not one.

Nothing here reads a file: log/files.py opens one, log/decode.py decodes its slots, log/reader.py and
log/chunks.py drive the decoding (a whole file at once, or in pieces).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple, Union

import numpy as np

from .._records import KIND_NAMES, LOG_MAGIC, STATUS_NAMES

MAGIC = LOG_MAGIC
VERSION = 3  # what the library writes; VERSIONS are what this decoder reads
VERSIONS = (1, 2, 3)
HEADER_SIZE = 128
RECORD_SIZE = 64
BYTE_ORDER_MARK = 0x01020304
CHECKSUMS_FROM = 2  # the first version whose slots (byte 62) and header (byte 60) carry a checksum

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
# A slot as one opaque item: selecting these copies 64 bytes each (a memcpy), where a selection of
# RECORD_DTYPE items is copied field by field (5x slower).
SLOT_ITEM = np.dtype((np.void, RECORD_SIZE))
# Metadata records, the same 64 bytes seen differently ("Metadata records").
# A string slot carries 46 bytes of text (from version 2: byte 62 is the checksum), 47 in version 1.
STRING_CHUNK = {1: 47, 2: 46, 3: 46}
STRING_DTYPES = {
    version: np.dtype({"names": ["id", "len", "chunk", "seq", "text"],
                       "formats": ["<u4", "<u2", "<u2", "<u8", ("u1", chunk)],
                       "offsets": [0, 4, 6, 8, 16], "itemsize": RECORD_SIZE})
    for version, chunk in STRING_CHUNK.items()
}
FRAME_DTYPE = np.dtype(
    {"names": ["id", "line", "seq", "file", "func"], "formats": ["<u4", "<u4", "<u8", "<u4", "<u4"],
     "offsets": [0, 4, 8, 16, 20], "itemsize": RECORD_SIZE}
)
STACK_CHUNK = 11  # frame ids per stack slot
STACK_DTYPE = np.dtype(
    {"names": ["id", "nframes", "chunk", "seq", "frames"],
     "formats": ["<u4", "<u2", "<u2", "<u8", ("<u4", STACK_CHUNK)],
     "offsets": [0, 4, 6, 8, 16], "itemsize": RECORD_SIZE}
)

HEADER_STRUCT = struct.Struct("<8sIIIIQQIiQIIQ16si")  # the first 92 bytes of the header

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


def kind_names(kinds: Union[np.ndarray, int]) -> Union[np.ndarray, str]:
    """Names of record kinds: an array of kind numbers gives an array of str."""
    if np.isscalar(kinds):
        return KIND_NAMES.get(int(kinds), f"kind{int(kinds)}")  # type: ignore[arg-type]
    return _KIND_NAME_TABLE[np.asarray(kinds, dtype=np.uint8)]


def xor_folded(rows: np.ndarray) -> np.ndarray:
    """Per row of bytes (a multiple of 8 wide), the XOR of all its bytes: 0 where a checksum holds."""
    x = np.bitwise_xor.reduce(np.ascontiguousarray(rows).view("<u8"), axis=1)
    x ^= x >> np.uint64(32)
    x ^= x >> np.uint64(16)
    x ^= x >> np.uint64(8)
    return (x & np.uint64(0xFF)).astype(np.uint8)


def empty_file(path: object) -> str:
    """What every tool says of a file with no bytes (its content, when compressed), whichever reads it."""
    return f"{path}: empty file (0 bytes): neither a torchalloc log nor a PyTorch snapshot"


def parse_header(path: str, data: np.ndarray) -> LogHeader:
    """The header at the start of `data` (bytes as uint8); LogFormatError where they are not a log's."""
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
     producer, world_size) = HEADER_STRUCT.unpack_from(head)
    if version not in VERSIONS:
        raise LogFormatError(
            f"{path}: torchalloc log format version {version}; this decoder reads versions "
            f"{', '.join(map(str, VERSIONS))} (use a torchalloc release that matches the writer)"
        )
    if bom != BYTE_ORDER_MARK:
        raise LogFormatError(f"{path}: byte-order mark {bom:#010x}, expected {BYTE_ORDER_MARK:#010x} (little-endian)")
    if record_size != RECORD_SIZE or header_size < HEADER_SIZE or header_size % 8:
        raise LogFormatError(f"{path}: record size {record_size} / header size {header_size} not understood")
    checksum_ok = version < CHECKSUMS_FROM or int(xor_folded(data[None, :HEADER_SIZE])[0]) == 0
    return LogHeader(version, header_size, record_size, realtime, monotonic, pid, rank, max_bytes, status,
                     end_offset, producer.rstrip(b"\0").decode("utf-8", "replace"), checksum_ok, max(world_size, 0))
