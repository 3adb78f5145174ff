"""The second pass: every block classified as it ends, the timeline's curves, and the moments.

Takes a `ChunkedLog`, the first pass' `Scan` (first.py), the moments the
report shows (`Wanted`) and the sections' followers (follow.py); reads
the log again piece by piece and gives a `Passed`:

- per block, as it is allocated, its site and category (rules/blocks.py),
  and as it ends (or at the end of the log, when it never does) its reason;
- at each wanted moment, the blocks live then (in the blocks' order:
  blocks allocated before the log first, then by allocation): all of
  them for an anatomy (a section's moments among them), the `PER_MOMENT`
  largest for the HTML page; a block still live at the moment gets its
  reason when it ends;
- at the timeline's samples, allocated per phase and the live block count;
- the pieces handed to the sections' followers as it goes (follow.py says
  which hooks, when): what a section adds up -- the lifetime rows, the
  phase sums, the estimate's terms, the segments at each OOM, the reserve,
  memory by module -- is its follower's. The pass names no section, and
  carries the columns each follower adds to its blocks.

Nothing is kept per block but a few bytes (`Scan.bits`); a block's details
(details.py) are kept only when a moment or the page shows it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ..._records import ALLOC, SEGMENT_ALLOC, SEGMENT_FREE
from ...log.chunks import ChunkedLog
from ..rules.blocks import BIT_WITHIN, BlockRules, LineRuns
from ..rules.categorize import CATEGORY_CODE, Category
from ..rules.classify import REASON_CODE, Reason
from ..rules.sites import BEFORE_LOG
from .details import detail_alloc, detail_ended, detail_orphan
from .first import INT_MAX, Scan
from .follow import Follower, FreedOrphans, end_columns
from .pieces import Carry, Piece, device_pieces, pair_piece

R = REASON_CODE
_BT_COLUMNS = ("ordinal", "addr", "alloc_i", "size", "block_size", "stream", "phase", "stack", "tid", "time", "site",
               "category", "occ", "bits", "chain", "line", "end", "reason", "free_site", "returned", "rerun", "real")


@dataclasses.dataclass
class Wanted:
    """The moments the report shows, known after the first pass."""

    anatomy: list[int]  # event indices whose live blocks are kept (anatomies; the moments sections ask for)
    page: np.ndarray  # the HTML page's moments (sorted), or empty
    priority: set[int]  # of those, the ones whose PER_MOMENT largest are always held
    samples: np.ndarray  # the timeline's sample indices
    per_moment: int = 100


@dataclasses.dataclass
class Passed:
    """What the second pass gathered (module docstring)."""

    rules: BlockRules
    alloc_stacks: np.ndarray  # every block's alloc stack, unique
    rest_pairs: np.ndarray  # (alloc, free) stack pairs the stack rules saw, unique
    alloc_phases: set[int]  # the phases that allocated a block
    snapshots: dict[int, dict[str, np.ndarray]]  # moment -> live blocks (columns), for anatomies and sections
    page: dict[int, np.ndarray]  # moment -> its ranked largest live blocks (block indices)
    live_at: dict[int, int]  # moment -> live blocks
    details: dict[int, dict[str, Any]]  # block index -> its details (shown blocks)
    by_phase: dict[int, np.ndarray]  # phase -> allocated at each sample
    before_log: np.ndarray | None  # allocated by blocks from before the log, at each sample
    reasons: dict[int, int]  # block index -> reason (blocks a moment showed)
    levels_at: dict[int, tuple[int, int, int]]  # moment -> (cum, raw, time_ns) as Scan keeps them


def run_pass(log: ChunkedLog, scan: Scan, wanted: Wanted, progress: Any = None, rules: BlockRules | None = None,
             followers: Sequence[Follower] = ()) -> Passed:
    """The second pass; `rules`: those of an earlier pass over the same log (a pass for more moments), so that
    site ids mean the same; `followers`: the sections' parts of the pass (follow.py), fed as it goes, in
    this order."""
    return _Pass(log, scan, wanted, progress, rules, followers).run()


class _Pass:
    def __init__(self, log: ChunkedLog, scan: Scan, wanted: Wanted, progress: Any, rules: BlockRules | None,
                 followers: Sequence[Follower]) -> None:
        self.log, self.scan, self.wanted, self.progress = log, scan, wanted, progress
        self.followers = list(followers)
        extra = [c for f in self.followers for c in f.columns]  # the block table's columns the followers add
        assert len(set(extra)) == len(extra) and not set(extra) & set(_BT_COLUMNS), f"columns named twice: {extra}"
        self.columns = _BT_COLUMNS + tuple(extra)
        if rules is None:
            rules = BlockRules(log.stacks, log.phase_names, scan.has_stacks, scan.first_begin)
            rules.set_param_sizes(scan.persistent)
        self.rules = rules
        self.O = len(scan.orphans["addr"])
        self.orphan_rank = {(int(a), int(f)): k for k, (a, f) in
                            enumerate(zip(scan.orphans["addr"].tolist(), scan.orphans["free_i"].tolist()))}
        self.occ_rows: dict[int, np.ndarray] = {}  # phase -> its occurrence rows (by begin)
        if scan.occ_phase.size:
            order = np.argsort(scan.occ_phase, kind="stable")
            ph = scan.occ_phase[order]
            cut = np.flatnonzero(np.concatenate(([True], ph[1:] != ph[:-1], [True])))
            for a, b in zip(cut[:-1].tolist(), cut[1:].tolist()):
                self.occ_rows[int(ph[a])] = order[a:b]
        self.alloc_stack_set: list[np.ndarray] = [np.zeros(1, dtype=np.int64)] if self.O else []
        self.rest_pair_set: list[np.ndarray] = []
        self.alloc_phases: set[int] = set()
        self.lines = LineRuns()
        self.snapshots: dict[int, dict[str, np.ndarray]] = {}
        self.page: dict[int, np.ndarray] = {}
        self.live_at: dict[int, int] = {}
        self.details: dict[int, dict[str, Any]] = {}
        self.watch: dict[int, int] = {}  # ordinal -> block index, for blocks whose end a moment needs
        self.reasons: dict[int, int] = {}
        samples = wanted.samples
        self.samples = samples
        self.by_phase: dict[int, np.ndarray] = {}
        self.phase_level: dict[int, int] = {}
        self.before_level = scan.initial
        self.before_curve = np.zeros(samples.size, dtype=np.int64) if self.O else None
        self.live_count = self.O
        self.cum = self.raw = 0
        self.levels_at: dict[int, tuple[int, int, int]] = {}
        anatomy = set(wanted.anatomy)
        self.moments = np.array(sorted(anatomy | set(wanted.page.tolist()) | set(samples.tolist())), dtype=np.int64)
        self.anatomy_moments = anatomy
        self.page_moments = set(wanted.page.tolist())

    # ------------------------------------------------------------------
    def run(self) -> Passed:
        scan = self.scan
        carry = Carry({c: np.zeros(0, dtype=np.int64) for c in self.columns})
        carry.columns["addr"] = np.zeros(0, dtype=np.uint64)
        ordinals = 0
        for piece in device_pieces(self.log, scan.device):
            carry = self._piece(piece, carry, ordinals)
            ordinals = int(carry.columns.pop("_next"))  # type: ignore[call-overload]
            if self.progress is not None:
                self.progress(piece.base + len(piece))
        self._finish(carry)
        for f in self.followers:
            f.finish(carry.columns)
        alloc_stacks = np.unique(np.concatenate(self.alloc_stack_set)) if self.alloc_stack_set else np.zeros(0, np.int64)
        rest_pairs = (np.unique(np.concatenate(self.rest_pair_set), axis=0) if self.rest_pair_set
                      else np.zeros((0, 2), dtype=np.int64))
        return Passed(self.rules, alloc_stacks, rest_pairs, self.alloc_phases, self.snapshots, self.page,
                      self.live_at, self.details, self.by_phase, self.before_curve, self.reasons, self.levels_at)

    # ------------------------------------------------------------------
    def _piece(self, piece: Piece, carry: Carry, next_ordinal: int) -> Carry:
        t, base, m = piece.table, piece.base, len(piece)
        self._t, self._base = t, base
        scan, rules = self.scan, self.rules
        paired = pair_piece(piece, carry, next_ordinal)
        nr = paired.new_rows
        nc = len(carry)
        # the piece's blocks: the carried ones, then the new ones (both by ordinal)
        new = {
            "ordinal": paired.new_ordinals, "addr": t.addr[nr], "alloc_i": base + nr, "size": t.size[nr],
            "block_size": t.block_size[nr], "stream": t.stream[nr].astype(np.int64), "phase": t.phase[nr].astype(np.int64),
            "stack": t.stack[nr], "tid": t.tid[nr], "time": t.time_ns[nr],
        }
        new["bits"] = scan.bits[paired.new_ordinals].astype(np.int64)
        new["site"] = rules.site_ids(new["stack"])
        new["category"] = rules.categories(new["bits"].astype(np.uint8), new["stack"], new["phase"], new["alloc_i"],
                                           new["block_size"], new["size"]).astype(np.int64)
        new["occ"] = self._occurrences(new["phase"], new["alloc_i"])
        new["chain"], new["line"] = (rules.chain_and_line(new["stack"]) if scan.has_stacks
                                     else (np.full(nr.size, -1), np.full(nr.size, -1)))
        new["end"] = np.full(nr.size, INT_MAX, dtype=np.int64)
        for name in ("reason", "free_site", "returned", "rerun", "real"):  # set when it ends
            new[name] = np.full(nr.size, -1, dtype=np.int64)
        for f in self.followers:  # every piece, new blocks or not: a follower reads the piece's records too
            got = f.new_blocks(t, base, nr)
            for c, default in f.columns.items():
                new[c] = got[c] if c in got else np.full(nr.size, default, dtype=np.int64)
        bt = {c: np.concatenate((carry[c], new[c])) for c in self.columns}
        is_alloc_rel = t.kind[paired.rel] == ALLOC
        bt_of = np.concatenate((np.arange(nc), np.where(is_alloc_rel, nc + np.cumsum(is_alloc_rel) - 1, -1)))
        ended = bt_of[paired.ended_src]
        end_rows = paired.ended_at
        bt["end"][ended] = base + end_rows
        for f in self.followers:  # what a follower learns of a block before its end is known before its end
            f.piece(bt, t, base)
        self.alloc_stack_set.append(np.unique(new["stack"]))
        self.lines.piece(bt["chain"][nc:], bt["line"][nc:], bt["alloc_i"][nc:])
        self.alloc_phases.update(np.unique(new["phase"]).tolist())
        # ended blocks: their reasons
        self._ended(bt, ended, end_rows, paired.ended_real, t, base)
        orow = paired.orphan_rows
        self._orphans(orow, t, base)
        for f in self.followers:
            f.step(bt, nc, ended, base + end_rows, base, m)
        # the timeline's per-phase curves and live counts, the moments
        self._levels(bt, nc, ended, end_rows, orow, t, base, m)
        live = np.flatnonzero(bt["end"] == INT_MAX)
        out = Carry({c: bt[c][live] for c in self.columns})
        out.columns["_next"] = np.int64(next_ordinal + nr.size)  # type: ignore[assignment]
        return out

    def _occurrences(self, phases: np.ndarray, alloc_i: np.ndarray) -> np.ndarray:
        """The latest occurrence of each block's phase begun at or before its alloc (-1: none)."""
        s = self.scan
        out = np.full(phases.size, -1, dtype=np.int64)
        for p in np.unique(phases).tolist():
            rows = self.occ_rows.get(p)
            if rows is None:
                continue
            sel = phases == p
            k = np.searchsorted(s.occ_begin[rows], alloc_i[sel], side="right") - 1
            out[sel] = np.where(k >= 0, rows[np.maximum(k, 0)], -1)
        return out

    def _ended(self, bt: dict[str, np.ndarray], ended: np.ndarray, rows: np.ndarray, real: np.ndarray, t: Any,
               base: int) -> None:
        """Blocks that ended in this piece: their reason (rules/classify.py's rules), handed to the followers."""
        if not ended.size:
            return
        rules = self.rules
        bits = bt["bits"][ended].astype(np.uint8)
        free_stack = np.where(real, t.stack[rows], 0)
        free_phase = t.phase[rows].astype(np.int64)
        alloc_phase = bt["phase"][ended]
        reason = np.full(ended.size, R[Reason.OTHER], dtype=np.int64)
        free_site = np.full(ended.size, -1, dtype=np.int64)
        returned = np.full(ended.size, -1, dtype=np.int64)
        rerun = np.zeros(ended.size, dtype=bool)
        saved = rules.saved(bits)
        reason[saved] = R[Reason.SAVED_FOR_BACKWARD]
        rest = np.flatnonzero(~saved)
        if self.scan.has_stacks:
            if rest.size:
                a_st, f_st = bt["stack"][ended][rest], free_stack[rest]
                self.rest_pair_set.append(np.unique(np.stack((a_st, f_st), axis=1), axis=0))
                r_, fs, ret, temp = rules.stack_rules(a_st, f_st)
                again = np.zeros(rest.size, dtype=bool)
                if temp.any():
                    tt = np.flatnonzero(temp)
                    e = ended[rest[tt]]
                    again[tt] = self.lines.ran_again(bt["chain"][e], bt["alloc_i"][e], base + rows[rest[tt]])
                r_ = np.where(again, R[Reason.REBINDING], r_)
                reason[rest], free_site[rest], returned[rest], rerun[rest] = r_, fs, ret, again
        else:
            occ = bt["occ"][ended][rest]
            within = np.where(occ >= 0, (bits[rest] & BIT_WITHIN) != 0, free_phase[rest] == alloc_phase[rest])
            reason[rest] = np.where(within, R[Reason.SAME_PHASE], R[Reason.LATER_PHASE])
        # a phase-based reason ("freed within its phase") is wrong for a block that outlived all the work; a stack
        # rule (rebinding, a function's return) still says better why it was freed
        by_phase = np.isin(reason, [R[r] for r in (Reason.SAME_PHASE, Reason.LATER_PHASE, Reason.OTHER)])
        reason[self._whole_run(bt["alloc_i"][ended], base + rows) & by_phase] = R[Reason.PERSISTENT]
        bt["reason"][ended], bt["free_site"][ended], bt["returned"][ended] = reason, free_site, returned
        bt["rerun"][ended], bt["real"][ended] = rerun, real
        if self.followers:
            ends = end_columns(t, base, rows, real, free_site, returned, rerun, reason)
            for f in self.followers:
                f.ended(bt, ended, ends)
        # blocks a moment or the page showed: their end
        self._resolve(bt, ended, rows, real, t, base, reason, free_site, returned, rerun)

    def _whole_run(self, alloc_i: np.ndarray, free_i: np.ndarray) -> np.ndarray:
        """Freed blocks that lived through the whole run (rules/classify.py, rule 1): made before the first phase
        occurrence began and freed after the last one ended; none in a log without phases."""
        s = self.scan
        if not s.occ_begin.size:
            return np.zeros(alloc_i.size, dtype=bool)
        first, last = int(s.occ_begin.min()), int(s.occ_end.max())
        return (alloc_i <= first) & (free_i >= last) & (last > first)

    def _orphans(self, orow: np.ndarray, t: Any, base: int) -> None:
        """Frees of blocks allocated before the log: their reasons, handed to the followers."""
        if not orow.size:
            return
        k = np.array([self.orphan_rank[(int(a), int(base + r))] for a, r in zip(t.addr[orow].tolist(), orow.tolist())],
                     dtype=np.int64)
        reason = np.where(self._whole_run(np.full(orow.size, -1), base + orow), R[Reason.PERSISTENT], R[Reason.OTHER])
        freed = FreedOrphans(k, base + orow, reason, self.rules.sites.id(BEFORE_LOG),
                             lambda j: self._orphan_detail(int(k[j])))
        for f in self.followers:
            f.orphans_ended(freed)
        for kk, r in zip(k.tolist(), reason.tolist()):
            if kk in self.details or kk in self.reasons:
                self.reasons[kk] = r
            if kk in self.details:  # its module is final now
                self.details[kk] = self._orphan_detail(kk)

    def _orphan_reasons(self, k: np.ndarray) -> np.ndarray:
        """The reasons of blocks from before the log (by index): persistent when freed after the last phase."""
        whole = self._whole_run(np.full(k.size, -1), self.scan.orphans["free_i"][k])
        return np.where(whole, R[Reason.PERSISTENT], R[Reason.OTHER]).astype(np.int64)

    def _orphan_detail(self, k: int) -> dict[str, Any]:
        shown = {c: v for f in self.followers for c, v in f.orphan(k).items()}
        return detail_orphan(self.scan.orphans, k, self.rules.sites.id(BEFORE_LOG), self.scan.first_ns,
                             int(self._orphan_reasons(np.array([k]))[0]), shown)

    def _resolve(self, bt: dict[str, np.ndarray], ended: np.ndarray, rows: np.ndarray, real: np.ndarray, t: Any,
                 base: int, reason: np.ndarray, free_site: np.ndarray, returned: np.ndarray, rerun: np.ndarray) -> None:
        if not self.watch:
            return
        ords = bt["ordinal"][ended]
        hit = np.flatnonzero(np.isin(ords, np.fromiter(self.watch, dtype=np.int64, count=len(self.watch))))
        for j in hit.tolist():
            k = self.watch.pop(int(ords[j]))
            self.reasons[k] = int(reason[j])
            if k in self.details:
                self.details[k] = detail_ended(self.O, bt, int(ended[j]), int(rows[j]), bool(real[j]), t, base,
                                                     int(reason[j]), int(free_site[j]), int(returned[j]),
                                                     bool(rerun[j]))

    # -- levels and moments --------------------------------------------------------------------------
    def _levels(self, bt: dict[str, np.ndarray], nc: int, ended: np.ndarray, end_rows: np.ndarray, orow: np.ndarray,
                t: Any, base: int, m: int) -> None:
        new = np.arange(nc, len(bt["ordinal"]))
        arow = bt["alloc_i"][new] - base
        bs_new, bs_end = bt["block_size"][new], bt["block_size"][ended]
        # the moments in this piece
        here = self.moments[(self.moments >= base) & (self.moments < base + m)]
        samples = np.flatnonzero((self.samples >= base) & (self.samples < base + m))
        count = np.zeros(m, dtype=np.int64)
        np.add.at(count, arow, 1)
        np.subtract.at(count, end_rows, 1)
        np.subtract.at(count, orow, 1)
        live_count = self.live_count + np.cumsum(count)
        self.live_count = int(live_count[-1])
        delta = np.zeros(m, dtype=np.int64)
        np.add.at(delta, arow, bs_new)
        np.subtract.at(delta, end_rows, bs_end)
        np.subtract.at(delta, orow, t.block_size[orow])
        cum = self.cum + np.cumsum(delta)
        segd = np.where(t.kind == SEGMENT_ALLOC, t.size, 0) - np.where(t.kind == SEGMENT_FREE, t.size, 0)
        raw = self.raw + np.cumsum(segd)
        self.cum, self.raw = int(cum[-1]), int(raw[-1])
        self._phase_curves(bt, new, ended, end_rows, orow, t, base, m, samples)
        for i in here.tolist():
            self.live_at[i] = int(live_count[i - base])
            self.levels_at[i] = (int(cum[i - base]), int(raw[i - base]), int(t.time_ns[i - base]))
            if i in self.anatomy_moments or i in self.page_moments:
                self._moment(i, bt)

    def _phase_curves(self, bt: dict[str, np.ndarray], new: np.ndarray, ended: np.ndarray, end_rows: np.ndarray,
                      orow: np.ndarray, t: Any, base: int, m: int, samples: np.ndarray) -> None:
        """The timeline's by_phase: allocated per allocating phase, at the samples (`samples`: those in this
        piece, as positions in self.samples); every piece moves the levels."""
        at = self.samples[samples] - base
        p_new, p_end = bt["phase"][new], bt["phase"][ended]
        moved = np.unique(np.concatenate((p_new, p_end))).tolist()
        for p in moved:
            sel_new, sel_end = p_new == p, p_end == p
            if not samples.size:
                self.phase_level[p] = (self.phase_level.get(p, 0) + int(bt["block_size"][new][sel_new].sum())
                                       - int(bt["block_size"][ended][sel_end].sum()))
                continue
            delta = np.zeros(m, dtype=np.int64)
            np.add.at(delta, bt["alloc_i"][new][sel_new] - base, bt["block_size"][new][sel_new])
            np.subtract.at(delta, end_rows[sel_end], bt["block_size"][ended][sel_end])
            level = self.phase_level.get(p, 0) + np.cumsum(delta)
            self.by_phase.setdefault(p, np.zeros(self.samples.size, dtype=np.int64))[samples] = level[at]
            self.phase_level[p] = int(level[-1])
        if samples.size:
            for p, level_ in self.phase_level.items():  # phases nothing moved in this piece keep their level
                if p not in moved:
                    self.by_phase.setdefault(p, np.zeros(self.samples.size, dtype=np.int64))[samples] = level_
        if self.before_curve is not None and (orow.size or samples.size):
            delta = np.zeros(m, dtype=np.int64)
            np.subtract.at(delta, orow, t.block_size[orow])
            level = self.before_level + np.cumsum(delta)
            self.before_curve[samples] = level[at]
            self.before_level = int(level[-1])

    def _moment(self, i: int, bt: dict[str, np.ndarray]) -> None:
        """The blocks live just after event i, in the blocks order: from before the log, then by allocation."""
        o = self.scan.orphans
        live_o = np.flatnonzero(o["free_i"] > i)
        live_b = np.flatnonzero((bt["alloc_i"] <= i) & (bt["end"] > i))
        k = np.concatenate((live_o, self.O + bt["ordinal"][live_b]))
        size = np.concatenate((o["block_size"][live_o], bt["block_size"][live_b]))
        if i in self.anatomy_moments:
            snap = {
                "k": k, "block_size": size, "size": np.concatenate((o["size"][live_o], bt["size"][live_b])),
                "site": np.concatenate((np.full(live_o.size, self.rules.sites.id(BEFORE_LOG)), bt["site"][live_b])),
                "phase": np.concatenate((np.full(live_o.size, -1), bt["phase"][live_b])),
                "category": np.concatenate((np.full(live_o.size, CATEGORY_CODE[Category.BEFORE_LOG]),
                                            bt["category"][live_b])),
                "reason": np.concatenate((self._orphan_reasons(live_o), bt["reason"][live_b])),
                "addr": np.concatenate((o["addr"][live_o], bt["addr"][live_b])),
                "alloc_t": np.concatenate((np.full(live_o.size, self.scan.first_ns), bt["time"][live_b])),
            }
            for f in self.followers:
                f.at_moment(i, bt, live_b, live_o, snap["reason"][:live_o.size].copy(), self._t, self._base)
            self.snapshots[i] = snap
            for j in np.flatnonzero(snap["reason"] < 0).tolist():
                kk = int(k[j])
                self.watch[kk - self.O] = kk
        if i in self.page_moments:
            per = self.wanted.per_moment
            live = np.arange(k.size)
            if live.size > per:
                live = live[np.argpartition(-size[live], per - 1)[:per]]
            ranked = live[np.lexsort((live, -size[live]))]
            self.page[i] = k[ranked]
            for j in ranked.tolist():
                kk = int(k[j])
                if kk in self.details:
                    continue
                if j < live_o.size:
                    self.details[kk] = self._orphan_detail(kk)
                else:
                    b = int(live_b[j - live_o.size])
                    if bt["end"][b] == INT_MAX:  # ends in a later piece
                        self.details[kk] = detail_alloc(self.O, bt, b)
                        self.watch[kk - self.O] = kk
                    else:  # ended later in this piece: already classified
                        self.details[kk] = detail_ended(
                            self.O, bt, b, int(bt["end"][b]) - self._base, bool(bt["real"][b]), self._t, self._base,
                            int(bt["reason"][b]), int(bt["free_site"][b]), int(bt["returned"][b]), bool(bt["rerun"][b]))

    # -- the end of the log: the blocks still live are persistent --------------------------------------
    def _finish(self, carry: Carry) -> None:
        bt = carry.columns
        for b, kk in enumerate((self.O + bt["ordinal"]).tolist()):
            if self.watch.pop(kk - self.O, None) is not None:
                self.reasons[kk] = R[Reason.PERSISTENT]
                if kk in self.details:  # its module is final now
                    self.details[kk] = detail_alloc(self.O, bt, b)
