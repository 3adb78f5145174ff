"""The first pass: the facts about one device's events that the second pass needs.

Takes a `ChunkedLog` and a device; reads the log once, piece by piece
(pieces.py), and gives a `Scan`: how many events, the levels'
peaks (allocated = the blocks' cumulated sizes, reserved = the segments',
kept as running sums and their extremes), every phase occurrence with its
end, per phase its peak, its highest rise in an occurrence and its
reserved growth, the markers and OOMs, the blocks allocated before the
log (`orphans`), the timeline's sample indices (per time bucket the
highest and the last event) with the levels there, and per block (by
ordinal) a byte of facts that only its end or the end of the log tells
(`BIT_*`): the second pass needs them to give a block its category the
moment it is allocated.

`scan` is the loop over the pieces. Each fact is kept by one part, which
carries its running values from piece to piece, takes each piece
(`piece(...)`) and gives its fields of the Scan at the end (`fields()`):
here `Phases` (names, occurrences, rises, the occurrence a block was made
in), `Blocks` (paired across pieces by pieces.pair_piece, with their
bits: backward found as rules/classify.py's rule 2 says, what rules/categorize.py's
rules need of a block's future; `SameStack`, `Orphans`), `Markers` and
`Ooms`; in first_state.py `Devices`, `Levels`, `PhaseLevels`,
`Backward` (the stack part of backward) and `TimelineSamples`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ..._records import (ALLOC, DEVICE, MARKER, MODULE, MODULE_TAG, OOM, OOM_DEVICE, PHASE_BEGIN, PHASE_END,
                        POLICY_NAMES, SEGMENT_ALLOC, SEGMENT_EXPANDABLE)
from ...log.chunks import ChunkedLog
from ..rules.blocks import (BIT_ALLOC_BW, BIT_AUTOGRAD_FREE, BIT_FREE_BW, BIT_PERSISTENT, BIT_SAME,
                           BIT_WITHIN)
from ..rules.frames import BACKWARD_FRAME, Frame, has_frame
from ..rules.roles import PHASE_IDS, phase_role
from .first_state import (INT_MAX, Backward, Bits, Devices, Grow, GrowEnd, Levels, Occurrences,
                             PhaseLevels, Rises, TimelineSamples)
from .pieces import Carry, Paired, Piece, PieceTable, pair_piece, report_start_ns

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
    device_memory: tuple[int, int] | None  # the device's last DEVICE record: (total, memory fraction's limit or 0)

    def allocated(self, cum: int) -> int:
        return cum + self.initial


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------


def scan(log: ChunkedLog, device: int | None, *, max_points: int = 1500, last_ns: int | None = None,
         at_times: Sequence[float] = (), progress: Any = None) -> Scan:
    """One pass over `log` for `device` (None: the device of the first record about one). `last_ns`: the time of
    the log's last event as guessed (the timeline's span), `at_times`: the --at times asked for in advance,
    `progress`: called with the events read so far after each piece.

    Each part takes the piece in this order (a part reads what those before it made of it) and gives its fields
    of the Scan at the end."""
    devices, phases, backward = Devices(device), Phases(log), Backward(log.stack_now)
    blocks, levels, per_phase = Blocks(log), Levels(), PhaseLevels()
    markers, ooms = Markers(MARKERS_KEPT), Ooms(OOMS_KEPT)
    timeline = TimelineSamples(max_points, last_ns, at_times)
    n = first_ns = last_read_ns = module_records = 0
    device_memory: tuple[int, int] | None = None
    for _, records in log.chunks():
        t = PieceTable(devices.piece(records))
        if not len(t):
            continue
        if n == 0:
            first_ns = int(t.time_ns[0])
            timeline.start(first_ns, report_start_ns(log.header.created_monotonic_ns, first_ns))
        phases.piece(t, n)
        in_bw = phases.backward[t.phase] | backward.piece(t)  # per event: inside backward
        delta = blocks.piece(Piece(t, n), in_bw, phases)
        c, rw, segd = levels.piece(t, n, delta)
        per_phase.piece(t, n, c, segd)
        phases.rise(n, c)
        markers.piece(t, n)
        ooms.piece(t, n, c, rw)
        timeline.piece(n, t.time_ns, c, rw)
        module_records += int(np.count_nonzero((t.kind >= MODULE) & (t.kind <= MODULE_TAG)))
        told = np.flatnonzero((t.kind == DEVICE) & (t.addr > 0))
        if told.size:
            device_memory = (int(t.addr[told[-1]]), int(t.size[told[-1]]))
        last_read_ns = int(t.time_ns[-1])
        n += len(t)
        if progress is not None:
            progress(n)
    found = blocks.fields()
    return Scan(n=n, first_ns=first_ns, last_ns=last_read_ns, **devices.fields(), **found,
                **levels.fields(n, found["initial"]), **phases.fields(n, last_read_ns), **per_phase.fields(),
                **markers.fields(), **ooms.fields(), stack_backward=backward.seen_flag,
                **timeline.fields(n, last_read_ns, levels), module_records=module_records,
                device_memory=device_memory)


# ---------------------------------------------------------------------------
# The phases' occurrences
# ---------------------------------------------------------------------------


class Phases:
    """The phases as far as read: their names (every phase_begin precedes its events) and which are backward by
    name (rules/classify.py, rule 2); their occurrences, with Occurrences' rule for their ends; the occurrence each new
    block is allocated in; per phase the highest rise in an occurrence (Rises)."""

    def __init__(self, log: ChunkedLog) -> None:
        self.log = log
        self.names: dict[int, str] = {0: "default"}
        self.backward = np.zeros(PHASE_IDS, dtype=bool)  # per phase id: a backward phase by its name
        self.phase, self.epoch, self.begin, self.begin_ns = (Grow(np.int64) for _ in range(4))  # per occurrence
        self.count = 0
        self.ends = GrowEnd()  # occurrence row -> its end (the first end of its key), INT_MAX until known
        self.occurrences = Occurrences(self.ends, self.phase, self.epoch, self.begin)
        self.current: dict[int, int] = {}  # phase -> its latest occurrence row
        self.rises = Rises()
        # The last piece's begins: their rows in the piece, their occurrence rows and phases.
        self.piece_begins = self.piece_rows = self.piece_phases = np.zeros(0, dtype=np.int64)

    def piece(self, t: PieceTable, base: int) -> None:
        """The piece's phase_begin and phase_end records."""
        kind = t.kind
        begin_rows = np.flatnonzero(kind == PHASE_BEGIN)
        for r in begin_rows.tolist():
            ph = int(t.phase[r])
            if ph not in self.names:
                self.names[ph] = self.log.string_now(int(t.stack[r]), f"phase{ph}")
                self.backward[ph] = phase_role(self.names[ph]) == "backward"
        new_rows = np.arange(self.count, self.count + begin_rows.size)
        self.ends.extend(begin_rows.size)
        if begin_rows.size:
            self.phase.add(t.phase[begin_rows].astype(np.int64))
            self.epoch.add(t.size[begin_rows].astype(np.int64))
            self.begin.add(base + begin_rows)
            self.begin_ns.add(t.time_ns[begin_rows])
        end_rows = np.flatnonzero(kind == PHASE_END)
        if begin_rows.size or end_rows.size:
            self.occurrences.piece(t, base, begin_rows, end_rows, new_rows)
            self.count += begin_rows.size
        self.piece_begins, self.piece_rows, self.piece_phases = begin_rows, new_rows, t.phase[begin_rows]

    def occurrence_of(self, t: PieceTable, rows: np.ndarray) -> np.ndarray:
        """Per alloc of the piece (`rows`, in order), the occurrence row of its phase it was made in (-1: none);
        once per piece, after `piece`."""
        begin_rows, new_rows, phases = self.piece_begins, self.piece_rows, self.piece_phases
        out = np.full(rows.size, -1, dtype=np.int64)
        alloc_phase = t.phase[rows].astype(np.int64)
        for ph in np.unique(alloc_phase).tolist():
            sel = alloc_phase == ph
            mine_b = np.flatnonzero(phases == ph)
            before = self.current.get(ph, -1)
            if mine_b.size == 0:
                out[sel] = before
                continue
            k = np.searchsorted(begin_rows[mine_b], rows[sel], side="right") - 1
            out[sel] = np.where(k >= 0, new_rows[mine_b][np.maximum(k, 0)], before)
        for r, ph in zip(new_rows.tolist(), phases.tolist()):
            self.current[ph] = r
        return out

    def rise(self, base: int, c: np.ndarray) -> None:
        """The piece's cum (`c`, after each event) for the rises; after `piece`."""
        self.rises.piece(self.ends, self.piece_rows, self.piece_begins, self.piece_phases, base, c)

    def fields(self, n: int, last_ns: int) -> dict[str, Any]:
        """The occurrences (an end n, and the last event's time, when it never ended), the phases' names and
        rises."""
        ends = self.ends.arr[:self.count].copy()
        ends[ends == INT_MAX] = n
        return {"occ_phase": self.phase.array(), "occ_epoch": self.epoch.array(), "occ_begin": self.begin.array(),
                "occ_end": ends, "occ_begin_ns": self.begin_ns.array(),
                "occ_end_ns": np.where(self.ends.arr[:self.count] == INT_MAX, last_ns, self.ends.ns[:self.count]),
                "first_begin": self.occurrences.first_begin, "phase_rise": self.rises.result(),
                "phase_names": self.names}


# ---------------------------------------------------------------------------
# The blocks
# ---------------------------------------------------------------------------


class Blocks:
    """The blocks, paired across pieces (pieces.pair_piece): their ordinals and BIT_* facts, the blocks live
    after each piece (the carry; at the end, the persistent ones), those from before the log (Orphans), and how
    many ended without a free (a lost free: the next alloc of the address ended it)."""

    def __init__(self, log: ChunkedLog) -> None:
        self.log = log
        self.carry = Carry.empty({"addr": np.uint64, "ordinal": np.int64, "block_size": np.int64, "occ": np.int64,
                                  "stack": np.int64, "phase": np.int64, "alloc_i": np.int64})
        self.bits = Bits()
        self.ordinals = 0  # blocks made so far
        self.same = SameStack()
        self.orphans = Orphans()
        self.autograd: dict[int, bool] = {}  # free stack -> none, or inside backward
        self.lost = 0
        self.any_freed = self.has_stacks = False

    def piece(self, p: Piece, in_bw: np.ndarray, phases: Phases) -> np.ndarray:
        """Pairs the piece's allocs and frees (`in_bw`: per event, inside backward); gives each event's change of
        cum."""
        t, n, carry = p.table, p.base, self.carry
        paired = pair_piece(p, carry, self.ordinals)
        nr, es, ea, orow = paired.new_rows, paired.ended_src, paired.ended_at, paired.orphan_rows
        self.has_stacks = self.has_stacks or bool(np.any(t.stack[nr] != 0))
        new_occ = phases.occurrence_of(t, nr)
        self._made(t, nr, in_bw)
        delta = np.zeros(len(t), dtype=np.int64)
        delta[nr] += t.block_size[nr]
        comb_size = paired.combined(carry["block_size"], t.block_size)
        comb_ord = paired.ordinals(carry["ordinal"])
        comb_occ = np.concatenate((carry["occ"], _scatter(paired, nr, new_occ)))
        delta[ea] -= comb_size[es]
        delta[orow] -= t.block_size[orow]
        self._ended(t, n, paired, comb_ord[es], comb_occ[es], in_bw, phases.ends)
        self.orphans.piece(t, n, orow)
        ls = paired.live_src
        self.carry = Carry({"addr": np.concatenate((carry["addr"], t.addr[paired.rel]))[ls],
                            "ordinal": comb_ord[ls], "block_size": comb_size[ls], "occ": comb_occ[ls],
                            "stack": paired.combined(carry["stack"], t.stack)[ls],
                            "phase": paired.combined(carry["phase"], t.phase.astype(np.int64))[ls],
                            "alloc_i": paired.combined(carry["alloc_i"], n + np.arange(len(t), dtype=np.int64))[ls]})
        self.ordinals += nr.size
        return delta

    def _made(self, t: PieceTable, rows: np.ndarray, in_bw: np.ndarray) -> None:
        """The new blocks' bits (made at `rows`): allocated inside backward; the same stack as the thread's
        allocation before or after (the one before gets the bit too)."""
        made = np.where(in_bw[rows], BIT_ALLOC_BW, 0).astype(np.uint8)
        same, earlier = self.same.piece(t.tid[rows], t.stack[rows], rows, self.ordinals)
        self.bits.set(np.array(earlier, dtype=np.int64), np.full(len(earlier), BIT_SAME, dtype=np.uint8))
        made[same] |= BIT_SAME
        self.bits.append(made)

    def _ended(self, t: PieceTable, base: int, paired: Paired, ordinals: np.ndarray, occs: np.ndarray,
               in_bw: np.ndarray, ends: GrowEnd) -> None:
        """The bits of the blocks that ended in the piece (`ordinals`; `occs`: the occurrence each was made in):
        freed inside backward, freed by autograd, ended within its occurrence."""
        ea = paired.ended_at
        e_bits = np.where(in_bw[ea], BIT_FREE_BW, 0).astype(np.uint8)
        free_stack = np.where(paired.ended_real, t.stack[ea], 0)
        e_bits |= np.where(self._autograd(free_stack), BIT_AUTOGRAD_FREE, 0).astype(np.uint8)
        ends_of = np.where(occs >= 0, ends.arr[np.maximum(occs, 0)], INT_MAX) if ends.n else \
            np.full(occs.size, INT_MAX, dtype=np.int64)
        e_bits |= np.where(base + ea < ends_of, BIT_WITHIN, 0).astype(np.uint8)
        self.bits.set(ordinals, e_bits)
        self.lost += int((~paired.ended_real).sum())
        self.any_freed = self.any_freed or bool(paired.ended_src.size) or bool(paired.orphan_rows.size)

    def _autograd(self, stacks: np.ndarray) -> np.ndarray:
        """Per free stack: none, or one inside backward (classify: freed by autograd)."""
        uniq, inv = np.unique(stacks, return_inverse=True)
        for s in uniq.tolist():
            if s not in self.autograd:
                self.autograd[s] = s == 0 or has_frame(tuple(Frame(*f) for f in self.log.stack_now(s)), BACKWARD_FRAME)
        return np.array([self.autograd[s] for s in uniq.tolist()], dtype=bool)[inv.reshape(-1)]

    def fields(self) -> dict[str, Any]:
        """At the end of the log: the blocks live then are persistent."""
        self.bits.set(self.carry["ordinal"], np.full(len(self.carry), BIT_PERSISTENT, dtype=np.uint8))
        orphans = self.orphans.columns()
        return {"has_stacks": self.has_stacks, "blocks": self.ordinals, "bits": self.bits.array(),
                "orphans": orphans,
                "initial": int(orphans["block_size"].sum()) if orphans["block_size"].size else 0,
                "lost_frees": self.lost, "any_freed": self.any_freed,
                "persistent": {k: self.carry[k] for k in ("ordinal", "block_size", "stack", "phase", "alloc_i")}}


class SameStack:
    """Per thread, the stack and ordinal of its last alloc: which allocs have the same stack as the thread's alloc
    just before or after (rules/categorize.py: workspaces)."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, int]] = {}  # tid -> (stack, ordinal) of its last alloc

    def piece(self, tid: np.ndarray, stack: np.ndarray, rows: np.ndarray, first: int) -> tuple[np.ndarray, list[int]]:
        """The piece's allocs (at `rows`, ordinals from `first`): the positions among them with the same stack as a
        neighbour, and the ordinals of earlier pieces' allocs that have it."""
        order = np.lexsort((rows, tid))
        ts, ss = tid[order], stack[order]
        pair = np.zeros(order.size, dtype=bool)
        if order.size > 1:
            pair[1:] = (ts[1:] == ts[:-1]) & (ss[1:] == ss[:-1])
        same = np.zeros(order.size, dtype=bool)
        same[pair] = True
        same[:-1] |= pair[1:]
        earlier = []
        first_of_tid = np.ones(order.size, dtype=bool)
        first_of_tid[1:] = ts[1:] != ts[:-1]
        for k in np.flatnonzero(first_of_tid).tolist():
            prev = self.last.get(int(ts[k]))
            if prev is not None and prev[0] == int(ss[k]):
                same[k] = True
                earlier.append(prev[1])
        last_of_tid = np.ones(order.size, dtype=bool)
        last_of_tid[:-1] = ts[1:] != ts[:-1]
        for k in np.flatnonzero(last_of_tid).tolist():
            self.last[int(ts[k])] = (int(ss[k]), first + int(order[k]))
        return order[same], earlier


class Orphans:
    """The blocks allocated before the log (a free of an address not live): their frees' columns."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in ("addr", "free_i", "size", "block_size", "stream",
                                                                   "free_phase", "free_stack", "free_tid", "free_t",
                                                                   "deferred")}

    def piece(self, t: PieceTable, base: int, rows: np.ndarray) -> None:
        if not rows.size:
            return
        for name, values in (("addr", t.addr[rows]), ("free_i", base + rows), ("size", t.size[rows]),
                             ("block_size", t.block_size[rows]), ("stream", t.stream[rows]),
                             ("free_phase", t.phase[rows]), ("free_stack", t.stack[rows]), ("free_tid", t.tid[rows]),
                             ("free_t", t.time_ns[rows]), ("deferred", (t.flags[rows] & 1) != 0)):
            self.parts[name].append(np.asarray(values))

    def columns(self) -> dict[str, np.ndarray]:
        """In the blocks' order for those from before the log: by address, then free index."""
        # Empty, each column keeps the dtype its values would have: an int64 addr beside the blocks' uint64 ones would
        # make their concatenation float64 (addresses near 2**64 then round past it, and casting back warns).
        empty = {"addr": np.uint64, "deferred": np.bool_}
        cols = {k: (np.concatenate(v) if v else np.zeros(0, dtype=empty.get(k, np.int64))) for k, v in self.parts.items()}
        if cols["addr"].size:
            o = np.lexsort((cols["free_i"], cols["addr"]))
            cols = {k: v[o] for k, v in cols.items()}
        return cols


def before_log_events(scan: Scan) -> np.ndarray:
    """The replay events that stand for the blocks allocated before the log: an alloc of each (of a known size),
    in the blocks' order, in phase 0. Every replay of a log's run starts with them (the reserve section's, the
    OOM section's)."""
    from ...log.trace_events import ALLOC as EV_ALLOC
    from ...log.trace_events import EVENT_DTYPE

    o = scan.orphans
    pre = np.flatnonzero(o["size"] > 0)
    head = np.zeros(pre.size, dtype=EVENT_DTYPE)
    head["kind"] = EV_ALLOC
    head["addr"], head["size"], head["stream"] = o["addr"][pre], o["size"][pre], o["stream"][pre]
    return head


def _scatter(paired: Paired, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A per-row value of the piece's allocs as a column over the piece's alloc and free rows."""
    out = np.full(paired.rel.size, -1, dtype=np.int64)
    out[np.searchsorted(paired.rel, rows)] = values
    return out


# ---------------------------------------------------------------------------
# Markers and OOMs
# ---------------------------------------------------------------------------


class Markers:
    """The markers: the first `kept` as (index, label id, phase, time_ns), how many, and each label's first."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.rows: list[tuple[int, int, int, int]] = []
        self.first: dict[int, int] = {}  # label id -> its first marker's index
        self.count = 0

    def piece(self, t: Any, base: int) -> None:
        for r in np.flatnonzero(t.kind == MARKER).tolist():
            label = int(t.stack[r])
            self.first.setdefault(label, base + r)
            if len(self.rows) < self.kept:
                self.rows.append((base + r, label, int(t.phase[r]), int(t.time_ns[r])))
            self.count += 1

    def fields(self) -> dict[str, Any]:
        return {"markers": self.rows, "marker_count": self.count, "marker_first": self.first}


class Ooms:
    """The OOM records: the first `kept` as rows for the diagnosis, and how many. An OOM's policy is that of the
    last alloc before it; `expandable`: whether an expandable segment was made before it; `device`: its oom_device
    record, among the next two events before another OOM (the allocator writes it right after its oom record)."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.rows: list[dict[str, Any]] = []
        self.count = 0
        self.pending: list[tuple[dict[str, Any], int]] = []  # (row, events left) waiting for an oom_device record
        self.last_policy = -1  # of the last alloc read
        self.expandable_seen = False

    def piece(self, t: Any, base: int, c: np.ndarray, rw: np.ndarray) -> None:
        """`c`, `rw`: cum and raw after each event."""
        kind = t.kind
        self.pending = _device_records(self.pending, t, 0)  # those of the piece before
        allocs = np.flatnonzero(kind == ALLOC)
        expandable_rows = np.flatnonzero((kind == SEGMENT_ALLOC) & ((t.flags & SEGMENT_EXPANDABLE) != 0))
        for r in np.flatnonzero(kind == OOM).tolist():
            self.count += 1
            if len(self.rows) >= self.kept:
                continue
            before = int(np.searchsorted(allocs, r)) - 1
            code = int(t.policy[allocs[before]]) if before >= 0 else self.last_policy
            row = {"policy": POLICY_NAMES.get(code, "caching") if code >= 0 else "caching",
                   "expandable": int(self.expandable_seen or bool(expandable_rows.size and expandable_rows[0] < r)),
                   "index": base + r, "size": int(t.size[r]), "block_size": int(t.block_size[r]),
                   "addr": int(t.addr[r]), "stream": int(t.stream[r]), "stack": int(t.stack[r]),
                   "phase": int(t.phase[r]), "time_ns": int(t.time_ns[r]), "cum": int(c[r]), "raw": int(rw[r]),
                   "device": None}
            self.rows.append(row)
            self.pending += _device_records([(row, 2)], t, r + 1)
        if allocs.size:
            self.last_policy = int(t.policy[allocs[-1]])
        self.expandable_seen = self.expandable_seen or bool(expandable_rows.size)

    def fields(self) -> dict[str, Any]:
        return {"ooms": self.rows, "oom_count": self.count}


def _device_records(pending: list[tuple[dict[str, Any], int]], t: Any, start: int) -> list[tuple[dict[str, Any], int]]:
    """Each pending OOM's oom_device record, looked for from row `start` on: the rows still waiting."""
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
