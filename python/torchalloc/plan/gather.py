"""The run's trace gathered as the analysis reads the log, so that `torchalloc report` predicts from one reading.

`torchalloc plan` reads the log twice: once analysed, once as the trace
`torchalloc replay` replays (log.trace.load_trace). The report reads it
once: `TraceGather` is handed each piece of the device's records by
follow.BlockKinds (the analysis' second pass) and keeps what load_trace
would make of them, as far as plan uses it:

- the replay events: the device's allocs and frees, every phase begin and
  end, in order (trace_stream.to_events, as load_trace turns them);
- the blocks allocated before the log: a free that is the first event on
  its address (no alloc or free named it before) stands for one, allocated
  at the start with the free record's size, stream and phase, in the order
  of those frees -- as load_trace reconstructs its prelude;
- the recorded reserved curve: each segment record's bytes and how many
  events came before it, and the policies that mapped the segments.

What plan does not read of a trace (its live peaks, the frees of unknown
addresses, the notes) is not gathered: those fields keep their defaults.
python/tests/test_plan_report.py checks the trace against load_trace's on
logs with and without blocks from before the log.

The pass reads records with check="drop" (records no writer produces left
out, named in `log.dropped`); load_trace refuses such a log, and so does
`trace()`, in load_trace's words (counting such records in the whole log,
where load_trace stops at the first piece holding one). Past `limit`
events it gathers nothing more (the report predicts only up to that many).
"""
from __future__ import annotations

import numpy as np

from .. import _records as records
from ..log.trace import ALLOC, EVENT_DTYPE, FREE, MAX_REQUEST, Trace, TraceError
from ..log.trace_events import MAX_PHASES
from ..log.trace_stream import to_events

_EVENT_KINDS = (records.ALLOC, records.FREE, records.PHASE_BEGIN, records.PHASE_END)


class TraceGather:
    """The device's trace, piece by piece (module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.over = False  # more than `limit` events: nothing kept
        self.error = ""  # what load_trace would have refused the log for
        self._events: list[np.ndarray] = []
        self._free_sizes: list[np.ndarray] = []  # each free event's record size (the bytes its alloc asked)
        self._seg_pos: list[np.ndarray] = []
        self._seg_delta: list[np.ndarray] = []
        self._policies: set[int] = set()
        self._count = 0

    def piece(self, recs: np.ndarray, base: int) -> None:
        """One piece of the device's records (RECORD_DTYPE), its first at device-table index `base`."""
        if self.over or self.error:
            return
        if base + len(recs) > self.limit:
            self.over = True
            self._events, self._free_sizes, self._seg_pos, self._seg_delta = [], [], [], []
            return
        kind, dev = recs["kind"], recs["device"]
        blocks = ((kind == records.ALLOC) | (kind == records.FREE)) & (dev >= 0)
        sel = blocks | (kind == records.PHASE_BEGIN) | (kind == records.PHASE_END)
        rows = recs[sel]
        if (rows["phase"] >= MAX_PHASES).any():
            self.error = f"phase ids above {MAX_PHASES - 1}: not a log this version wrote"
            return
        events = to_events(rows)
        if (events["size"] > MAX_REQUEST).any():
            self.error = f"an allocation of more than {MAX_REQUEST} bytes: damaged log"
            return
        is_seg = ((kind == records.SEGMENT_ALLOC) | (kind == records.SEGMENT_FREE)) & (dev >= 0)
        if is_seg.any():
            before = self._count + np.cumsum(sel) - sel  # replay events before each record
            self._seg_pos.append(before[is_seg].astype(np.int64))
            self._seg_delta.append(np.where(kind[is_seg] == records.SEGMENT_ALLOC, 1, -1)
                                   * recs["size"][is_seg].astype(np.int64))
            self._policies.update(int(p) for p in np.unique(recs["policy"][is_seg]).tolist())
        self._events.append(events)
        self._free_sizes.append(rows["size"][events["kind"] == FREE].astype(np.int64))
        self._count += len(events)

    def trace(self, what: str, device: int, dropped: list[str], before_log: int | None = None) -> Trace:
        """The trace (module docstring); TraceError where load_trace refuses the log. `dropped`: the notes of the
        records the pass left out; `before_log`: how many blocks from before the log the analysis found (a free
        of an address not live), when known: with none, no free can be the first event on its address."""
        if dropped:
            raise TraceError(f"{what}: a damaged or hand-made log: {dropped[0]}; replay refuses it (report and "
                             "export drop such records)")
        if self.error:
            raise TraceError(f"{what}: {self.error}")
        body = np.concatenate(self._events) if self._events else np.zeros(0, dtype=EVENT_DTYPE)
        if not ((body["kind"] == ALLOC) | (body["kind"] == FREE)).any():
            raise TraceError(f"{what}: no allocations on device {device}")
        head = (_before_log(body, np.concatenate(self._free_sizes)) if before_log != 0
                else np.zeros(0, dtype=EVENT_DTYPE))
        events = np.zeros(len(head) + len(body), dtype=EVENT_DTYPE)
        events[:len(head)], events[len(head):] = head, body
        trace = Trace(events=events, source="torchalloc-log", path=what, device=device, prelude=len(head))
        if self._seg_pos:
            trace.native_pos = np.concatenate(self._seg_pos) + len(head)
            trace.native_delta = np.concatenate(self._seg_delta)
            trace.native_initial_reserved = 0
            trace.native_peak_reserved = max(0, int(np.cumsum(trace.native_delta).max()))
            names = ", ".join(records.POLICY_NAMES.get(p, f"policy {p}") for p in sorted(self._policies))
            trace.native_label = f"recorded ({names})"
        return trace


def _before_log(body: np.ndarray, free_sizes: np.ndarray) -> np.ndarray:
    """The allocs standing for the blocks from before the log (module docstring), in the order of their frees."""
    kind, addr = body["kind"], body["addr"]
    named = np.flatnonzero(((kind == ALLOC) & (body["size"] > 0)) | (kind == FREE))
    _, first = np.unique(addr[named], return_index=True)  # each address' first event
    first = np.sort(named[first])
    frees = first[kind[first] == FREE]
    free_rank = np.cumsum(kind == FREE) - 1  # each free event's place among the frees
    sizes = free_sizes[free_rank[frees]]
    keep = (sizes > 0) & (sizes <= MAX_REQUEST)
    frees, sizes = frees[keep], sizes[keep]
    head = np.zeros(len(frees), dtype=EVENT_DTYPE)
    head["kind"] = ALLOC
    head["addr"] = addr[frees]
    head["size"] = sizes.astype(np.uint64)
    head["stream"] = body["stream"][frees]
    head["phase"] = body["phase"][frees]
    return head
