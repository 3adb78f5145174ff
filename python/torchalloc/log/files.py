"""A log's file: opened without ever blocking on a FIFO or device, inflated when compressed, read whole or its
header alone, and asked whether its writer still holds it.

``writer_state`` says what became of the writer (``Log.writer``, ``ChunkedLog.writer``): "closed", "stopped
early" (log_max, a full disk), and for a log that was never closed, "running" (a process still holds the
file's lock: it is being written) or "killed" (no one does: the writer died mid-run); "unknown" where that
cannot be asked (a compressed copy, bytes, a version-1 log).
"""
from __future__ import annotations

import os
from typing import IO, Union

import numpy as np

from .._compressed import (CompressedError, NotAFileError, file_kind, is_compressed, open_decompressed, open_file,
                           read_trimmed)
from .._records import STATUS_CLOSED, STATUS_OPEN
from .format import CHECKSUMS_FROM, HEADER_SIZE, RECORD_SIZE, LogFormatError, LogHeader, parse_header

# What became of a log's writer.
WRITER_CLOSED = "closed"
WRITER_STOPPED = "stopped early"  # log_max reached, disk full, address space used up
WRITER_RUNNING = "running"  # not closed, and a process holds the file's lock
WRITER_KILLED = "killed"  # not closed, and no process holds the lock
WRITER_UNKNOWN = "unknown"  # not closed, and no way to ask (a copy, bytes, a version-1 log)

_WHAT = "a torchalloc log"


def check_regular_file(path: str) -> None:
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


def load(source: Union[str, os.PathLike, bytes, bytearray, memoryview]) -> tuple[str, np.ndarray, bool, int]:
    """The log's name, its bytes, whether they are the file itself (not bytes, not decompressed), and its size.

    A compressed log is inflated a piece at a time and the zeros it ends with are not kept (issue 36: 300 KB
    of xz held a record and 2 GiB of zero slots), so the bytes may be shorter than the size: what is
    missing is zeros, which decode to nothing (past the last complete record, a zero slot is unused space).
    Kept are the header and the whole slot holding the last non-zero byte."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = np.frombuffer(source, dtype=np.uint8)
        return "<bytes>", data, False, len(data)
    path = os.fspath(source)
    check_regular_file(path)
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


def read_header(path: Union[str, os.PathLike]) -> LogHeader:
    """The header of the log at `path` alone (its rank, world size, pid, clocks): the first bytes of a plain
    log; a compressed one is decompressed, as read_log would."""
    name = os.fspath(path)
    check_regular_file(name)
    with open_log_file(name) as f:
        head = f.read(HEADER_SIZE)
    if is_compressed(head[:8]):  # only the header is inflated, not the log
        try:
            with open_log_file(name, compressed=True) as f:
                head = f.read(HEADER_SIZE)
        except CompressedError as e:
            raise LogFormatError(f"{name}: {e}") from None
    return parse_header(name, np.frombuffer(head, dtype=np.uint8))


def lock_held(path: str) -> bool | None:
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


def writer_state(header: LogHeader, path: str, is_file: bool) -> str:
    """WRITER_*: what became of the writer of the log at `path` (`is_file`: the file itself was read)."""
    if header.status == STATUS_CLOSED:
        return WRITER_CLOSED
    if header.status != STATUS_OPEN:
        return WRITER_STOPPED
    if not is_file or header.version < CHECKSUMS_FROM:  # version-1 writers took no lock
        return WRITER_UNKNOWN
    held = lock_held(path)
    return WRITER_UNKNOWN if held is None else WRITER_RUNNING if held else WRITER_KILLED
