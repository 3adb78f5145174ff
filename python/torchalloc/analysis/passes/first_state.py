"""Running state for the first pass (first.py): what it carries from one piece of the log to the next.

The pass's parts here (`Devices`, `Levels`, `PhaseLevels`, `TimelineSamples`;
first.py holds the others) each carry their own running values,
take each piece with `piece(...)` and give their fields of the `Scan` at
the end (`fields()`); the rest are their building blocks:

- `Devices`: the log's devices and which records of a piece the pass
  reads;
- `Levels`: allocated's and reserved's running sums and their extremes;
  `PhaseLevels`: per phase its peak, reserved growth and highest moment
  among its allocs and frees (`AllocPeaks`: memory by module's moments);
- `Bits`, `Grow`, `GrowEnd`: arrays that grow as blocks and phase
  occurrences are met (a byte per block; an end index and its time per
  occurrence);
- `Occurrences`: the phase occurrences' rule (an occurrence ends at the
  first phase_end of its phase and number anywhere in the log), keeping
  only the open occurrences; `Rises`: per phase the highest rise in an
  occurrence;
- `Backward`: backward detection's stack part (rules/classify.py, rule 2), per
  thread;
- `TimelineSamples`: the timeline's samples (`Sampler`: per time bucket the
  highest and the last event, the span known in advance) and the --at
  times' indices.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..._records import ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE
from ..rules.frames import BACKWARD_FRAME, has_frame
from ..rules.roles import PHASE_IDS

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


class Rises:
    """The phase table's rise (PhaseRow.peak_over_start): per occurrence, the highest cum from its begin to its end
    (inclusive) above the cum at its begin; the running highest of the open occurrences is carried."""

    def __init__(self) -> None:
        self.open: dict[int, tuple[int, int, int, int]] = {}  # row -> (begin index, cum at it, highest since, phase)
        self.rise: dict[int, int] = {}  # phase -> its highest rise in an occurrence ended so far

    def piece(self, ends: GrowEnd, new_rows: np.ndarray, begin_rows: np.ndarray, phases: np.ndarray, base: int,
              c: np.ndarray) -> None:
        """The piece's occurrences (`new_rows`, begun at `begin_rows` in `phases`) and its cum (`c`)."""
        for row, r, p in zip(new_rows.tolist(), begin_rows.tolist(), phases.tolist()):
            self.open[row] = (base + r, int(c[r]), int(c[r]), p)
        if not self.open:
            return
        m = len(c)
        rows = list(self.open)
        lo = np.array([max(self.open[r][0], base) - base for r in rows], dtype=np.int64)
        end = ends.arr[np.array(rows, dtype=np.int64)]
        hi = np.minimum(end, base + m - 1) - base  # inclusive
        valid = hi >= lo
        highs = np.full(len(rows), INT_MIN, dtype=np.int64)
        if valid.any():
            idx = np.empty(2 * int(valid.sum()), dtype=np.int64)
            idx[0::2], idx[1::2] = lo[valid], hi[valid] + 1
            padded = np.concatenate((c, [INT_MIN]))
            highs[valid] = np.maximum.reduceat(padded, idx)[0::2]
        for k, r in enumerate(rows):
            begin, start, high, p = self.open[r]
            high = max(high, int(highs[k]))
            if end[k] < base + m:  # it ended in this piece (or before its begin: a damaged log, no rise)
                del self.open[r]
                if end[k] >= begin:
                    self.rise[p] = max(self.rise.get(p, 0), high - start)
            else:
                self.open[r] = (begin, start, high, p)

    def result(self) -> dict[int, int]:
        """Per phase its highest rise, the occurrences open at the end of the log included."""
        for _, start, high, p in self.open.values():
            self.rise[p] = max(self.rise.get(p, 0), high - start)
        return self.rise


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
    (memory by module's moments, sections/modules.py), piece by piece."""

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
# Devices; the levels
# ---------------------------------------------------------------------------


class Devices:
    """The log's devices (those with allocs, by their allocs), and the device the pass reads: the one asked for,
    or (None) the device of the first record about one."""

    def __init__(self, device: int | None) -> None:
        self.device = device
        self.counts: dict[int, int] = {}  # device -> its allocs
        self.present: set[int] = set()

    def piece(self, records: np.ndarray) -> np.ndarray:
        """The piece's records the pass reads: those about its device or about none."""
        dev = records["device"]
        about = dev >= 0
        if self.device is None and about.any():
            self.device = int(dev[np.argmax(about)])
        if len(self.present) < 2 or not about.all():  # (most logs: one device, every record about it)
            self.present.update(np.unique(dev[about]).tolist())
        allocs_dev = dev[records["kind"] == ALLOC]
        if allocs_dev.size:
            lo, hi = int(allocs_dev.min()), int(allocs_dev.max())
            if lo == hi:
                self.counts[lo] = self.counts.get(lo, 0) + int(allocs_dev.size)
            else:
                u, c = np.unique(allocs_dev, return_counts=True)
                for d, k in zip(u.tolist(), c.tolist()):
                    self.counts[d] = self.counts.get(d, 0) + k
        mine = (dev == self.device) | (dev < 0) if self.device is not None else dev < 0
        return records if mine.all() else records[mine]

    def fields(self) -> dict[str, Any]:
        """The devices, those with allocs most first (ties: the lower id), else every device seen; the device read
        (none seen: the first of them, or 0)."""
        if self.counts:
            devices = [d for d, _ in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        else:
            devices = sorted(self.present)
        device = self.device if self.device is not None else (devices[0] if devices else 0)
        return {"device": device, "devices": devices}


class Levels:
    """The levels as running sums: cum (the blocks' sizes: allocated less the blocks from before the log) and raw
    (the segments': reserved less an offset known at the end); each one's first highest event with the levels and
    time there, raw's lowest and the highest cum - raw (the offset's bounds)."""

    def __init__(self) -> None:
        self.cum = self.raw = 0  # after the last piece
        self.peak_cum, self.peak_i, self.peak_phase = INT_MIN, 0, 0
        self.rpeak_raw, self.rpeak_i = INT_MIN, 0
        self.peak_at = self.rpeak_at = (0, 0, 0)  # (cum, raw, time_ns) at each peak
        self.raw_min, self.gap_max = INT_MAX, INT_MIN

    def piece(self, t: Any, base: int, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per event (`delta`: its change of cum): cum and raw after it, and its change of raw."""
        kind = t.kind
        c = self.cum + np.cumsum(delta)
        segd = np.where(kind == SEGMENT_ALLOC, t.size, 0) - np.where(kind == SEGMENT_FREE, t.size, 0)
        rw = self.raw + np.cumsum(segd)
        k = int(np.argmax(c))
        if c[k] > self.peak_cum:
            self.peak_cum, self.peak_i, self.peak_at = int(c[k]), base + k, (int(c[k]), int(rw[k]), int(t.time_ns[k]))
            self.peak_phase = int(t.phase[k])
        k = int(np.argmax(rw))
        if rw[k] > self.rpeak_raw:
            self.rpeak_raw, self.rpeak_i, self.rpeak_at = int(rw[k]), base + k, (int(c[k]), int(rw[k]),
                                                                                  int(t.time_ns[k]))
        self.raw_min = min(self.raw_min, int(rw.min()))
        self.gap_max = max(self.gap_max, int((c - rw).max()))
        self.cum, self.raw = int(c[-1]), int(rw[-1])
        return c, rw, segd

    def fields(self, n: int, initial: int) -> dict[str, Any]:
        """The peaks, and reserved's offset: the least that keeps reserved >= 0 and >= allocated (`initial`: the
        blocks from before the log)."""
        if not n:
            return {"peak_i": 0, "peak_cum": 0, "peak_ns": 0, "peak_phase": 0, "rpeak_i": 0, "rpeak_raw": 0,
                    "rpeak_ns": 0, "offset": 0}
        return {"peak_i": self.peak_i, "peak_cum": self.peak_cum, "peak_ns": self.peak_at[2],
                "peak_phase": self.peak_phase, "rpeak_i": self.rpeak_i, "rpeak_raw": self.rpeak_raw,
                "rpeak_ns": self.rpeak_at[2], "offset": max(0, initial + self.gap_max, -self.raw_min)}


class PhaseLevels:
    """Per phase: the highest cum at its alloc, free and segment events, its reserved growth (its segment events'
    sum), whether it has any, and its moment of highest cum among its allocs and frees (AllocPeaks)."""

    def __init__(self) -> None:
        self.peak = np.full(PHASE_IDS, INT_MIN, dtype=np.int64)
        self.growth = np.zeros(PHASE_IDS, dtype=np.int64)
        self.segments = np.zeros(PHASE_IDS, dtype=bool)
        self.alloc_peaks = AllocPeaks()

    def piece(self, t: Any, base: int, c: np.ndarray, segd: np.ndarray) -> None:
        """`c`: cum after each event; `segd`: each event's change of raw."""
        kind = t.kind
        is_mem = (kind == ALLOC) | (kind == FREE) | (kind == SEGMENT_ALLOC) | (kind == SEGMENT_FREE)
        np.maximum.at(self.peak, t.phase[is_mem], c[is_mem])
        blocks_ev = np.flatnonzero((kind == ALLOC) | (kind == FREE))
        self.alloc_peaks.piece(t.phase[blocks_ev], c[blocks_ev], base + blocks_ev)
        is_seg = (kind == SEGMENT_ALLOC) | (kind == SEGMENT_FREE)
        np.add.at(self.growth, t.phase[is_seg], segd[is_seg])
        self.segments[t.phase[is_seg]] = True

    def fields(self) -> dict[str, Any]:
        seen = self.peak > INT_MIN
        return {"phase_peak": {int(p): int(v) for p, v in zip(np.flatnonzero(seen).tolist(), self.peak[seen].tolist())},
                "phase_growth": {int(p): int(self.growth[p]) for p in np.flatnonzero(self.segments).tolist()},
                "segment_phases": set(np.flatnonzero(self.segments).tolist()),
                "alloc_peaks": self.alloc_peaks.index}


# ---------------------------------------------------------------------------
# Backward detection's stack part (rules/classify.py, rule 2), running over pieces
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
        # an event timed before the first one (a clock that went back, a damaged log) counts in the first bucket
        b = np.clip(((time_s - self.t0) / self.span * self.buckets).astype(np.int64), 0, self.buckets - 1)
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


class TimelineSamples:
    """The timeline's samples and the --at times' indices. With the span known in advance (`last_hint`: the time
    of the log's last event, a guess the end checks) a Sampler draws them; a log of at most max_points events keeps
    every event (`head`, the levels and time of its first max_points + 1 events)."""

    def __init__(self, max_points: int, last_hint: int | None, at_times: Sequence[float]) -> None:
        self.max_points, self.last_hint = max_points, last_hint
        self.sampler: Sampler | None = None
        self.head: list[np.ndarray] = []  # while base <= max_points: (cum, raw, ns) of every event
        self.at_count = {x: 0 for x in at_times}  # --at time -> the events at or before it
        self.base_ns = 0

    def start(self, first_ns: int, base_ns: int) -> None:
        """At the first event (`base_ns`: the report's time zero)."""
        self.base_ns = base_ns
        if self.last_hint is not None:
            self.sampler = Sampler(first_ns, self.last_hint, base_ns, self.max_points)

    def piece(self, base: int, time_ns: np.ndarray, c: np.ndarray, rw: np.ndarray) -> None:
        if self.sampler is not None:
            self.sampler.piece(base, time_ns, c, rw)
        if base <= self.max_points:
            self.head.append(np.stack((c, rw, time_ns))[:, : self.max_points + 1 - base])
        if self.at_count:
            rel_s = (time_ns - self.base_ns) / 1e9
            for x in self.at_count:
                self.at_count[x] += int(np.count_nonzero(rel_s <= x))

    def fields(self, n: int, last_ns: int, levels: Levels) -> dict[str, Any]:
        """The samples (None: the span guessed was not the log's: scan again) with the levels and time at each
        (the peaks and the first and last events always among them); per --at time its last event at or before."""
        samples = sample_cum = sample_raw = sample_ns = None
        if n and n <= self.max_points:
            h = np.concatenate(self.head, axis=1)[:, :n]
            samples, sample_cum, sample_raw, sample_ns = np.arange(n), h[0], h[1], h[2]
        elif n and self.sampler is not None and last_ns == self.last_hint:
            extra = [(0,) + tuple(int(x) for x in np.concatenate(self.head, axis=1)[:, 0]),
                     (n - 1, levels.cum, levels.raw, last_ns), (levels.peak_i,) + levels.peak_at,
                     (levels.rpeak_i,) + levels.rpeak_at]
            samples, sample_cum, sample_raw, sample_ns = self.sampler.finish(extra)
        empty = np.zeros(0, dtype=np.int64)
        if not n:
            samples = empty
        return {"samples": samples, "sample_cum": sample_cum if sample_cum is not None else empty,
                "sample_raw": sample_raw if sample_raw is not None else empty,
                "sample_ns": sample_ns if sample_ns is not None else empty,
                "at_time": {x: max(0, min(k - 1, n - 1)) for x, k in self.at_count.items()}}


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
