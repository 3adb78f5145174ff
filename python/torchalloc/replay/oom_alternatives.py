"""Would another policy have fit? The run up to an OOM, replayed under each policy.

Takes a log's event table (one device, `analysis.events.EventTable`), the
index of an OOM record and the capacity torchalloc could use then; builds
the trace of that run up to the failure -- every allocation, free and phase
before it, blocks allocated before the log was opened reconstructed at the
start, and the failed request last -- and replays it through each policy on
the simulated device (engine.py, the very C code that serves the GPU):

- `needed`: the smallest capacity at which the whole run, the failed
  request included, completes (bisection, as `torchalloc replay` finds it);
- `fits`: whether it completes at the capacity the failing run had.

This is the check behind the OOM verdict's advice: "phase_arena would have
needed 120 MiB and fits; caching needed 180 MiB; torchalloc could use
150 MiB".
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .. import _records as records
from .engine import min_capacity, replay_once
from ..log.trace_events import ALLOC, EVENT_DTYPE, FREE, PHASE_BEGIN, PHASE_END, live_peaks

_TO_EVENT = np.zeros(256, dtype=np.uint8)
_TO_EVENT[[records.ALLOC, records.FREE, records.PHASE_BEGIN, records.PHASE_END]] = [ALLOC, FREE, PHASE_BEGIN,
                                                                                  PHASE_END]


@dataclasses.dataclass
class Alternative:
    policy: str
    needed: int  # bytes: the smallest capacity that runs it all
    fits: bool  # within the capacity the failing run had
    peak_reserved: int  # with no limit at all

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def events_until(table: Any, index: int, before_log: Sequence[tuple[int, int, int, int]] = ()) -> np.ndarray:
    """Replay events for the run up to OOM record `index`: `before_log` (addr, requested size, stream,
    phase of blocks allocated before the log began) first, then the log's allocs, frees and phases,
    then the failed request."""
    kind = table.kind[: index + 1]
    rows = np.flatnonzero(_TO_EVENT[kind] != 0)
    n_pre = len(before_log)
    events = np.zeros(n_pre + len(rows) + 1, dtype=EVENT_DTYPE)
    if n_pre:
        pre = np.array(before_log, dtype=np.uint64).reshape(-1, 4)
        events["kind"][:n_pre] = ALLOC
        events["addr"][:n_pre], events["size"][:n_pre] = pre[:, 0], pre[:, 1]
        events["stream"][:n_pre], events["phase"][:n_pre] = pre[:, 2], pre[:, 3]
    body = events[n_pre:-1]
    body["kind"] = _TO_EVENT[table.kind[rows]]
    is_block = body["kind"] <= FREE
    body["addr"] = np.where(is_block, table.addr[rows], 0)
    body["size"] = np.where(body["kind"] == ALLOC, table.size[rows], 0)
    body["stream"] = table.stream[rows]
    body["phase"] = table.phase[rows]
    last = events[-1:]
    last["kind"] = ALLOC
    last["addr"] = _unused_address(events["addr"][:-1])
    last["size"] = int(table.size[index])
    last["stream"] = int(table.stream[index])
    last["phase"] = int(table.phase[index])
    return events


def _unused_address(used: np.ndarray) -> int:
    """An address no event uses, at least 1 MiB from every used one: past the highest, else (a log with an
    address at the top of the 64-bit space) below the lowest, else in the first wide enough gap."""
    gap = 1 << 20
    top = int(used.max(initial=0))
    if top < (1 << 64) - 2 * gap:
        return top + gap
    if int(used.min()) >= 2 * gap:
        return int(used.min()) - gap
    u = np.unique(used)
    wide = np.flatnonzero(np.diff(u) >= 2 * gap)
    return int(u[wide[0]]) + gap  # fewer than 2^43 addresses cannot leave every gap narrower


def alternatives(events: np.ndarray, capacity: int, policies: Sequence[str]) -> list[Alternative]:
    """Each policy's need for `events` and whether it fits `capacity`, smallest need first."""
    _, floor = live_peaks(events)
    out = []
    for policy in policies:
        free_run, _ = replay_once(events, policy, 0)
        peak = int(free_run["peak_reserved"])
        at_capacity, _ = replay_once(events, policy, capacity)
        needed = min_capacity(events, policy, floor, peak)
        out.append(Alternative(policy, needed, not at_capacity["oom"], peak))
    return sorted(out, key=lambda a: (a.needed, a.policy))


def default_policies() -> list[str]:
    return [records.POLICY_NAMES[i] for i in sorted(records.POLICY_NAMES)]
