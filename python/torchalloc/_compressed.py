"""Transparent decompression of gzip, xz and bz2 files (logs and traces are
often shipped compressed: the bundled ones are .xz)."""
from __future__ import annotations

import bz2
import gzip
import lzma
import zlib

_MAGICS = ((b"\x1f\x8b", gzip.decompress), (b"\xfd7zXZ\x00", lzma.decompress), (b"BZh", bz2.decompress))


def is_compressed(head: bytes) -> bool:
    """Whether `head` (the first bytes of a file) starts a gzip, xz or bz2 stream."""
    return any(head.startswith(magic) for magic, _ in _MAGICS)


def decompress(raw: bytes) -> bytes:
    """`raw` decompressed when it is gzip, xz or bz2, else `raw` itself.
    Raises ValueError naming the cause for a truncated or corrupt stream."""
    for magic, unpack in _MAGICS:
        if raw.startswith(magic):
            try:
                return unpack(raw)
            except (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError) as e:  # zlib.error: a corrupt gzip body
                raise ValueError(f"truncated or corrupt compressed file ({e})") from None
    return raw
