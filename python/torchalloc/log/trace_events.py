"""The replay event array and the `Trace` around it: what every trace source produces.

Takes nothing from outside the package; gives `EVENT_DTYPE` (the numpy
layout of ``torchalloc_replay_event``, include/torchalloc_replay.h), the event
kinds, `Trace` (the events plus what the trace says about itself: PyTorch's
own reserved curve, frees of addresses it never saw allocated, notes),
`TraceError`, the live-byte peaks of an event array, and `from_arrays` for
traces built by hand (tests, benchmarks).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import _lib

# Mirrors torchalloc_replay_event field for field, naturally aligned; its size is the C ABI's
# (_lib checks the library's against it before the first replay).
EVENT_DTYPE = np.dtype(
    {
        "names": ["addr", "size", "stream", "phase", "kind"],
        "formats": ["<u8", "<u8", "<u8", "<u2", "u1"],
        "offsets": [0, 8, 16, 24, 26],
        "itemsize": _lib.REPLAY_EVENT_SIZE,
    }
)
# The kinds of replay events (TORCHALLOC_REPLAY_*).
ALLOC, FREE = _lib.REPLAY_ALLOC, _lib.REPLAY_FREE
PHASE_BEGIN, PHASE_END = _lib.REPLAY_PHASE_BEGIN, _lib.REPLAY_PHASE_END
MAX_PHASES = _lib.MAX_PHASES
MAX_REQUEST = (1 << 40) - (2 << 20)  # larger requests are malformed (replay.c refuses them too)


class TraceError(ValueError):
    """The trace cannot be read: missing, truncated, malformed, or refused as unsafe."""


@dataclasses.dataclass
class Trace:
    """An allocation trace ready to replay."""

    events: np.ndarray  # EVENT_DTYPE
    source: str  # "pytorch-snapshot" | "torchalloc-log" | "synthetic"
    path: str = ""
    device: int = 0
    peak_requested: int = 0  # peak of the bytes live in the trace, as requested
    peak_rounded: int = 0  # the same with every size rounded up to 512 B: no policy can need less
    unknown_frees: int = 0  # frees of addresses the trace never saw allocated
    replaced_allocs: int = 0  # allocations of an address that was still live in the trace
    prelude: int = 0  # allocations reconstructed at the start (allocated before the trace began)
    phase_names: dict[int, str] = dataclasses.field(default_factory=dict)
    # PyTorch's own reserved bytes (snapshot with segment events), else None.
    native_peak_reserved: int | None = None
    native_initial_reserved: int | None = None
    # native_pos[i]: replay events before the i-th segment event; native_delta[i]: its bytes (+/-).
    native_pos: np.ndarray | None = None
    native_delta: np.ndarray | None = None
    native_ooms: int = 0
    # the first row of `replay`: who recorded the trace -- "recorded (PyTorch)" for PyTorch's snapshot,
    # "recorded (torchalloc, exported)" for one `torchalloc export` wrote, "recorded (<policy>)" for a log
    native_label: str = "recorded (PyTorch)"
    notes: list[str] = dataclasses.field(default_factory=list)
    rank: int = -1  # a torchalloc log's writer's $RANK (the log header's); -1: none, or a snapshot
    # A trace too large for memory: its events in pieces (trace_stream.SpilledEvents); `events` is then empty.
    chunks: Any = None
    # The number of events of a trace whose events were let go once replayed (summary()); None: it has them.
    replayed_events: int | None = None

    def __len__(self) -> int:
        if self.replayed_events is not None:
            return self.replayed_events
        return len(self.chunks) if self.chunks is not None else int(self.events.shape[0])

    def summary(self) -> "Trace":
        """This trace without its events, for a report printed after its replay: a job's ranks are replayed one
        at a time, and only what their tables print is kept of each."""
        return dataclasses.replace(self, events=self.events[:0].copy(), native_pos=None, native_delta=None,
                                   chunks=None, replayed_events=len(self))

    def has_allocs(self) -> bool:
        """Whether any event is an allocation."""
        if self.chunks is not None:
            return bool(self.chunks.allocs)
        return bool((self.events["kind"] == ALLOC).any())

    def native_reserved_series(self, buckets: int) -> np.ndarray | None:
        """PyTorch's reserved bytes, highest per bucket of events (as torchalloc_replay's series)."""
        if self.native_pos is None or self.native_delta is None or self.native_initial_reserved is None:
            return None
        n = len(self)
        if n == 0 or buckets <= 0:
            return None
        after = self.native_initial_reserved + np.cumsum(self.native_delta, dtype=np.int64)
        # Reserved in force after each replay event k: the sum of the deltas with pos <= k.
        idx = np.searchsorted(self.native_pos, np.arange(n), side="right")
        level = np.concatenate(([self.native_initial_reserved], after))[idx]
        # A segment that was reserved and released between two replay events
        # still counts toward that bucket's high: fold each delta's level in.
        edges = -(-np.arange(buckets + 1, dtype=np.int64) * n // buckets)  # ceil(b * n / buckets)
        bucket_of_event = np.searchsorted(edges, np.arange(n), side="right") - 1
        out = np.full(buckets, -1, dtype=np.int64)
        np.maximum.at(out, bucket_of_event, level)
        if len(after):
            pos = np.minimum(self.native_pos, n - 1)
            np.maximum.at(out, np.searchsorted(edges, pos, side="right") - 1, after)
        empty = out < 0
        if empty.any():  # buckets with no event (more buckets than events): the level in force
            out[empty] = level[np.minimum(edges[:-1][empty], n - 1)]
        return out


def live_peaks(events: np.ndarray) -> tuple[int, int]:
    """Peak bytes live in the trace: as requested, and with every size rounded up to 512 B."""
    size = events["size"].astype(np.int64)
    requested = int(np.cumsum(_live_deltas(events, size), dtype=np.int64).max(initial=0))
    rounded_sizes = np.maximum((size + 511) // 512 * 512, 512)
    rounded = int(np.cumsum(_live_deltas(events, rounded_sizes), dtype=np.int64).max(initial=0))
    return requested, rounded


def _live_deltas(events: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Change of live bytes at each event: +amount at an alloc, -amount of its alloc at a free.

    Matches replay.c: a free of an address that is not live changes nothing;
    an alloc of an address still live frees the old block first; a size-0
    alloc is no allocation. Vectorised: sort the events by (address, index);
    an event's predecessor in that order is the previous event on its address.
    """
    kind = events["kind"]
    out = np.zeros(len(events), dtype=np.int64)
    is_alloc = (kind == ALLOC) & (events["size"] > 0)
    out[is_alloc] = amount[is_alloc]
    rel = np.flatnonzero(is_alloc | (kind == FREE))
    if len(rel) < 2:
        return out
    addr = events["addr"][rel]
    order = rel[np.lexsort((rel, addr))]
    prev = order[:-1]
    cur = order[1:]
    closes = (events["addr"][cur] == events["addr"][prev]) & is_alloc[prev]  # prev is the live alloc
    out[cur[closes]] -= amount[prev[closes]]
    return out


def from_arrays(
    kind: Any,
    addr: Any,
    size: Any,
    stream: Any = 0,
    phase: Any = 0,
    *,
    source: str = "synthetic",
) -> Trace:
    """A trace from parallel arrays (tests, benchmarks, other tools)."""
    kinds = np.asarray(kind, dtype=np.uint8)
    n = len(kinds)
    events = np.zeros(n, dtype=EVENT_DTYPE)
    events["kind"] = kinds
    events["addr"] = np.asarray(addr, dtype=np.uint64)
    events["size"] = np.asarray(size, dtype=np.uint64)
    events["stream"] = np.broadcast_to(np.asarray(stream, dtype=np.uint64), (n,))
    events["phase"] = np.broadcast_to(np.asarray(phase, dtype=np.uint16), (n,))
    bad = ~np.isin(kinds, (ALLOC, FREE, PHASE_BEGIN, PHASE_END))
    if bad.any():
        raise TraceError(f"event {int(np.flatnonzero(bad)[0])}: unknown kind {int(kinds[bad][0])}")
    if (events["phase"] >= MAX_PHASES).any():
        raise TraceError(f"phase ids must be below {MAX_PHASES}")
    peak_req, peak_rounded = live_peaks(events)
    return Trace(events=events, source=source, peak_requested=peak_req, peak_rounded=peak_rounded)
