"""A torchalloc event log as a `Trace`: one device's allocs and frees, the phases, the recorded reserved curve.

Takes a decoded log (`torchalloc.log.read_log`) or a log's bytes; gives a
`Trace` (trace_events.py), vectorised over the records. A log opened
mid-run frees blocks it never saw allocated: with ``prelude=True`` those
are reconstructed as allocations at the start, from the free records' sizes.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import _records as records
from ..printable import printable
from .checks import impossible
from .reader import LogFormatError, read_log
from .trace_events import (
    ALLOC,
    EVENT_DTYPE,
    FREE,
    MAX_PHASES,
    MAX_REQUEST,
    PHASE_BEGIN,
    PHASE_END,
    Trace,
    TraceError,
    live_peaks,
)


def load_log(data: bytes | str | os.PathLike[str], what: str, *, device: int | None, prelude: bool) -> Trace:
    """The trace in a log's bytes (or the log at a path); `what` (its path) names it in errors, warnings and the
    trace."""
    try:
        decoded = read_log(data, warn=False)
    except LogFormatError as e:
        raise TraceError(str(e).replace("<bytes>", what)) from None
    decoded.path = what
    decoded.damage[:] = [w.replace("<bytes>", what) for w in decoded.damage]
    return from_log(decoded, device=device, prelude=prelude, path=what)


# Log record kind -> replay event kind; 0: not an event.
_LOG_TO_EVENT = np.zeros(256, dtype=np.uint8)
_LOG_TO_EVENT[[records.ALLOC, records.FREE, records.PHASE_BEGIN, records.PHASE_END]] = [ALLOC, FREE, PHASE_BEGIN,
                                                                                      PHASE_END]


def from_log(log: Any, *, device: int | None = None, prelude: bool = True, path: str = "") -> Trace:
    """The trace in a decoded torchalloc log (`torchalloc.log.read_log`), vectorised.

    alloc/free records of one device become events with their stream and
    phase; phase_begin/phase_end records (process-wide) become phase events,
    so phase_arena sees the phases the run had. segment_alloc/segment_free
    give the reserved curve of the policy that recorded the run (reported
    beside the replayed ones as "recorded"). A log opened mid-run frees
    blocks it never saw allocated: with `prelude`, those are reconstructed
    as allocations at the start, from the free records' sizes.
    """
    what = path or getattr(log, "path", "") or "log"
    r = log.records
    bad, problems = impossible(r, header_size=getattr(getattr(log, "header", None), "header_size", 128), path=what)
    if bad.any():  # a replay of impossible records would simulate a run that never was
        raise TraceError(f"{what}: a damaged or hand-made log: {problems[0]}; replay refuses it "
                         "(report and export drop such records)")
    kind = r["kind"]
    dev_of = r["device"]
    is_block = (kind == records.ALLOC) | (kind == records.FREE)
    if device is None:
        devices, counts = np.unique(dev_of[is_block], return_counts=True)
        device = int(devices[np.argmax(counts)]) if len(devices) else 0
    elif not (dev_of[is_block] == device).any():
        raise TraceError(f"{what}: no allocations on device {device}")
    on_dev = dev_of == device
    sel = (is_block & on_dev) | (kind == records.PHASE_BEGIN) | (kind == records.PHASE_END)
    picked = r[sel]
    if (picked["phase"] >= MAX_PHASES).any():
        raise TraceError(f"{what}: phase ids above {MAX_PHASES - 1}: not a log this version wrote")
    events = np.zeros(len(picked), dtype=EVENT_DTYPE)
    events["kind"] = _LOG_TO_EVENT[picked["kind"]]
    events["addr"] = np.where(events["kind"] <= FREE, picked["addr"], 0)
    events["size"] = np.where(events["kind"] == ALLOC, picked["size"], 0)
    events["stream"] = picked["stream"]
    events["phase"] = picked["phase"]
    if (events["size"] > MAX_REQUEST).any():
        raise TraceError(f"{what}: an allocation of more than {MAX_REQUEST} bytes: damaged log")

    # Frees of addresses the log never saw before: allocated before it was opened.
    first_free = _first_event_is_free(events)
    unknown = int(_unknown_frees(events))
    notes = list(getattr(log, "damage", getattr(log, "warnings", [])))
    n_pre = 0
    if prelude and first_free.any():
        free_sizes = picked["size"][first_free]
        keep = (free_sizes > 0) & (free_sizes <= MAX_REQUEST)
        pre = np.zeros(int(keep.sum()), dtype=EVENT_DTYPE)
        pre["kind"] = ALLOC
        pre["addr"] = events["addr"][first_free][keep]
        pre["size"] = free_sizes[keep]
        pre["stream"] = events["stream"][first_free][keep]
        pre["phase"] = events["phase"][first_free][keep]
        n_pre = len(pre)
        # Into an array of EVENT_DTYPE itself: np.concatenate of structured arrays (numpy >= 2) returns
        # a packed dtype without the padding the C struct has, which replay must refuse.
        joined = np.zeros(n_pre + len(events), dtype=EVENT_DTYPE)
        joined[:n_pre] = pre
        joined[n_pre:] = events
        events = joined
    if unknown:
        notes.append(f"{unknown} frees of addresses the log never saw allocated: it was opened mid-run")
    if n_pre:
        notes.append(f"{n_pre} allocations made before the log was opened were reconstructed at its start")
    if getattr(log, "truncated", False):
        notes.append("the log was cut short by its writer (log_max or a full disk): the trace ends early")
    peak_req, peak_rounded = live_peaks(events)
    trace = Trace(
        events=events,
        source="torchalloc-log",
        path=what,
        device=device,
        peak_requested=peak_req,
        peak_rounded=peak_rounded,
        unknown_frees=unknown,
        replaced_allocs=int(_replaced_allocs(events)),
        prelude=n_pre,
        phase_names={k: printable(v) for k, v in getattr(log, "phase_names", {}).items()},
        native_ooms=int(((kind == records.OOM) & on_dev).sum()),
        notes=notes,
        rank=int(getattr(getattr(log, "header", None), "rank", -1)),
    )
    # What the recording policy reserved: its segment records on this device.
    is_seg = ((kind == records.SEGMENT_ALLOC) | (kind == records.SEGMENT_FREE)) & on_dev
    if is_seg.any():
        before = np.cumsum(sel) - sel  # replay events before each record
        trace.native_pos = before[is_seg].astype(np.int64) + n_pre
        trace.native_delta = np.where(kind[is_seg] == records.SEGMENT_ALLOC, 1, -1) * r["size"][is_seg].astype(np.int64)
        trace.native_initial_reserved = 0
        trace.native_peak_reserved = max(0, int(np.cumsum(trace.native_delta).max()))
        policies = sorted({int(p) for p in r["policy"][is_seg]})
        names = ", ".join(records.POLICY_NAMES.get(p, f"policy {p}") for p in policies)
        trace.native_label = f"recorded ({names})"
        if unknown:
            trace.notes.append("the recorded reserved curve starts from 0 at the log's opening")
    return trace



def _address_order(events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the allocs (size > 0) and frees sorted by (address, index), and whether each
    follows an event on the same address."""
    kind = events["kind"]
    rel = np.flatnonzero(((kind == ALLOC) & (events["size"] > 0)) | (kind == FREE))
    order = rel[np.lexsort((rel, events["addr"][rel]))]
    same = np.zeros(len(order), dtype=bool)
    same[1:] = events["addr"][order[1:]] == events["addr"][order[:-1]]
    return order, same


def _first_event_is_free(events: np.ndarray) -> np.ndarray:
    """Mask over events: frees that are the first event on their address."""
    order, same = _address_order(events)
    out = np.zeros(len(events), dtype=bool)
    out[order[~same & (events["kind"][order] == FREE)]] = True
    return out


def _unknown_frees(events: np.ndarray) -> int:
    """Frees whose address is not live (as replay.c counts them)."""
    order, same = _address_order(events)
    if len(order) == 0:
        return 0
    kind = events["kind"][order]
    prev_alloc = np.zeros(len(order), dtype=bool)
    prev_alloc[1:] = same[1:] & (kind[:-1] == ALLOC)
    return int(((kind == FREE) & ~prev_alloc).sum())


def _replaced_allocs(events: np.ndarray) -> int:
    order, same = _address_order(events)
    if len(order) == 0:
        return 0
    kind = events["kind"][order]
    return int((same[1:] & (kind[1:] == ALLOC) & (kind[:-1] == ALLOC)).sum())
