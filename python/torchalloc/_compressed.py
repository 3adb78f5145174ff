"""Transparent decompression of gzip, xz and bz2 files (logs and traces are
often shipped compressed: the bundled ones are .xz).

A compressed file is always inflated as a stream, a piece at a time: a few
hundred kilobytes of xz can hold gigabytes of zeros (issue 36), so what a
reader keeps must be decided by what the stream holds, never by inflating it
whole first. `open_decompressed` gives the stream, `read_trimmed` its bytes
without the zeros it ends with.

Every input is opened by `open_file`, which takes regular files only: a
FIFO given as a log would block the open, then every read, for ever.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import zlib
from typing import IO, Any, BinaryIO, Callable, Union

# The most memory the xz decoder may take: a stream declares its dictionary, and the decoder reserves and fills
# it (3 GiB declared cost 2.19 GB and 16 s). xz's largest preset (-9) decodes in 65 MiB; four times that leaves
# room for custom dictionaries of real use and refuses the rest, saying why (XzMemoryError).
XZ_MEMLIMIT = 256 << 20


def _open_xz(raw: BinaryIO, mode: str) -> "_Unxz":
    return _Unxz(raw)


_OPENERS: tuple[tuple[bytes, Callable[..., Any]], ...] = (
    (b"\x1f\x8b", gzip.open), (b"\xfd7zXZ\x00", _open_xz), (b"BZh", bz2.open))
# What a decompressing reader raises on a truncated or corrupt stream (zlib.error: a corrupt gzip body).
_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError)
_PIECE = 1 << 20  # bytes inflated per read: the memory a pass over a compressed log holds at once
_ZEROS = bytes(_PIECE)

Source = Union[str, "os.PathLike[str]"]


class CompressedError(ValueError):
    """A truncated or corrupt compressed stream; the message says so and names the cause."""


class NotAFileError(ValueError):
    """The input is a directory, FIFO, device or socket, not a regular file; the message names which."""


_NOT_A_FILE = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str | None:
    """What a file of `mode` (st_mode) is when it is not a regular file ("a FIFO", ...), or None."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _NOT_A_FILE if test(mode)), "not a regular file")


def open_file(path: Source, buffering: int = -1, what: str = "a file") -> BinaryIO:
    """The regular file at `path`, open for reading; NotAFileError ("PATH: is a FIFO, not WHAT") otherwise.

    Opened without blocking (a FIFO's open waits for a writer, a device's may wait too) and checked on the
    open descriptor, so what is read is what was checked; reads then block as usual (a regular file's never
    wait). OSError (no such file, permission) goes to the caller as it is."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotAFileError(f"{os.fspath(path)}: is {kind}, not {what}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def is_compressed(head: bytes) -> bool:
    """Whether `head` (the first bytes of a file) starts a gzip, xz or bz2 stream."""
    return any(head.startswith(magic) for magic, _ in _OPENERS)


class _Unxz(io.RawIOBase):
    """xz streams (one or several, concatenated) inflated with the decoder's memory capped at XZ_MEMLIMIT:
    lzma.open takes no cap. Seeking back inflates again from the start, as lzma.open's file does."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._start()

    def _start(self) -> None:
        self._raw.seek(0)
        self._decoder = lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)
        self._position = 0

    def readable(self) -> bool:
        return True

    def _inflate(self, data: bytes, size: int) -> bytes:
        try:
            return self._decoder.decompress(data, size)
        except lzma.LZMAError as e:
            if "memory" in str(e).lower():  # liblzma's LZMA_MEMLIMIT_ERROR: said as what it means here
                raise CompressedError(
                    f"the xz stream needs more than {XZ_MEMLIMIT >> 20} MiB of memory to inflate (its dictionary "
                    "is larger than any xz preset makes; xz -9 needs 65 MiB): refusing it; if it is yours, "
                    "inflate it with `xz -d` first") from None
            raise

    def readinto(self, buffer: Any) -> int:
        want = len(buffer)
        while True:
            if self._decoder.eof:  # a stream ended: another may follow; anything else is trailing garbage
                rest = self._decoder.unused_data or self._raw.read(_PIECE)
                if not rest:
                    return 0
                self._decoder = lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)
                try:
                    data = self._inflate(rest, want)
                except lzma.LZMAError:
                    return 0  # not a stream: ignored, as lzma.open ignores it
            elif self._decoder.needs_input:
                piece = self._raw.read(_PIECE)
                if not piece:
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                data = self._inflate(piece, want)
            else:
                data = self._inflate(b"", want)
            if data:
                buffer[: len(data)] = data
                self._position += len(data)
                return len(data)

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self._position
        elif whence == os.SEEK_END:
            while self.read(_PIECE):
                pass
            offset += self._position
        if offset < self._position:
            self._start()
        while self._position < offset and self.read(min(_PIECE, offset - self._position)):
            pass
        return self._position

    def close(self) -> None:
        super().close()  # the file under it is closed by its owner (_Inflating)


class _Inflating(io.RawIOBase):
    """A decompressing reader whose every failure is a CompressedError, so callers catch one exception.
    Closing it closes `owned` too (the file under the decompressor, which does not close what it was given)."""

    def __init__(self, inner: IO[bytes], owned: IO[bytes] | None = None) -> None:
        self._inner = inner
        self._owned = owned

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._inner.readinto(buffer)  # type: ignore[attr-defined, no-any-return]
        except CompressedError:
            raise
        except _ERRORS as e:
            raise CompressedError(f"truncated or corrupt compressed file ({e})") from None

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Seeking back inflates again from the start (a pickle is checked in one pass, then unpickled)."""
        try:
            return self._inner.seek(offset, whence)
        except CompressedError:
            raise
        except _ERRORS as e:
            raise CompressedError(f"truncated or corrupt compressed file ({e})") from None

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
            if self._owned is not None:
                self._owned.close()
        super().close()


def _inflating(raw: BinaryIO, owned: bool) -> BinaryIO | None:
    """`raw` (positioned at its start) decompressed as read, or None when it is not gzip, xz or bz2.
    `owned`: the stream closes `raw` when it is closed."""
    head = raw.read(8)
    raw.seek(0)
    for magic, opener in _OPENERS:
        if head.startswith(magic):
            inflating = _Inflating(opener(raw, "rb"), raw if owned else None)
            # Buffered: the unpickler reads lines and single bytes, and peeks.
            return io.BufferedReader(inflating, _PIECE)  # type: ignore[return-value]
    return None


def open_decompressed(path: Source, what: str = "a file") -> BinaryIO:
    """The file at `path` as a stream of its content: decompressed as it is read when it is gzip, xz or
    bz2 (reads then raise CompressedError for a truncated or corrupt stream), the file itself otherwise.
    NotAFileError for a FIFO, device or directory (open_file)."""
    raw = open_file(path, what=what)
    try:
        inflating = _inflating(raw, owned=True)
    except BaseException:
        raw.close()
        raise
    return raw if inflating is None else inflating


def decompress(raw: bytes) -> bytes:
    """`raw` decompressed when it is gzip, xz or bz2, else `raw` itself.
    Raises CompressedError (a ValueError) naming the cause for a truncated or corrupt stream."""
    stream = _inflating(io.BytesIO(raw), owned=False)
    if stream is None:
        return raw
    with stream:
        return stream.read()


def read_trimmed(stream: BinaryIO, keep_at_least: int = 0, pad: int = 0) -> tuple[bytearray, int]:
    """The stream's bytes without the run of zero bytes it ends with, and its whole size.

    Inflated a piece at a time; a run of zeros is held only as a count until a non-zero byte follows it,
    so zeros at the end never take memory. At least `keep_at_least` bytes (a header to parse) are kept,
    and `pad` zeros after the last non-zero byte (so that the record holding it is whole), as far as the
    stream goes."""
    out = bytearray()  # grown in place: no second copy of the content at the end
    zeros = 0  # zero bytes after `out`, not (yet) kept
    while True:
        piece = stream.read(_PIECE)
        if not piece:
            break
        # An all-zero piece (the common case in a zero run) is told by one memcmp: rstrip scans bytewise.
        body = b"" if piece == _ZEROS[:len(piece)] else piece.rstrip(b"\0")
        if body:
            out += bytes(zeros)  # zeros with data after them are part of the content
            out += body
            zeros = 0
        zeros += len(piece) - len(body)
    total = len(out) + zeros
    out += bytes(min(zeros, max(pad, keep_at_least - len(out))))
    return out, total
