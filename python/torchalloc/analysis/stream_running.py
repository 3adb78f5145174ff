"""Running state for the first pass (stream_scan.py): what it carries from one piece of the log to the next.

- `Bits`, `Grow`, `GrowEnd`: arrays that grow as blocks and phase
  occurrences are met (a byte per block; an end index and its time per
  occurrence);
- `Occurrences`: the phase occurrences' rule (an occurrence ends at the
  first phase_end of its phase and number anywhere in the log), keeping
  only the open occurrences;
- `Backward`: backward detection's stack part (classify.py, rule 2), per
  thread;
- `AllocPeaks`: per phase, the moment of its highest allocated among its
  allocs and frees (the moments memory by module is taken at);
- `Sampler`: the timeline's samples (per time bucket the highest and the
  last event) with the span known in advance.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._records import ALLOC, FREE
from .frames import BACKWARD_FRAME, has_frame

INT_MIN = np.iinfo(np.int64).min
INT_MAX = np.iinfo(np.int64).max


class Bits:
    """One byte per block ordinal, growing as blocks are made; bits OR-ed in at any ordinal made so far."""

    def __init__(self) -> None:
        self.arr = np.zeros(1 << 16, dtype=np.uint8)
        self.n = 0

    def append(self, values: np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self.arr):
            grown = np.zeros(max(need, len(self.arr) * 3 // 2), dtype=np.uint8)
            grown[: self.n] = self.arr[: self.n]
            self.arr = grown
        self.arr[self.n: need] = values
        self.n = need

    def set(self, ordinals: np.ndarray, values: np.ndarray) -> None:
        if len(ordinals):
            np.bitwise_or.at(self.arr, ordinals, values)

    def array(self) -> np.ndarray:
        return self.arr[: self.n].copy()


class GrowEnd:
    """Per occurrence row, its end index (INT_MAX until its end is read) and that end's time; grows as
    occurrences begin."""

    def __init__(self) -> None:
        self.arr = np.full(1 << 10, INT_MAX, dtype=np.int64)
        self.ns = np.zeros(1 << 10, dtype=np.int64)
        self.n = 0

    def extend(self, k: int) -> None:
        if self.n + k > len(self.arr):
            size = max(self.n + k, 2 * len(self.arr))
            arr, ns = np.full(size, INT_MAX, dtype=np.int64), np.zeros(size, dtype=np.int64)
            arr[: self.n], ns[: self.n] = self.arr[: self.n], self.ns[: self.n]
            self.arr, self.ns = arr, ns
        self.n += k

    def set(self, row: int, end: int, ns: int) -> None:
        self.arr[row], self.ns[row] = end, ns


class Occurrences:
    """Phase occurrences' ends, in one pass: an occurrence ends at the first phase_end of its (phase,
    occurrence number) anywhere in the log. Only the open occurrences are kept by key; a key seen again (a
    damaged or hand-made log: an end before its begin, a begin repeated) is looked up among the rows."""

    def __init__(self, ends: GrowEnd, phases: "Grow", epochs: "Grow", begins: "Grow") -> None:
        self.ends, self.phases, self.epochs, self.begins = ends, phases, epochs, begins
        self.open: dict[tuple[int, int], list[int]] = {}
        self.orphan_ends: dict[tuple[int, int], tuple[int, int]] = {}  # ends before any begin of their key
        self.max_epoch: dict[int, int] = {}
        self.first_begin: dict[int, int] = {}

    def _earlier(self, key: tuple[int, int], before: int) -> np.ndarray:
        """Rows with this key begun before event `before` (the unusual case only: it reads every row)."""
        ph, ep, b = self.phases.array(), self.epochs.array(), self.begins.array()
        return np.flatnonzero((ph == key[0]) & (ep == key[1]) & (b < before))

    def piece(self, t: Any, base: int, begin_rows: np.ndarray, end_rows: np.ndarray, new_rows: np.ndarray) -> None:
        row_of = dict(zip(begin_rows.tolist(), new_rows.tolist()))
        for r in np.sort(np.concatenate((begin_rows, end_rows))).tolist():
            key = (int(t.phase[r]), int(t.size[r]))
            i, ns = base + r, int(t.time_ns[r])
            if r in row_of:
                row = row_of[r]
                self.first_begin.setdefault(key[0], i)
                fresh = key[1] > self.max_epoch.get(key[0], -1)
                self.max_epoch[key[0]] = max(key[1], self.max_epoch.get(key[0], -1))
                if key in self.orphan_ends:
                    self.ends.set(row, *self.orphan_ends[key])
                elif not fresh and (key not in self.open):
                    done = [e for e in self._earlier(key, i).tolist() if self.ends.arr[e] != INT_MAX]
                    if done:
                        self.ends.set(row, int(self.ends.arr[done[0]]), int(self.ends.ns[done[0]]))
                    else:
                        self.open.setdefault(key, []).append(row)
                else:
                    self.open.setdefault(key, []).append(row)
            elif key in self.open:
                for row in self.open.pop(key):
                    self.ends.set(row, i, ns)
            elif key not in self.orphan_ends and not self._earlier(key, i).size:
                self.orphan_ends[key] = (i, ns)


class Grow:
    """An int64 (or other) array that grows by appending pieces."""

    def __init__(self, dtype: Any) -> None:
        self.parts: list[np.ndarray] = []
        self.dtype = dtype

    def add(self, values: np.ndarray) -> None:
        if len(values):
            self.parts.append(np.asarray(values, dtype=self.dtype))

    def array(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=self.dtype)


class AllocPeaks:
    """Per phase, the first event index where allocated was highest among the phase's allocs and frees
    (memory by module's moments, stream_modules.py), piece by piece."""

    def __init__(self) -> None:
        self.top: dict[int, int] = {}
        self.index: dict[int, int] = {}

    def piece(self, phase: np.ndarray, level: np.ndarray, index: np.ndarray) -> None:
        if not phase.size:
            return
        top = np.full(1 << 16, INT_MIN, dtype=np.int64)
        np.maximum.at(top, phase, level)
        at_top = np.flatnonzero(level == top[phase])
        phases, first = np.unique(phase[at_top], return_index=True)  # the first row at each phase's top
        for p, j in zip(phases.tolist(), at_top[first].tolist()):
            if int(top[p]) > self.top.get(p, INT_MIN):  # an equal top later is not a new peak
                self.top[p], self.index[p] = int(top[p]), int(index[j])


# ---------------------------------------------------------------------------
# Backward detection's stack part (classify.py, rule 2), running over pieces
# ---------------------------------------------------------------------------


class Backward:
    """Per thread, whether a span "inside Tensor.backward" is open (from a with-stack event whose stack holds a
    backward frame, frames.BACKWARD_FRAME, to the thread's next with-stack event without one); per event, whether
    a span covers it and it counts (no stack: autograd's engine; or a flagged one), piece by piece."""

    def __init__(self, stack_of: Any) -> None:
        self.stack_of = stack_of
        self.flag: dict[int, bool] = {}
        self.open: dict[int, bool] = {}  # tid -> span open after the last with-stack event
        self.seen_flag = False

    def flagged(self, stacks: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(stacks, return_inverse=True)
        for s in uniq.tolist():
            if s not in self.flag:
                self.flag[s] = has_frame(tuple(self.stack_of(s)), BACKWARD_FRAME)
        return np.array([self.flag[s] for s in uniq.tolist()], dtype=bool)[inv.reshape(-1)]

    def piece(self, t: Any) -> np.ndarray:
        n = len(t)
        with_stack = np.flatnonzero(((t.kind == ALLOC) | (t.kind == FREE)) & (t.stack != 0))
        carried = [tid for tid, is_open in self.open.items() if is_open]
        if with_stack.size == 0 and not carried:
            return np.zeros(n, dtype=bool)
        flags = self.flagged(t.stack[with_stack]) if with_stack.size else np.zeros(0, dtype=bool)
        if flags.any():
            self.seen_flag = True
        tids = t.tid[with_stack]
        order = np.lexsort((with_stack, tids))
        tid_s, idx_s, flag_s = tids[order], with_stack[order], flags[order]
        first_of_tid = np.ones(order.size, dtype=bool)
        first_of_tid[1:] = tid_s[1:] != tid_s[:-1]
        prev = np.zeros(order.size, dtype=bool)
        prev[1:] = flag_s[:-1]
        if order.size:
            prev[first_of_tid] = [self.open.get(int(x), False) for x in tid_s[first_of_tid].tolist()]
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, idx_s[flag_s & ~prev], 1)  # a span opens
        np.add.at(delta, idx_s[~flag_s & prev], -1)  # ... and ends (exclusive)
        covered = (len(carried) + np.cumsum(delta[:n])) > 0
        last_of_tid = np.ones(order.size, dtype=bool)
        last_of_tid[:-1] = tid_s[1:] != tid_s[:-1]
        for tid, f in zip(tid_s[last_of_tid].tolist(), flag_s[last_of_tid].tolist()):
            self.open[tid] = f
        flagged_event = np.zeros(n, dtype=bool)
        flagged_event[with_stack[flags]] = True
        return covered & ((t.stack == 0) | flagged_event)


# ---------------------------------------------------------------------------
# Timeline samples, running over pieces
# ---------------------------------------------------------------------------


class Sampler:
    """The timeline's samples with the span known in advance: per time bucket (max_points / 2 of them) the
    highest event (the last among equals) and the last event of each run of one bucket."""

    def __init__(self, first_ns: int, last_ns: int, base_ns: int, max_points: int) -> None:
        self.base = base_ns
        self.t0 = (first_ns - base_ns) / 1e9
        self.span = float((last_ns - base_ns) / 1e9 - self.t0) or 1.0
        self.buckets = max(1, max_points // 2)
        self.high_v = np.full(self.buckets, INT_MIN, dtype=np.int64)
        self.high_i = np.full(self.buckets, -1, dtype=np.int64)
        self.high_raw = np.zeros(self.buckets, dtype=np.int64)
        self.high_ns = np.zeros(self.buckets, dtype=np.int64)
        self.lasts: list[tuple[int, int, int, int]] = []  # (index, cum, raw, ns)
        self.prev: tuple[int, int, int, int, int] | None = None  # (bucket, index, cum, raw, ns) of the last event

    def piece(self, base: int, time_ns: np.ndarray, cum: np.ndarray, raw: np.ndarray) -> None:
        n = len(time_ns)
        time_s = (time_ns - self.base) / 1e9
        b = np.minimum(((time_s - self.t0) / self.span * self.buckets).astype(np.int64), self.buckets - 1)
        order = np.lexsort((cum, b))
        last_of_bucket = np.flatnonzero(np.concatenate((b[order][1:] != b[order][:-1], [True])))
        top = order[last_of_bucket]
        tb = b[top]
        better = cum[top] >= self.high_v[tb]
        sel, tb = top[better], tb[better]
        self.high_v[tb], self.high_i[tb] = cum[sel], base + sel
        self.high_raw[tb], self.high_ns[tb] = raw[sel], time_ns[sel]
        if self.prev is not None and self.prev[0] != int(b[0]):
            self.lasts.append(self.prev[1:])
        run_end = np.flatnonzero(b[1:] != b[:-1])
        self.lasts += list(zip((base + run_end).tolist(), cum[run_end].tolist(), raw[run_end].tolist(),
                               time_ns[run_end].tolist()))
        k = n - 1
        self.prev = (int(b[k]), base + k, int(cum[k]), int(raw[k]), int(time_ns[k]))

    def finish(self, extra: Sequence[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
        """Sample indices with cum, raw and time at each; `extra`: (index, cum, raw, ns) always drawn."""
        picks = [(int(i), int(v), int(r), int(t)) for i, v, r, t in
                 zip(self.high_i.tolist(), self.high_v.tolist(), self.high_raw.tolist(), self.high_ns.tolist())
                 if i >= 0]
        picks += self.lasts + ([self.prev[1:]] if self.prev else []) + list(extra)
        by_index = dict(sorted((p[0], p) for p in picks))
        rows = np.array(list(by_index.values()), dtype=np.int64).reshape(-1, 4)
        return rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]


# Sums per key (a phase), piece by piece.
def add_counted(sums: dict[int, list[int]], keys: np.ndarray, values: np.ndarray) -> None:
    """sums[key] += [value, 1] per element."""
    if not keys.size:
        return
    uniq, inv = np.unique(keys, return_inverse=True)
    totals = np.zeros(uniq.size, dtype=np.int64)
    np.add.at(totals, inv.reshape(-1), values)
    counts = np.bincount(inv.reshape(-1), minlength=uniq.size)
    for k, v, c in zip(uniq.tolist(), totals.tolist(), counts.tolist()):
        slot = sums.setdefault(k, [0, 0])
        slot[0] += v
        slot[1] += c


def add_bytes(sums: dict[int, int], keys: np.ndarray, values: np.ndarray) -> None:
    """sums[key] += value per element."""
    if not keys.size:
        return
    uniq, inv = np.unique(keys, return_inverse=True)
    totals = np.zeros(uniq.size, dtype=np.int64)
    np.add.at(totals, inv.reshape(-1), values)
    for k, v in zip(uniq.tolist(), totals.tolist()):
        sums[k] = sums.get(k, 0) + v
