"""The event table: the one adapter between the log format and the analysis.

Takes a decoded log (`torchalloc.log.read_log`) or a log file; gives an
`EventTable` -- parallel numpy arrays (kind, time_ns, addr, size,
block_size, stream, tid, stack, phase, device, seq, flags, policy) plus the interned
strings, stacks and phase names. Every later stage reads only this table, so
the log format can change behind `table_from_log`, and tests build tables by
hand (`EventTable.from_rows`). The `kind` column holds the record kinds of
torchalloc._records.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Sequence

import numpy as np

from .._records import ALLOC
from ..log.checks import impossible
from ..log.reader import WRITER_KILLED, WRITER_RUNNING, WRITER_UNKNOWN, read_log
from ..printable import printable
from .frames import Frame, Stack

_COLUMNS: dict[str, Any] = {
    "kind": np.uint8,
    "time_ns": np.int64,
    "addr": np.uint64,
    "size": np.int64,
    "block_size": np.int64,
    "stream": np.uint64,
    "tid": np.int64,
    "stack": np.int64,
    "phase": np.int32,
    "device": np.int16,
    "seq": np.int64,
    "flags": np.uint8,
    "policy": np.uint8,  # the registry id of the policy that made a block or segment (alloc, free, segment records)
}


@dataclasses.dataclass
class EventTable:
    """Event records as parallel arrays, plus what they refer to.

    `stack` holds a stack id for alloc/free/oom records and a string id (the
    label) for phase and marker records. `stacks` maps stack ids to frames,
    innermost first; `strings` string ids to text.
    """

    kind: np.ndarray
    time_ns: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    block_size: np.ndarray
    stream: np.ndarray
    tid: np.ndarray
    stack: np.ndarray
    phase: np.ndarray
    device: np.ndarray
    seq: np.ndarray
    flags: np.ndarray
    policy: np.ndarray
    strings: dict[int, str] = dataclasses.field(default_factory=dict)
    stacks: dict[int, Stack] = dataclasses.field(default_factory=dict)
    phase_names: dict[int, str] = dataclasses.field(default_factory=lambda: {0: "default"})
    start_ns: int | None = None  # CLOCK_MONOTONIC when the log was opened
    wall_offset_ns: int = 0  # add to time_ns for Unix time
    path: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    pid: int = 0
    rank: int = -1  # the writer's $RANK (else $LOCAL_RANK); -1: not under a launcher, or unknown
    world_size: int = 0  # the writer's $WORLD_SIZE; 0: unset, or a log older than the field

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[dict[str, Any]],
        *,
        strings: dict[int, str] | None = None,
        stacks: dict[int, Sequence[Sequence[Any]]] | None = None,
        phase_names: dict[int, str] | None = None,
        **extra: Any,
    ) -> "EventTable":
        """A table from dicts (tests, other tools); missing columns are 0, time_ns and seq default to the row index."""
        rows = list(rows)
        cols: dict[str, np.ndarray] = {}
        for name, dtype in _COLUMNS.items():
            # time_ns and seq count up with the row; every other missing column is 0
            values = [r.get(name, i * 1000 if name == "time_ns" else i if name == "seq" else 0)
                      for i, r in enumerate(rows)]
            cols[name] = np.array(values, dtype=dtype) if rows else np.zeros(0, dtype=dtype)
        names = {0: "default"}
        names.update(phase_names or {})
        frames = {int(k): tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in v) for k, v in (stacks or {}).items()}
        return cls(**cols, strings=dict(strings or {}), stacks=frames, phase_names=names, **extra)

    def select(self, mask: np.ndarray) -> "EventTable":
        """The rows where mask is true, with the same dictionaries."""
        cols = {name: getattr(self, name)[mask] for name in _COLUMNS}
        return dataclasses.replace(self, **cols)

    def label(self, i: int) -> str:
        return self.strings.get(int(self.stack[i]), "")

    def stack_of(self, stack_id: int) -> Stack:
        return self.stacks.get(int(stack_id), ())


def table_from_log(log: Any) -> EventTable:
    """The adapter: a `torchalloc.log.Log` (read_log's result) as an EventTable. Records no writer
    produces (torchalloc.log.checks) are dropped, each named in a note."""
    header = getattr(log, "header", None)
    bad, dropped = impossible(log.records, header_size=getattr(header, "header_size", 128), path=str(log.path))
    r = log.records[~bad] if bad.any() else log.records
    cols = {name: np.asarray(r[name]).astype(dtype) for name, dtype in _COLUMNS.items()}
    # Text from the log is shown escaped in every output (torchalloc.printable): a name with an ESC
    # sequence must not reach a terminal, and a newline in it must not forge a line of the report.
    stacks = {int(k): tuple(Frame(printable(str(f[0])), int(f[1]), printable(str(f[2]))) for f in v)
              for k, v in log.stacks.items()}
    start = getattr(header, "created_monotonic_ns", None)
    wall = (header.created_realtime_ns - header.created_monotonic_ns) if header is not None else 0
    notes = list(getattr(log, "damage", getattr(log, "warnings", []))) + [
        f"{log.path}: dropped {n}; a damaged or hand-made log" for n in dropped]
    writer = getattr(log, "writer", None)
    pid = getattr(header, "pid", "?")
    if getattr(log, "truncated", False):
        notes.append("the log was truncated (log_max reached or the disk filled): events after that are missing")
    elif writer == WRITER_RUNNING:
        notes.append(f"the log is still being written (process {pid} holds it): this covers it up to its last "
                     "complete record so far")
    elif writer == WRITER_KILLED:
        notes.append(f"the log was not closed and no process is writing it: its writer (process {pid}) was killed "
                     "or crashed mid-run; it ends at the last complete record")
    elif writer == WRITER_UNKNOWN and header is not None and getattr(header, "status", 1) == 0:
        notes.append("the log was not closed: its writer was killed or is still running (a copy cannot tell "
                     "which); it ends at the last complete record")
    return EventTable(
        **cols,
        strings={k: printable(v) for k, v in log.strings.items()},
        stacks=stacks,
        phase_names={k: printable(v) for k, v in log.phase_names.items()},
        start_ns=start,
        wall_offset_ns=int(wall),
        path=str(getattr(log, "path", "")),
        notes=notes,
        pid=int(getattr(header, "pid", 0)),
        rank=int(getattr(header, "rank", -1)),
        world_size=int(getattr(header, "world_size", 0)),
    )


def load(path: str | os.PathLike[str]) -> EventTable:
    """Read a torchalloc log file into an EventTable (damage is in its notes, which the tools print)."""
    return table_from_log(read_log(path, warn=False))


def devices_in(table: EventTable) -> list[int]:
    """Devices with alloc records, most allocations first."""
    allocs = table.device[table.kind == ALLOC]
    if allocs.size == 0:
        return sorted({int(d) for d in table.device if d >= 0})
    values, counts = np.unique(allocs, return_counts=True)
    return [int(v) for v in values[np.argsort(-counts, kind="stable")]]




def report_start_ns(opened_ns: int | None, first_ns: int) -> int:
    """Time zero of a report: when the log was opened, unless its first event is before that or more than an
    hour after (a clock the header does not share: then the first event)."""
    if opened_ns is not None and 0 <= first_ns - opened_ns < 3600 * 10**9:
        return opened_ns
    return first_ns


def time_base_ns(t: EventTable) -> int:
    """Time zero of the report of `t` (report_start_ns); 0 for an empty table."""
    if not len(t):
        return 0
    return report_start_ns(None if t.start_ns is None else int(t.start_ns), int(t.time_ns[0]))

