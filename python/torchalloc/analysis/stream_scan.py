"""The first pass: the facts about one device's events that the second pass needs.

Takes a `ChunkedLog` and a device; reads the log once, piece by piece
(stream_table.py), and gives a `Scan`: how many events, the levels'
peaks (allocated = the blocks' cumulated sizes, reserved = the segments',
kept as running sums and their extremes), every phase occurrence with its
end, per phase its peak, its highest rise in an occurrence and its
reserved growth, the markers and OOMs, the blocks allocated before the
log (`orphans`), the timeline's sample indices (per time bucket the
highest and the last event) with the levels there, and per block (by
ordinal) a byte of facts that only its end or the end of the log tells
(`BIT_*`): the second pass needs them to give a block its category the
moment it is allocated.

Each fact is a running value carried from piece to piece
(stream_running.py): the blocks paired across pieces
(stream_table.pair_piece), backward found as classify.py's rule 2 says,
what categorize.py's rules need of a block's future, the timeline's levels
and samples, the phase table's peaks and rises.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .._records import (ALLOC, FREE, MARKER, MODULE, MODULE_TAG, OOM, OOM_DEVICE, PHASE_BEGIN, PHASE_END,
                        POLICY_NAMES, SEGMENT_ALLOC, SEGMENT_EXPANDABLE, SEGMENT_FREE)
from ..log.chunks import ChunkedLog
from .frames import BACKWARD_FRAME, Frame, has_frame
from .roles import phase_role
from .stream_running import INT_MAX, INT_MIN, AllocPeaks, Backward, Bits, Grow, GrowEnd, Occurrences, Sampler
from .stream_table import Carry, Piece, PieceTable, pair_piece, report_start_ns

PHASE_IDS = 1 << 16  # the phase field is a u16

# Per block (by ordinal): what the first pass learns of it.
BIT_ALLOC_BW = 1  # allocated during backward (classify.py, rule 2: a backward phase, or a Python thread inside
#                   Tensor.backward; phase names as far as read: every phase_begin precedes its events)
BIT_FREE_BW = 2  # ended during backward
BIT_AUTOGRAD_FREE = 4  # its free has no stack, or a stack inside backward (classify.py, rule 2: by autograd)
BIT_WITHIN = 8  # ended before the occurrence of the phase that allocated it ended
BIT_SAME = 16  # the thread's allocation before or after it has the same stack (categorize: workspaces)
BIT_PERSISTENT = 32  # never ended: live at the end of the log

MARKERS_KEPT = 10000  # markers listed in the timeline (the first ones); every label keeps its first index
OOMS_KEPT = 1000  # OOM records diagnosed (the first ones)


@dataclasses.dataclass
class Scan:
    """What the first pass found (module docstring). Levels are the running sums: allocated = cum +
    `initial` (the blocks allocated before the log, known only at its end), reserved = raw + `offset`."""

    device: int
    devices: list[int]
    n: int
    first_ns: int
    last_ns: int
    has_stacks: bool
    peak_i: int
    peak_cum: int
    peak_ns: int
    peak_phase: int  # the phase of the peak's event (its record's)
    rpeak_i: int
    rpeak_raw: int
    rpeak_ns: int
    initial: int
    offset: int
    blocks: int  # allocs (ordinals 0 .. blocks - 1)
    bits: np.ndarray  # uint8 per ordinal
    orphans: dict[str, np.ndarray]  # blocks allocated before the log, in the blocks' order (address, free index)
    lost_frees: int
    any_freed: bool
    occ_phase: np.ndarray
    occ_epoch: np.ndarray
    occ_begin: np.ndarray
    occ_end: np.ndarray  # n when it never ended
    occ_begin_ns: np.ndarray
    occ_end_ns: np.ndarray  # the time of its end, or of the last event
    first_begin: dict[int, int]  # per phase, its first begin
    phase_peak: dict[int, int]  # cum, highest at its alloc/free/segment events
    phase_rise: dict[int, int]
    phase_growth: dict[int, int]
    segment_phases: set[int]
    markers: list[tuple[int, int, int, int]]  # (index, label id, phase, time_ns), the first MARKERS_KEPT
    marker_count: int
    marker_first: dict[int, int]  # label id -> its first marker's index
    ooms: list[dict[str, Any]]
    oom_count: int
    stack_backward: bool  # a with-stack event inside backward was seen
    samples: np.ndarray | None  # timeline sample indices (None: the span was not known: scan again)
    sample_cum: np.ndarray
    sample_raw: np.ndarray
    sample_ns: np.ndarray
    at_time: dict[float, int]  # --at times asked for in advance -> index
    phase_names: dict[int, str]
    persistent: dict[str, np.ndarray]  # the blocks live at the end: ordinal, block_size, stack, phase, alloc_i
    alloc_peaks: dict[int, int]  # per phase, the index of its highest allocated among its allocs and frees
    module_records: int  # MODULE, MODULE_NAME and MODULE_TAG records

    def allocated(self, cum: int) -> int:
        return cum + self.initial


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------


def scan(log: ChunkedLog, device: int | None, *, max_points: int = 1500, last_ns: int | None = None,
         at_times: Sequence[float] = (), progress: Any = None) -> Scan:
    """One pass over `log` for `device` (None: the device of the first record about one)."""
    return _Scanner(log, device, max_points, last_ns, at_times, progress).run()


class _Scanner:
    def __init__(self, log: ChunkedLog, device: int | None, max_points: int, last_ns: int | None,
                 at_times: Sequence[float], progress: Any) -> None:
        self.log, self.device, self.max_points, self.last_hint = log, device, max_points, last_ns
        self.at_times = list(at_times)
        self.progress = progress

    def run(self) -> Scan:  # noqa: C901 (one pass, one place: the state it carries is listed here)
        log = self.log
        names: dict[int, str] = {0: "default"}  # phase names as far as read (begins precede their events)
        backward = Backward(log.stack_now)
        bw_phase = np.zeros(PHASE_IDS, dtype=bool)
        autograd: dict[int, bool] = {}
        carry = Carry.empty({"addr": np.uint64, "ordinal": np.int64, "block_size": np.int64, "occ": np.int64,
                             "stack": np.int64, "phase": np.int64, "alloc_i": np.int64})
        bits = Bits()
        ordinals = 0
        last_alloc: dict[int, tuple[int, int]] = {}  # tid -> (stack, ordinal) of its last alloc
        cum = raw = 0
        peak_cum, peak_i, rpeak_raw, rpeak_i, peak_phase = INT_MIN, 0, INT_MIN, 0, 0
        raw_min, gap_max = INT_MAX, INT_MIN
        phase_peak = np.full(PHASE_IDS, INT_MIN, dtype=np.int64)
        alloc_peaks, module_records = AllocPeaks(), 0
        phase_growth = np.zeros(PHASE_IDS, dtype=np.int64)
        seg_phase = np.zeros(PHASE_IDS, dtype=bool)
        phase_rise: dict[int, int] = {}
        occ_phase, occ_epoch, occ_begin = Grow(np.int64), Grow(np.int64), Grow(np.int64)
        occ_begin_ns = Grow(np.int64)
        occ_count = 0
        occ_end = GrowEnd()  # occurrence row -> its end (the first end of its key), INT_MAX until known
        open_rise: dict[int, tuple[int, int, int, int]] = {}  # row -> (begin index, cum at it, highest since, phase)
        current_occ: dict[int, int] = {}  # phase -> its latest occurrence row
        occ = Occurrences(occ_end, occ_phase, occ_epoch, occ_begin)
        first_begin = occ.first_begin
        orphans: dict[str, list[np.ndarray]] = {k: [] for k in ("addr", "free_i", "size", "block_size", "stream",
                                                                "free_phase", "free_stack", "free_tid", "free_t",
                                                                "deferred")}
        lost = 0
        any_freed = False
        has_stacks = False
        markers: list[tuple[int, int, int, int]] = []
        marker_first: dict[int, int] = {}
        marker_count = 0
        ooms: list[dict[str, Any]] = []
        oom_count = 0
        pending_oom: list[tuple[dict[str, Any], int]] = []  # waiting for an oom_device record in the next events
        last_policy = -1  # an OOM's policy: that of the last alloc before it; and whether expandable segments were seen
        expandable_seen = False
        device = self.device
        counts: dict[int, int] = {}
        present: set[int] = set()
        n = 0
        first_ns = last_ns = 0
        sampler: Sampler | None = None
        head: list[np.ndarray] = []  # while n <= max_points: (cum, raw, ns) of every event
        at_count = {x: 0 for x in self.at_times}
        base_ns = 0
        for _, records in log.chunks():
            dev = records["device"]
            about = dev >= 0
            if device is None and about.any():
                device = int(dev[np.argmax(about)])
            if len(present) < 2 or not about.all():  # (most logs: one device, every record about it)
                present.update(np.unique(dev[about]).tolist())
            kinds = records["kind"]
            allocs_dev = dev[kinds == ALLOC]
            if allocs_dev.size:
                lo, hi = int(allocs_dev.min()), int(allocs_dev.max())
                if lo == hi:
                    counts[lo] = counts.get(lo, 0) + int(allocs_dev.size)
                else:
                    u, c = np.unique(allocs_dev, return_counts=True)
                    for d, k in zip(u.tolist(), c.tolist()):
                        counts[d] = counts.get(d, 0) + k
            mine = (dev == device) | (dev < 0) if device is not None else dev < 0
            t = PieceTable(records if mine.all() else records[mine])
            if not len(t):
                continue
            p = Piece(t, n)
            m = len(t)
            if n == 0:
                first_ns = int(t.time_ns[0])
                start = log.header.created_monotonic_ns
                base_ns = report_start_ns(start, first_ns)
                if self.last_hint is not None:
                    sampler = Sampler(first_ns, self.last_hint, base_ns, self.max_points)
            kind = t.kind
            # phases: names, occurrences and their ends
            begin_rows = np.flatnonzero(kind == PHASE_BEGIN)
            for r in begin_rows.tolist():
                ph = int(t.phase[r])
                if ph not in names:
                    names[ph] = log.string_now(int(t.stack[r]), f"phase{ph}")
                    bw_phase[ph] = phase_role(names[ph]) == "backward"
            new_occ_rows = np.arange(occ_count, occ_count + begin_rows.size)
            occ_end.extend(begin_rows.size)
            if begin_rows.size:
                occ_phase.add(t.phase[begin_rows].astype(np.int64))
                occ_epoch.add(t.size[begin_rows].astype(np.int64))
                occ_begin.add(n + begin_rows)
                occ_begin_ns.add(t.time_ns[begin_rows])
            end_rows = np.flatnonzero(kind == PHASE_END)
            if begin_rows.size or end_rows.size:
                occ.piece(t, n, begin_rows, end_rows, new_occ_rows)
                occ_count += begin_rows.size
            # backward: the stack part per event
            in_bw = bw_phase[t.phase] | backward.piece(t)
            # pairing
            paired = pair_piece(p, carry, ordinals)
            nr = paired.new_rows
            has_stacks = has_stacks or bool(np.any(t.stack[nr] != 0))
            # the occurrence each new block was allocated in (Occurrences.of)
            new_occ = np.full(nr.size, -1, dtype=np.int64)
            alloc_phase = t.phase[nr].astype(np.int64)
            for ph in np.unique(alloc_phase).tolist():
                sel = alloc_phase == ph
                mine_b = np.flatnonzero(t.phase[begin_rows] == ph)
                before = current_occ.get(ph, -1)
                if mine_b.size == 0:
                    new_occ[sel] = before
                    continue
                k = np.searchsorted(begin_rows[mine_b], nr[sel], side="right") - 1
                new_occ[sel] = np.where(k >= 0, new_occ_rows[mine_b][np.maximum(k, 0)], before)
            for r, ph in zip(new_occ_rows.tolist(), t.phase[begin_rows].tolist()):
                current_occ[ph] = r
            # the new blocks' bits: allocated inside backward, and the same stack as the thread's neighbour
            b_new = np.where(in_bw[nr], BIT_ALLOC_BW, 0).astype(np.uint8)
            tid_new, stack_new = t.tid[nr], t.stack[nr]
            order = np.lexsort((nr, tid_new))
            ts, ss = tid_new[order], stack_new[order]
            pair = np.zeros(order.size, dtype=bool)
            if order.size > 1:
                pair[1:] = (ts[1:] == ts[:-1]) & (ss[1:] == ss[:-1])
            same = np.zeros(order.size, dtype=bool)
            same[pair] = True
            same[:-1] |= pair[1:]
            first_of_tid = np.ones(order.size, dtype=bool)
            first_of_tid[1:] = ts[1:] != ts[:-1]
            for k in np.flatnonzero(first_of_tid).tolist():
                prev = last_alloc.get(int(ts[k]))
                if prev is not None and prev[0] == int(ss[k]):
                    same[k] = True
                    bits.set(np.array([prev[1]]), np.array([BIT_SAME], dtype=np.uint8))
            last_of_tid = np.ones(order.size, dtype=bool)
            last_of_tid[:-1] = ts[1:] != ts[:-1]
            for k in np.flatnonzero(last_of_tid).tolist():
                last_alloc[int(ts[k])] = (int(ss[k]), ordinals + int(order[k]))
            b_new[order[same]] |= BIT_SAME
            bits.append(b_new)
            # levels
            delta = np.zeros(m, dtype=np.int64)
            delta[nr] += t.block_size[nr]
            comb_size = paired.combined(carry["block_size"], t.block_size)
            comb_ord = paired.ordinals(carry["ordinal"])
            comb_occ = np.concatenate((carry["occ"], _scatter(paired, nr, new_occ)))
            es, ea = paired.ended_src, paired.ended_at
            delta[ea] -= comb_size[es]
            orow = paired.orphan_rows
            delta[orow] -= t.block_size[orow]
            c = cum + np.cumsum(delta)
            segd = np.where(kind == SEGMENT_ALLOC, t.size, 0) - np.where(kind == SEGMENT_FREE, t.size, 0)
            rw = raw + np.cumsum(segd)
            # ended blocks: their bits
            e_ord = comb_ord[es]
            e_bits = np.where(in_bw[ea], BIT_FREE_BW, 0).astype(np.uint8)
            free_stack = np.where(paired.ended_real, t.stack[ea], 0)
            e_bits |= np.where(self._autograd(autograd, free_stack, log), BIT_AUTOGRAD_FREE, 0).astype(np.uint8)
            occ_of = comb_occ[es]
            ends_of = np.where(occ_of >= 0, occ_end.arr[np.maximum(occ_of, 0)], INT_MAX) if occ_end.n else \
                np.full(occ_of.size, INT_MAX, dtype=np.int64)
            e_bits |= np.where(n + ea < ends_of, BIT_WITHIN, 0).astype(np.uint8)
            bits.set(e_ord, e_bits)
            lost += int((~paired.ended_real).sum())
            any_freed = any_freed or bool(es.size) or bool(orow.size)
            if orow.size:
                for name, values in (("addr", t.addr[orow]), ("free_i", n + orow), ("size", t.size[orow]),
                                     ("block_size", t.block_size[orow]), ("stream", t.stream[orow]),
                                     ("free_phase", t.phase[orow]), ("free_stack", t.stack[orow]),
                                     ("free_tid", t.tid[orow]), ("free_t", t.time_ns[orow]),
                                     ("deferred", (t.flags[orow] & 1) != 0)):
                    orphans[name].append(np.asarray(values))
            # the carry: blocks live after this piece
            ls = paired.live_src
            carry = Carry({"addr": np.concatenate((carry["addr"], t.addr[paired.rel]))[ls],
                           "ordinal": comb_ord[ls], "block_size": comb_size[ls], "occ": comb_occ[ls],
                           "stack": paired.combined(carry["stack"], t.stack)[ls],
                           "phase": paired.combined(carry["phase"], t.phase.astype(np.int64))[ls],
                           "alloc_i": paired.combined(carry["alloc_i"], n + np.arange(m, dtype=np.int64))[ls]})
            ordinals += nr.size
            # extremes of the levels
            k = int(np.argmax(c))
            if c[k] > peak_cum:
                peak_cum, peak_i, peak_at = int(c[k]), n + k, (int(c[k]), int(rw[k]), int(t.time_ns[k]))
                peak_phase = int(t.phase[k])
            k = int(np.argmax(rw))
            if rw[k] > rpeak_raw:
                rpeak_raw, rpeak_i, rpeak_at = int(rw[k]), n + k, (int(c[k]), int(rw[k]), int(t.time_ns[k]))
            raw_min = min(raw_min, int(rw.min()))
            gap_max = max(gap_max, int((c - rw).max()))
            # per phase: peak, reserved growth
            is_mem = (kind == ALLOC) | (kind == FREE) | (kind == SEGMENT_ALLOC) | (kind == SEGMENT_FREE)
            np.maximum.at(phase_peak, t.phase[is_mem], c[is_mem])
            blocks_ev = np.flatnonzero((kind == ALLOC) | (kind == FREE))
            alloc_peaks.piece(t.phase[blocks_ev], c[blocks_ev], n + blocks_ev)
            module_records += int(np.count_nonzero((kind >= MODULE) & (kind <= MODULE_TAG)))
            is_seg = (kind == SEGMENT_ALLOC) | (kind == SEGMENT_FREE)
            np.add.at(phase_growth, t.phase[is_seg], segd[is_seg])
            seg_phase[t.phase[is_seg]] = True
            # rises in occurrences: from each begin to its end (inclusive), the highest cum above the begin's
            self._rises(open_rise, occ_end, new_occ_rows, begin_rows, t.phase[begin_rows], n, c, phase_rise)
            # markers, OOMs
            for r in np.flatnonzero(kind == MARKER).tolist():
                label = int(t.stack[r])
                marker_first.setdefault(label, n + r)
                if len(markers) < MARKERS_KEPT:
                    markers.append((n + r, label, int(t.phase[r]), int(t.time_ns[r])))
                marker_count += 1
            pending_oom = self._device_records(pending_oom, t, 0)  # those of the piece before
            allocs = np.flatnonzero(kind == ALLOC)
            expandable_rows = np.flatnonzero((kind == SEGMENT_ALLOC) & ((t.flags & SEGMENT_EXPANDABLE) != 0))
            for r in np.flatnonzero(kind == OOM).tolist():
                oom_count += 1
                if len(ooms) >= OOMS_KEPT:
                    continue
                before = int(np.searchsorted(allocs, r)) - 1
                code = int(t.policy[allocs[before]]) if before >= 0 else last_policy
                row = {"policy": POLICY_NAMES.get(code, "caching") if code >= 0 else "caching",
                       "expandable": int(expandable_seen or bool(expandable_rows.size and expandable_rows[0] < r)),
"index": n + r, "size": int(t.size[r]), "block_size": int(t.block_size[r]),
                       "addr": int(t.addr[r]), "stream": int(t.stream[r]), "stack": int(t.stack[r]),
                       "phase": int(t.phase[r]), "time_ns": int(t.time_ns[r]), "cum": int(c[r]), "raw": int(rw[r]),
                       "device": None}
                ooms.append(row)
                pending_oom += self._device_records([(row, 2)], t, r + 1)
            if allocs.size:
                last_policy = int(t.policy[allocs[-1]])
            expandable_seen = expandable_seen or bool(expandable_rows.size)
            # samples, --at times
            if sampler is not None:
                sampler.piece(n, t.time_ns, c, rw)
            if n <= self.max_points:
                head.append(np.stack((c, rw, t.time_ns))[:, : self.max_points + 1 - n])
            if at_count:
                rel_s = (t.time_ns - base_ns) / 1e9
                for x in at_count:
                    at_count[x] += int(np.count_nonzero(rel_s <= x))
            cum, raw = int(c[-1]), int(rw[-1])
            last_ns = int(t.time_ns[-1])
            n += m
            if self.progress is not None:
                self.progress(n)
        # the end of the log: live blocks are persistent; open occurrences end at n
        bits.set(carry["ordinal"], np.full(len(carry), BIT_PERSISTENT, dtype=np.uint8))
        phase_of = occ_phase.array()
        for _, start, high, p_ in open_rise.values():
            phase_rise[p_] = max(phase_rise.get(p_, 0), high - start)
        ends = occ_end.arr[:occ_count].copy()
        ends[ends == INT_MAX] = n
        orphan_cols = {k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64)) for k, v in orphans.items()}
        if orphan_cols["addr"].size:  # the blocks' order for those from before the log: by address, then free index
            o = np.lexsort((orphan_cols["free_i"], orphan_cols["addr"]))
            orphan_cols = {k: v[o] for k, v in orphan_cols.items()}
        initial = int(orphan_cols["block_size"].sum()) if orphan_cols["block_size"].size else 0
        offset = 0
        if n:
            offset = max(0, initial + gap_max, -raw_min)
        devices = _devices(counts, present)
        samples = sample_cum = sample_raw = sample_ns = None
        if n and n <= self.max_points:
            h = np.concatenate(head, axis=1)[:, :n]
            samples, sample_cum, sample_raw, sample_ns = np.arange(n), h[0], h[1], h[2]
        elif n and sampler is not None and last_ns == self.last_hint:
            extra = [(0,) + tuple(int(x) for x in np.concatenate(head, axis=1)[:, 0]), (n - 1, cum, raw, last_ns),
                     (peak_i,) + peak_at, (rpeak_i,) + rpeak_at]
            samples, sample_cum, sample_raw, sample_ns = sampler.finish(extra)
        empty = np.zeros(0, dtype=np.int64)
        if not n:
            samples = empty
        return Scan(
            device=device if device is not None else (devices[0] if devices else 0), devices=devices, n=n,
            first_ns=first_ns, last_ns=last_ns, has_stacks=has_stacks, peak_i=peak_i if n else 0,
            peak_cum=peak_cum if n else 0, peak_ns=peak_at[2] if n else 0, peak_phase=peak_phase if n else 0,
            rpeak_i=rpeak_i if n else 0,
            rpeak_raw=rpeak_raw if n else 0, rpeak_ns=rpeak_at[2] if n else 0,
            initial=initial, offset=offset, blocks=ordinals, bits=bits.array(),
            orphans=orphan_cols, lost_frees=lost, any_freed=any_freed,
            occ_phase=phase_of, occ_epoch=occ_epoch.array(), occ_begin=occ_begin.array(), occ_end=ends,
            occ_begin_ns=occ_begin_ns.array(),
            occ_end_ns=np.where(occ_end.arr[:occ_count] == INT_MAX, last_ns, occ_end.ns[:occ_count]),
            first_begin=first_begin,
            phase_peak={int(p_): int(v) for p_, v in zip(np.flatnonzero(phase_peak > INT_MIN).tolist(),
                                                         phase_peak[phase_peak > INT_MIN].tolist())},
            phase_rise=phase_rise,
            phase_growth={int(p_): int(phase_growth[p_]) for p_ in np.flatnonzero(seg_phase).tolist()},
            segment_phases=set(np.flatnonzero(seg_phase).tolist()),
            markers=markers, marker_count=marker_count, marker_first=marker_first, ooms=ooms, oom_count=oom_count,
            stack_backward=backward.seen_flag,
            samples=samples, sample_cum=sample_cum if sample_cum is not None else empty,
            sample_raw=sample_raw if sample_raw is not None else empty,
            sample_ns=sample_ns if sample_ns is not None else empty,
            at_time={x: max(0, min(k - 1, n - 1)) for x, k in at_count.items()},
            phase_names=names,
            persistent={k: carry[k] for k in ("ordinal", "block_size", "stack", "phase", "alloc_i")},
            alloc_peaks=alloc_peaks.index, module_records=module_records,
        )

    @staticmethod
    def _autograd(cache: dict[int, bool], stacks: np.ndarray, log: ChunkedLog) -> np.ndarray:
        """Per free stack: none, or one inside backward (classify: freed by autograd)."""
        uniq, inv = np.unique(stacks, return_inverse=True)
        for s in uniq.tolist():
            if s not in cache:
                cache[s] = s == 0 or has_frame(tuple(Frame(*f) for f in log.stack_now(s)), BACKWARD_FRAME)
        return np.array([cache[s] for s in uniq.tolist()], dtype=bool)[inv.reshape(-1)]

    @staticmethod
    def _rises(open_rise: dict[int, tuple[int, int, int, int]], occ_end: "GrowEnd", new_rows: np.ndarray,
               begin_rows: np.ndarray, phases: np.ndarray, base: int, c: np.ndarray, phase_rise: dict[int, int]) -> None:
        """The phase table's rise (PhaseRow.peak_over_start): per occurrence, the highest allocated from its begin
        to its end (inclusive) above the allocated at its begin; the running highest of the open ones is carried."""
        for row, r, p_ in zip(new_rows.tolist(), begin_rows.tolist(), phases.tolist()):
            open_rise[row] = (base + r, int(c[r]), int(c[r]), p_)
        if not open_rise:
            return
        m = len(c)
        rows = list(open_rise)
        lo = np.array([max(open_rise[r][0], base) - base for r in rows], dtype=np.int64)
        end = occ_end.arr[np.array(rows, dtype=np.int64)]
        hi = np.minimum(end, base + m - 1) - base  # inclusive
        valid = hi >= lo
        highs = np.full(len(rows), INT_MIN, dtype=np.int64)
        if valid.any():
            idx = np.empty(2 * int(valid.sum()), dtype=np.int64)
            idx[0::2], idx[1::2] = lo[valid], hi[valid] + 1
            padded = np.concatenate((c, [INT_MIN]))
            highs[valid] = np.maximum.reduceat(padded, idx)[0::2]
        for k, r in enumerate(rows):
            begin, start, high, p_ = open_rise[r]
            high = max(high, int(highs[k]))
            if end[k] < base + m:  # it ended in this piece (or before its begin: a damaged log, no rise)
                del open_rise[r]
                if end[k] >= begin:
                    phase_rise[p_] = max(phase_rise.get(p_, 0), high - start)
            else:
                open_rise[r] = (begin, start, high, p_)

    @staticmethod
    def _device_records(pending: list[tuple[dict[str, Any], int]], t: Any, start: int) -> list[tuple[dict[str, Any], int]]:
        """Each pending OOM's oom_device record: among the next two events, before another OOM (the allocator
        writes it right after its oom record)."""
        out = []
        for row, left in pending:
            k = start
            while left and k < len(t):
                if t.kind[k] == OOM_DEVICE:
                    row["device"] = {"addr": int(t.addr[k]), "size": int(t.size[k]), "stream": int(t.stream[k]),
                                     "flags": int(t.flags[k]), "handle": int(t.stack[k])}
                    left = 0
                    break
                if t.kind[k] == OOM:
                    left = 0
                    break
                k += 1
                left -= 1
            if left:
                out.append((row, left))
        return out


def _scatter(paired: Any, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A per-row value of the piece's allocs as a column over the piece's alloc and free rows."""
    out = np.full(paired.rel.size, -1, dtype=np.int64)
    out[np.searchsorted(paired.rel, rows)] = values
    return out


def _devices(counts: dict[int, int], present: set[int]) -> list[int]:
    """The log's devices: those with allocs, most first (ties: the lower id); else every device seen."""
    if not counts:
        return sorted(present)
    return [d for d, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
