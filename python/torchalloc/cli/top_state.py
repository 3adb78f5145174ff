"""What `torchalloc top` shows of one log, kept up to date record by record, in bounded memory.

`LiveState.refresh()` polls its `LiveReader` (top_reader.py) and folds in
the event records appended since: allocated and reserved now and at their
peaks, the live blocks (paired with their frees as the report pairs them:
analysis/passes/pieces.py `pair_piece`, with the blocks still live carried
from one piece to the next), the whole segments held (for the reserve
split), the open phases, the last marker and what each site held then, the
module current at each allocation, the last OOM, maps and unmaps per
second, and a sparkline of allocated. Everything kept is proportional to
what is live (blocks, segments, sites with live bytes) or bounded (the
sparkline's columns, the last MARKERS_KEPT markers), never to the log's
length: a viewer left running for days holds what the job holds now.

Reasons, as the report gives them (saved for backward, freed on
rebinding ...), need each block's future (how it was freed); a live view
has not seen it for the blocks live now, so a site says which phase made
its live bytes and how its blocks freed so far were freed (the report's
rules on their alloc and free stacks: analysis/rules/classify.py), which for a
line run every step is how its live blocks will go.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

from .. import _lib
from .._records import (
    POLICY_NAMES,
    MARKER,
    MODULE,
    MODULE_NAME,
    MODULE_TAG,
    OOM,
    OOM_DEVICE,
    PHASE_BEGIN,
    PHASE_END,
    SEGMENT_ALLOC,
    SEGMENT_EXPANDABLE,
    SEGMENT_FREE,
)
from ..analysis.passes.pieces import Carry, Piece, PieceTable, pair_piece, report_start_ns
from ..analysis.rules.classify import Reason, classify_stacks
from ..analysis.rules.frames import Frame, user_suffix
from ..analysis.rules.roles import phase_role
from ..analysis.rules.sites import NO_PYTHON, NO_STACKS
from ..analysis.sections.leaks import Leak, Trends, marker_kind, step_kind
from ..analysis.sections.ooms.diagnosis import handle_for, oom_detail
from ..oom import parse_advice
from ..log.checks import MAX_TIME_NS
from .top_reader import LiveReader

MARKERS_KEPT = 16  # markers whose per-site live bytes are kept (what grew from one to the next)
MARKER_KINDS_KEPT = 8  # kinds of markers ("step N") followed for leaks; the least frequent beyond go
SPARK_COLUMNS = 120  # the sparkline's columns: at most 1 s each, so the last 2 minutes
SPARK_WIDEST_NS = 1_000_000_000
SPARK_FIRST_NS = SPARK_WIDEST_NS >> 7  # a column's first width (7.8 ms, doubling 7 times to 1 s): a short run fills
# the line too
VERDICTS = {1: "fragmentation", 2: "capacity", 3: "held elsewhere"}

_CARRY = {"addr": np.uint64, "block_size": np.int64, "stack": np.int64, "phase": np.int64, "module": np.int64,
          "seq": np.int64, "in_bw": np.int64}
_EVENTS = (SEGMENT_ALLOC, SEGMENT_FREE, PHASE_BEGIN, PHASE_END, MARKER, OOM, OOM_DEVICE, MODULE_NAME)


class Sparkline:
    """The highest allocated in each of SPARK_COLUMNS columns of time. Columns start 7.8 ms wide and double
    (pairs merge) until the run fits, up to 1 s; past that the oldest column drops off as a new one starts."""

    def __init__(self, origin_ns: int) -> None:
        self.origin = origin_ns
        self.width = SPARK_FIRST_NS
        self.values = np.full(SPARK_COLUMNS, -1, dtype=np.int64)  # -1: no event in the column

    def add(self, times: np.ndarray, values: np.ndarray) -> None:
        if not times.size:
            return
        last = int(times.max())
        while (last - self.origin) // self.width >= SPARK_COLUMNS and self.width < SPARK_WIDEST_NS:
            pairs = self.values.reshape(-1, 2).max(axis=1)
            self.values = np.concatenate((pairs, np.full(SPARK_COLUMNS - pairs.size, -1, dtype=np.int64)))
            self.width *= 2
        shift = (last - self.origin) // self.width - (SPARK_COLUMNS - 1)
        if shift > 0:
            dropped = min(shift, SPARK_COLUMNS)
            self.values = np.concatenate((self.values[dropped:], np.full(dropped, -1, dtype=np.int64)))
            self.origin += shift * self.width
        col = (times.astype(np.int64) - self.origin) // self.width
        keep = col >= 0
        np.maximum.at(self.values, col[keep], values[keep])

    def columns(self) -> np.ndarray:
        """The columns from the first with an event to the last; a column without one holds the level before it."""
        seen = np.flatnonzero(self.values >= 0)
        if not seen.size:
            return np.zeros(0, dtype=np.int64)
        v = self.values[seen[0]: seen[-1] + 1]
        idx = np.where(v >= 0, np.arange(v.size), 0)
        return v[np.maximum.accumulate(idx)]


@dataclasses.dataclass
class Oom:
    """The last out-of-memory the log recorded (its oom record, and the oom_device record after it)."""

    t_ns: int
    requested: int
    reserved: int
    phase: str
    site: str
    device_free: int
    phase_id: int
    allocated: int | None = None
    device_total: int | None = None
    verdict: str = "unknown (the log predates the verdict record)"
    advice: str | None = None  # the allocator's first line of advice for the failure's numbers


@dataclasses.dataclass
class MarkerSnap:
    """A marker, and the live bytes of each site as it was written."""

    label: str
    t_ns: int
    sites: dict[str, int]


class LiveState:
    """One log's figures, as of the records read so far (see the module's docstring)."""

    def __init__(self, reader: LiveReader) -> None:
        self.reader = reader
        self.t0 = min(reader.header.created_monotonic_ns, MAX_TIME_NS)  # until the first record (_start_at)
        self.carry = Carry.empty(_CARRY)
        self.ordinals = 0
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.peak_allocated_ns = self.peak_reserved_ns = self.t0
        self.last_ns = self.t0
        self.records = 0  # event records read
        self.whole_segments: dict[int, int] = {}  # segments of their own (not expandable runs): address -> bytes
        self.segments: dict[int, int] = {}  # every mapped segment or run, address -> bytes (for an OOM's advice)
        self.saw_expandable = False
        self.policy = 0  # of the last alloc read: the policy an OOM failed in
        self.open_phases: list[int] = []
        self.phase_names: dict[int, str] = {0: "default"}
        self.module_names: dict[int, str] = {}
        self.module = 0  # the module current after the last record read
        self.markers: collections.deque[MarkerSnap] = collections.deque(maxlen=MARKERS_KEPT)
        # leaks (analysis/sections/leaks.py): the markers of each kind feed that kind's trends; which kind is the step
        # kind is decided when asked, by the rule of leaks.step_markers on the markers seen so far
        self.marker_kinds: dict[str, int] = {}
        self.trends: dict[str, Trends] = {}
        self.oom: Oom | None = None
        self.maps = self.unmaps = 0  # in the last refresh
        self.window_ns = 0  # the time the last refresh's records span
        self.before_log_frees = 0  # frees of blocks allocated before the log was opened
        self.has_stacks = False
        self.spark = Sparkline(self.t0)
        self.writer = reader.writer
        self._site_of_stack: dict[int, str] = {}
        self.freed_as: dict[str, dict[str, int]] = {}  # site -> reason -> bytes of its blocks freed so far
        self._pair_reason: dict[int, str | None] = {}  # (alloc stack, free stack, saved for backward) -> reason
        self._backward_phase: dict[int, bool] = {}
        self.backward_depth = 0  # backward-like phase occurrences open after the last record read

    def refresh(self) -> None:
        """Read what the writer appended since the last refresh and fold it in."""
        self.maps = self.unmaps = 0
        before = self.last_ns
        self.reader.poll(self._piece)
        self.writer = self.reader.writer
        self.window_ns = self.last_ns - before

    def _start_at(self, first_ns: int) -> None:
        """Time zero as the report takes it (pieces.report_start_ns), once the first record is known: the
        log's opening, unless the header's clock is not the records' (a damaged or hand-made header)."""
        opened = self.reader.header.created_monotonic_ns
        self.t0 = report_start_ns(opened if opened <= MAX_TIME_NS else None, first_ns)
        self.peak_allocated_ns = self.peak_reserved_ns = self.last_ns = self.t0
        self.spark = Sparkline(self.t0)

    def _piece(self, records: np.ndarray) -> None:
        """Fold in one piece of event records, in parts that end at markers and oom_device records: a marker sees
        the blocks live as it was written, an OOM's advice those live at the failure (its oom_device record is
        written right after it)."""
        if not self.records and len(records):
            self._start_at(int(records["time_ns"][0]))
        self.records += len(records)
        cuts = np.flatnonzero(np.isin(records["kind"], (MARKER, OOM_DEVICE))) + 1
        for part in np.split(records, cuts):
            if len(part):
                self._part(part)

    def _part(self, records: np.ndarray) -> None:
        t = PieceTable(records)
        n = len(t)
        kind = t.kind
        # the module current at each record: the last module record before it, else the one before the piece
        is_module = kind == MODULE
        last = np.maximum.accumulate(np.where(is_module, np.arange(n), -1))
        module = np.where(last >= 0, t.size[np.maximum(last, 0)], self.module)
        if is_module.any():
            self.module = int(module[-1])
        paired = pair_piece(Piece(t, 0), self.carry, self.ordinals)
        nr, es, ea = paired.new_rows, paired.ended_src, paired.ended_at
        self.has_stacks = self.has_stacks or bool(np.any(t.stack[nr] != 0))
        if nr.size:
            self.policy = int(t.policy[nr[-1]])
        delta = np.zeros(n, dtype=np.int64)
        delta[nr] += t.block_size[nr]
        comb_size = paired.combined(self.carry["block_size"], t.block_size)
        delta[ea] -= comb_size[es]
        # a free of a block allocated before the log: it was never counted, so it takes nothing off
        self.before_log_frees += paired.orphan_rows.size
        in_bw = self._inside_backward(t)
        comb_bw = paired.combined(self.carry["in_bw"], in_bw)
        real = paired.ended_real
        if real.any() and self.has_stacks:  # saved for backward: allocated outside, freed inside it (rule 2)
            self._freed(paired.combined(self.carry["stack"], t.stack)[es[real]], t.stack[ea[real]],
                        (in_bw[ea[real]] == 1) & (comb_bw[es[real]] == 0), comb_size[es[real]])
        allocated = self.allocated + np.cumsum(delta)
        seg = np.where(kind == SEGMENT_ALLOC, t.size, np.where(kind == SEGMENT_FREE, -t.size, 0))
        reserved = self.reserved + np.cumsum(seg)
        times = t.time_ns
        top = int(np.argmax(allocated))
        if allocated[top] > self.peak_allocated:
            self.peak_allocated, self.peak_allocated_ns = int(allocated[top]), int(times[top])
        top = int(np.argmax(reserved))
        if reserved[top] > self.peak_reserved:
            self.peak_reserved, self.peak_reserved_ns = int(reserved[top]), int(times[top])
        self.allocated, self.reserved = int(allocated[-1]), int(reserved[-1])
        self.last_ns = max(self.last_ns, int(times.max()))
        self.spark.add(times, allocated)
        live = paired.live_src
        self.carry = Carry({"addr": np.concatenate((self.carry["addr"], t.addr[paired.rel]))[live],
                            "block_size": comb_size[live],
                            "stack": paired.combined(self.carry["stack"], t.stack)[live],
                            "phase": paired.combined(self.carry["phase"], t.phase.astype(np.int64))[live],
                            "module": paired.combined(self.carry["module"], module)[live],
                            "seq": paired.combined(self.carry["seq"], t.seq)[live],
                            "in_bw": comb_bw[live]})
        self.ordinals += nr.size
        tags = np.flatnonzero(kind == MODULE_TAG)
        if tags.size:
            self._tag(t.addr[tags], t.size[tags], t.seq[tags])
        rows = np.flatnonzero(np.isin(kind, _EVENTS))
        if rows.size:  # phases, segments, markers ...: a tenth of a log's records; plain ints are read fastest
            columns = (kind[rows], t.time_ns[rows], t.addr[rows], t.size[rows], t.block_size[rows], t.flags[rows],
                       t.stack[rows], t.phase[rows], t.stream[rows])
            for event in zip(*(c.tolist() for c in columns)):
                self._event(*event)

    def _event(self, kind: int, time_ns: int, addr: int, size: int, block_size: int, flags: int, stack: int,
               phase: int, stream: int) -> None:
        if kind == SEGMENT_ALLOC:
            self.maps += 1
            self.segments[addr] = size
            if flags & SEGMENT_EXPANDABLE:
                self.saw_expandable = True
            else:
                self.whole_segments[addr] = size
        elif kind == SEGMENT_FREE:
            self.unmaps += 1
            self.segments.pop(addr, None)
            self.whole_segments.pop(addr, None)
        elif kind == PHASE_BEGIN:
            if phase not in self.phase_names:
                self.phase_names[phase] = self.reader.strings.get(stack, f"phase{phase}")
            self.open_phases.append(phase)
        elif kind == PHASE_END:
            if phase in self.open_phases:  # the innermost occurrence of it ends (phases nest)
                del self.open_phases[len(self.open_phases) - 1 - self.open_phases[::-1].index(phase)]
        elif kind == MARKER:
            self._marker(self.reader.strings.get(stack, ""), time_ns)
        elif kind == OOM:
            self.oom = Oom(time_ns, size, block_size, self.phase_names.get(phase, "?"), self.site_of(stack), addr,
                           phase)
        elif kind == OOM_DEVICE and self.oom is not None:
            self.oom.allocated, self.oom.device_total = block_size, addr
            self.oom.verdict = VERDICTS.get(flags, "unknown")
            self.oom.advice = self._advice(self.oom, limit=size, largest_free=stream, handle=stack)
        elif kind == MODULE_NAME:
            self.module_names[size] = self.reader.strings.get(stack, "")

    def _inside_backward(self, t: PieceTable) -> np.ndarray:
        """Per record, 1 while an occurrence of a backward-like phase (analysis/rules/roles.py) is open, as the report
        counts it: by the phase records, not by the phase a record names (autograd's thread names none)."""
        kind = t.kind
        begins = np.flatnonzero(kind == PHASE_BEGIN)
        for phase, row in zip(*np.unique(t.phase[begins], return_index=True)):  # names of phases not seen yet
            if int(phase) not in self._backward_phase:
                name = self.reader.strings.get(int(t.stack[begins[row]]), "")
                self._backward_phase[int(phase)] = phase_role(name) == "backward"
        marks = np.flatnonzero((kind == PHASE_BEGIN) | (kind == PHASE_END))
        step = np.zeros(len(t), dtype=np.int64)
        if marks.size:
            ids, inverse = np.unique(t.phase[marks], return_inverse=True)
            backward = np.array([self._backward_phase.get(int(p), False) for p in ids.tolist()], dtype=bool)
            step[marks] = np.where(backward[inverse], np.where(kind[marks] == PHASE_BEGIN, 1, -1), 0)
        depth = self.backward_depth + np.cumsum(step)
        if len(t):
            self.backward_depth = max(int(depth[-1]), 0)
        return (np.maximum(depth, 0) > 0).astype(np.int64)

    def _freed(self, a_stack: np.ndarray, f_stack: np.ndarray, saved: np.ndarray, size: np.ndarray) -> None:
        """Blocks freed in the piece, by their alloc and free stacks: each (alloc stack, free stack, saved for
        backward) triple is classified once, its bytes added to its site's reasons."""
        key = (a_stack.astype(np.int64) << 32) | (f_stack.astype(np.int64) << 1) | saved.astype(np.int64)
        keys, inverse = np.unique(key, return_inverse=True)
        total = np.bincount(inverse, weights=size, minlength=keys.size)
        for k, b in zip(keys.tolist(), total.tolist()):
            reason = self._reason(k)
            if reason is None:
                continue
            counts = self.freed_as.setdefault(self.site_of(k >> 32), {})
            counts[reason] = counts.get(reason, 0) + int(b)

    def _reason(self, key: int) -> str | None:
        """The report's reason for a block of this (alloc stack, free stack, saved) key; None without stacks (the
        report's phase rules need the occurrences, which the view does not keep)."""
        if key not in self._pair_reason:
            alloc, free, saved = key >> 32, (key >> 1) & 0x7FFFFFFF, key & 1
            a, f = self.reader.stacks.get(alloc), self.reader.stacks.get(free)
            if saved:
                reason: str | None = str(Reason.SAVED_FOR_BACKWARD)
            elif not a or not f:
                reason = None
            else:
                reason = str(classify_stacks(tuple(Frame(*x) for x in a), tuple(Frame(*x) for x in f)).reason)
            self._pair_reason[key] = reason
        return self._pair_reason[key]

    def site_reasons(self) -> dict[str, str]:
        """Per site, how most of its blocks freed so far were freed (bytes), as the report would say."""
        return {site: max(counts, key=lambda r: counts[r]) for site, counts in self.freed_as.items() if counts}

    def _tag(self, addr: np.ndarray, module: np.ndarray, seq: np.ndarray) -> None:
        """module_tag records: the live block holding each address belongs to the tag's module (a parameter, its
        gradient, optimizer state: the tag beats the module current at the allocation). A block still live after
        the piece was live at a tag written after its alloc (its seq is lower)."""
        if not len(self.carry):
            return
        order = np.argsort(self.carry["addr"], kind="stable")
        start = self.carry["addr"][order]
        k = np.searchsorted(start, addr, side="right") - 1
        hit = k >= 0
        block = order[np.maximum(k, 0)]
        hit &= addr < start[np.maximum(k, 0)] + self.carry["block_size"][block].astype(np.uint64)
        hit &= self.carry["seq"][block] < seq
        for b, m in zip(block[hit].tolist(), module[hit].tolist()):  # in the log's order: a later tag wins
            self.carry["module"][b] = m

    def _advice(self, o: Oom, limit: int, largest_free: int, handle: int) -> str | None:
        """The allocator's first line of advice for the failure, as the report gives it
        (analysis/sections/ooms/diagnosis.py): the library's rule on the failure's numbers and the segments and
        blocks live then. None without the library."""
        facts = dict(requested=o.requested, allocated=o.allocated or 0, reserved=o.reserved,
                     device_total=o.device_total or 0, device_free=o.device_free, limit=limit, largest_free=largest_free)
        detail = oom_detail(self.segments, self.carry["addr"], self.carry["block_size"], self.carry["phase"],
                            o.phase_id, POLICY_NAMES.get(self.policy, "caching"), int(self.saw_expandable),
                            handle_for(o.requested, handle))
        try:
            lines = parse_advice(_lib.oom_advice(facts, detail, self.phase_names))
        except (_lib.LibraryError, OSError):  # no library here: the report says where to get it
            return None
        return f"{lines[0].number}. {lines[0].text}" if lines else None

    def _marker(self, label: str, time_ns: int) -> None:
        snap = MarkerSnap(label, time_ns, self.site_bytes())
        self.markers.append(snap)
        kind = marker_kind(label)
        self.marker_kinds[kind] = self.marker_kinds.get(kind, 0) + 1
        self.trends.setdefault(kind, Trends()).marker(label, self.seconds(time_ns), snap.sites)
        if len(self.trends) > MARKER_KINDS_KEPT:
            step = self.step_kind()
            rare = min((k for k in self.trends if k != step), key=lambda k: self.marker_kinds[k])
            del self.trends[rare], self.marker_kinds[rare]

    def step_kind(self) -> str | None:
        """The kind of the step markers among those seen so far (leaks.step_kind), None before one repeats."""
        return step_kind(self.marker_kinds)

    def step_markers(self) -> int:
        """The step markers seen so far (of the step kind; 0 before one repeats)."""
        step = self.step_kind()
        return self.trends[step].fed if step is not None else 0

    def leaks(self) -> list[Leak]:
        """The leaks by the rule of analysis/sections/leaks.py over the step markers seen so far ([] before it has the
        markers it needs)."""
        step = self.step_kind()
        return self.trends[step].leaks(lambda site: (site, site)) if step is not None else []

    # -- what the frame shows ---------------------------------------------------------------------------------

    def site_of(self, stack: int) -> str:
        """A stack's site, as the report labels it: the innermost frame of the user's code."""
        label = self._site_of_stack.get(stack)
        if label is None:
            frames = self.reader.stacks.get(stack)
            if not frames:
                return NO_PYTHON.label if self.has_stacks else NO_STACKS.label
            label = Frame(*user_suffix(tuple(Frame(*f) for f in frames))[0]).short()
            self._site_of_stack[stack] = label
        return label

    def _grouped(self, key: np.ndarray, name: Any) -> dict[str, tuple[int, int]]:
        """Live bytes and blocks per value of a carry column, named by `name(value)` (values of one name add up)."""
        values, inverse = np.unique(key, return_inverse=True)
        size = np.bincount(inverse, weights=self.carry["block_size"], minlength=values.size)
        count = np.bincount(inverse, minlength=values.size)
        out: dict[str, tuple[int, int]] = {}
        for v, b, c in zip(values.tolist(), size.tolist(), count.tolist()):
            label = name(v)
            had = out.get(label, (0, 0))
            out[label] = (had[0] + int(b), had[1] + int(c))
        return out

    def by_site(self) -> dict[str, tuple[int, int]]:
        """Live (bytes, blocks) per allocation site."""
        return self._grouped(self.carry["stack"], self.site_of)

    def site_bytes(self) -> dict[str, int]:
        return {site: b for site, (b, _) in self.by_site().items()}

    def by_phase(self) -> dict[str, tuple[int, int]]:
        """Live (bytes, blocks) per phase that allocated them."""
        return self._grouped(self.carry["phase"], lambda p: self.phase_names.get(p, f"phase{p}"))

    def by_module(self) -> dict[str, tuple[int, int]]:
        """Live (bytes, blocks) per module: the one tagging the block, else the one current at its allocation."""
        return self._grouped(self.carry["module"],
                             lambda m: "(no module)" if m == 0 else self.module_names.get(m, f"module {m}"))

    def site_phases(self) -> dict[str, str]:
        """Per site, the phase that made the most of its live bytes."""
        best: dict[str, tuple[int, str]] = {}
        pairs = np.stack((self.carry["stack"], self.carry["phase"]), axis=1) if len(self.carry) else np.zeros((0, 2))
        keys, inverse = np.unique(pairs, axis=0, return_inverse=True)
        size = np.bincount(inverse.reshape(-1), weights=self.carry["block_size"], minlength=len(keys))
        for (stack, phase), b in zip(keys.astype(np.int64).tolist(), size.tolist()):
            site = self.site_of(stack)
            if b > best.get(site, (-1, ""))[0]:
                best[site] = (int(b), self.phase_names.get(phase, f"phase{phase}"))
        return {site: phase for site, (_, phase) in best.items()}

    def reserve_split(self) -> tuple[int, int, int]:
        """Reserved now, beyond allocated: (fragmentation: free bytes of whole segments holding live blocks,
        cache: whole segments holding none, mapped free: the rest, free granules of expandable segments)."""
        starts = np.array(sorted(self.whole_segments), dtype=np.uint64)
        sizes = np.array([self.whole_segments[int(s)] for s in starts], dtype=np.int64)
        addr = self.carry["addr"]
        seg = np.searchsorted(starts, addr, side="right") - 1
        inside = seg >= 0
        inside[inside] = addr[inside] < starts[seg[inside]] + sizes[seg[inside]].astype(np.uint64)
        held = np.zeros(starts.size, dtype=bool)
        held[seg[inside]] = True
        in_whole = int(self.carry["block_size"][inside].sum())
        fragmentation = int(sizes[held].sum()) - in_whole
        cache = int(sizes[~held].sum())
        mapped_free = self.reserved - int(sizes.sum()) - (self.allocated - in_whole)
        return fragmentation, cache, max(mapped_free, 0)

    def current_phase(self) -> str:
        return " > ".join(self.phase_names.get(p, f"phase{p}") for p in self.open_phases) or "default"

    def seconds(self, t_ns: int) -> float:
        return (t_ns - self.t0) / 1e9
