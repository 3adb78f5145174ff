"""Load an allocation trace into the event array `torchalloc replay` feeds to C.

    from torchalloc.log.trace import load_trace
    trace = load_trace("snapshot.pickle.xz")     # or a torchalloc log; recognised by content
    trace.events, trace.peak_requested, trace.notes

Two sources, each in its own module:

- a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``), a
  pickle, possibly gzip/xz/bz2-compressed, read with a restricted unpickler
  that refuses anything but builtin containers and scalars
  (trace_snapshot.py, which also says how a history that begins mid-run is
  completed);
- a torchalloc event log (docs/LOG_FORMAT.md), read in pieces whatever its
  size (trace_stream.py).

The result is a `Trace` (trace_events.py): a numpy structured array with the
layout of ``torchalloc_replay_event`` (include/torchalloc_replay.h), plus what the
trace says about itself (how PyTorch's own allocator reserved memory, for a
snapshot; frees of addresses it never saw allocated, and so on). This module
reads the file and picks the source; the names the package uses are
importable from here.
"""
from __future__ import annotations

import os
from pathlib import Path

from .. import _records as records
from .._compressed import CompressedError, NotAFileError, decompress, is_compressed, open_decompressed, open_file
from .trace_events import (  # noqa: F401  (the trace's vocabulary, imported from here across the package)
    ALLOC,
    EVENT_DTYPE,
    FREE,
    MAX_PHASES,
    MAX_REQUEST,
    PHASE_BEGIN,
    PHASE_END,
    Trace,
    TraceError,
    from_arrays,
    live_peaks,
)
from .trace_snapshot import (  # noqa: F401
    MalformedPickleError,
    from_snapshot,
    inflated_limit,
    load_snapshot,
    looks_like_pickle,
    looks_like_snapshot,
    safe_unpickle,
)
from .format import empty_file

__all__ = [
    "ALLOC", "FREE", "PHASE_BEGIN", "PHASE_END", "EVENT_DTYPE", "MAX_PHASES", "MAX_REQUEST",
    "Trace", "TraceError", "from_arrays", "from_snapshot", "live_peaks", "load_trace", "read_bytes",
    "safe_unpickle",
]


_WHAT = "a trace"
_HEAD = 16  # bytes enough to tell a log (its magic) and a snapshot's pickle (PROTO, FRAME, a dict)


def load_trace(path: str | os.PathLike[str], *, device: int | None = None, prelude: bool = True) -> Trace:
    """Load a PyTorch memory snapshot or a torchalloc log (recognised by content, not by name). A log is read in
    pieces (trace_stream.py); a long one's events stay in pieces too (`Trace.chunks`)."""
    p = Path(path)
    head = _read(p, _HEAD)
    if not head:
        raise TraceError(empty_file(p))
    compressed = is_compressed(head)
    if compressed:  # never inflated whole (issue 36: a small file can inflate to gigabytes)
        try:
            with open_decompressed(p, what=_WHAT) as f:
                head = f.read(_HEAD)
        except CompressedError as e:
            raise TraceError(f"{p}: {e}") from None
    if head.startswith(records.LOG_MAGIC):
        from .trace_stream import load_log

        return load_log(p, device=device, prelude=prelude, what=str(p))
    _check_pickle(head, p)
    try:
        if compressed:  # a snapshot is unpickled as it is inflated, so it takes what its objects take
            limit = inflated_limit(os.path.getsize(p))  # and what it inflates to is bounded by its size
            with open_decompressed(p, what=_WHAT) as f:  # read errors come as TraceError from the unpickler
                return load_snapshot(f, str(p), device=device, prelude=prelude, limit=limit)
        return load_snapshot(read_bytes(p), str(p), device=device, prelude=prelude)
    except MalformedPickleError as e:
        if looks_like_snapshot(head):
            raise
        # Text whose first letter is a pickle opcode ("Some notes"): it was never a snapshot.
        reason = str(e).removeprefix(f"{p}: ")
        raise TraceError(f"{p}: neither a torchalloc log nor a readable PyTorch memory snapshot (starts with "
                         f"{head[:8]!r}; read as a pickle: {reason})") from None


def _check_pickle(data: bytes, p: Path) -> None:
    """TraceError unless `data` (the content's first bytes) can start a pickle."""
    if not looks_like_pickle(data):
        raise TraceError(
            f"{p}: neither a PyTorch memory snapshot (a pickle, optionally .gz/.xz) nor a torchalloc log "
            f"(starts with {data[:8]!r})"
        )


def _read(p: Path, n: int | None = None) -> bytes:
    """The file's first `n` bytes (None: all of them), as they are on disk."""
    try:
        with open_file(p, what=_WHAT) as f:
            return f.read() if n is None else f.read(n)
    except FileNotFoundError:
        raise TraceError(f"{p}: no such file") from None
    except NotAFileError as e:  # a directory, or a FIFO or device whose reads would wait for ever
        raise TraceError(str(e)) from None
    except OSError as e:
        raise TraceError(f"{p}: cannot read ({e.strerror or e})") from None


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes, decompressed whole if it is gzip, xz or bz2 (load_trace reads a compressed file as a
    stream instead: a small file can inflate to gigabytes)."""
    p = Path(path)
    raw = _read(p)
    if not raw:
        raise TraceError(empty_file(p))
    try:
        return decompress(raw)
    except CompressedError as e:
        raise TraceError(f"{p}: {e}") from None
