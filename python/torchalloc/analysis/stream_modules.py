"""Memory by module: modules.py's section, from the second pass (passes/second.py).

Takes what the second pass hands it, piece by piece: the piece's module
records, its new blocks, its ended blocks (each with its final module and
tag, once its reason is known), and at the peak the blocks live then;
gives `Modules`, its rows built with modules.py's steps:

- a block's module is the current one at its ALLOC (modules.current_modules),
  carried with the block while it lives, and a tag (ranges.holders, among
  the blocks live in the piece: those carried, the piece's, those from
  before the log) replaces it;
- at each phase's peak (Scan.alloc_peaks: known before the second pass),
  the bytes per module come from each block as it ends: it adds its size,
  under its final module, to every such moment it was live at (a
  difference array per module over the moments: no block is kept);
- at the peak, the blocks live then are followed to their end (`Followed`,
  columns, as passes/details.py's details read them): their final module,
  tag and reason give the rows, and the HTML page lists the largest of
  each module from them.

Nothing is kept per block but the followed blocks' columns. `MODULES` is
the section's part of the pass (follow.Part), `SECTION` its entry
of sections.SECTIONS, with its view.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import numpy as np

from .._records import MODULE, MODULE_NAME, MODULE_TAG
from ..log.chunks import ChunkedLog
from ..units import fmt_bytes
from .rules.categorize import CATEGORY_CODE, Category
from .rules.classify import REASON_CODE, Reason
from .modules import Modules, add_phase, current_modules, held_at, module_rows, named_peaks, what_codes
from .passes.ranges import holders
from .passes.details import detail_alloc, detail_orphan, with_end
from .passes.follow import Follower, Part, Section, end_columns
from .passes.first_state import INT_MAX
from .passes.first import Scan
from .views import Analyzed, SectionView, Table
from .wording import module_sentences, what_words

# The block table's columns a followed block keeps (details.detail_alloc reads them), then its end.
_ALLOC_COLUMNS = ("ordinal", "addr", "size", "block_size", "phase", "site", "category", "occ", "alloc_i", "time",
                  "stack", "module", "tag")
_END_COLUMNS = ("free_i", "free_t", "free_phase", "free_stack", "free_site", "returned", "rerun", "reason")
_BEFORE_LOG, _PERSISTENT = CATEGORY_CODE[Category.BEFORE_LOG], REASON_CODE[Reason.PERSISTENT]


class Followed:
    """The blocks live at one moment, as columns (the block table's, then their end: -1 until they end)."""

    def __init__(self, bt: dict[str, np.ndarray], rows: np.ndarray, orphans: np.ndarray, orphan_reasons: np.ndarray
                 ) -> None:
        self.orphans = orphans  # the blocks from before the log live then (their indices), and their reasons
        self.orphan_reasons = orphan_reasons
        self.cols = {c: bt[c][rows].copy() for c in _ALLOC_COLUMNS}
        for c in _END_COLUMNS:
            self.cols[c] = np.full(rows.size, -1, dtype=np.int64)

    def ended(self, ordinal: np.ndarray, ends: dict[str, np.ndarray]) -> None:
        """Blocks (by ordinal) that ended, with their end columns and final module and tag."""
        if not ordinal.size or not self.cols["ordinal"].size:
            return
        pos = np.minimum(np.searchsorted(self.cols["ordinal"], ordinal), self.cols["ordinal"].size - 1)
        hit = self.cols["ordinal"][pos] == ordinal
        for name, values in ends.items():
            self.cols[name][pos[hit]] = values[hit]


class ModulesFollower(Follower):
    """The modules section's part of the second pass (module docstring). Per piece: `new_blocks`, then `piece`
    (the tags), then `ended` and `orphans_ended`; `at_moment` at the peak; `finish` at the end of the log."""

    columns = {"module": 0, "tag": 0}  # a block's module, and its tag's role (0: none)

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self.current = 0  # the module current after the pieces read
        self.names: list[tuple[int, int]] = []  # (module id, string id) of each MODULE_NAME record
        n_orphans = len(scan.orphans["addr"])
        self.orphan_module = np.zeros(n_orphans, dtype=np.int64)
        self.orphan_tag = np.zeros(n_orphans, dtype=np.int64)
        self.unmatched = 0
        self.seen: set[int] = set()  # every block's final module
        self.moments = np.unique(np.fromiter(scan.alloc_peaks.values(), dtype=np.int64, count=len(scan.alloc_peaks)))
        self.diff: dict[int, np.ndarray] = {}  # module -> bytes coming live (+) and going (-) at each moment
        self.followed: Followed | None = None

    # -- pieces --------------------------------------------------------------------------------------
    def new_blocks(self, t: Any, base: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The module (current at the alloc) and tag (none yet) of the piece's new blocks, at its rows `rows`."""
        kind = t.kind
        for r in np.flatnonzero(kind == MODULE_NAME).tolist():
            self.names.append((int(t.size[r]), int(t.stack[r])))
        at = np.flatnonzero(kind == MODULE)
        module = current_modules(base + rows, base + at, t.size[at].astype(np.int64), self.current)
        if at.size:
            self.current = int(t.size[at[-1]])
        return {"module": module, "tag": np.zeros(rows.size, dtype=np.int64)}

    def piece(self, bt: dict[str, np.ndarray], t: Any, base: int) -> None:
        """The piece's tags: each names the block live then that holds its address (ranges.holders: the one
        starting highest); a block's later tag beats an earlier one."""
        rows = np.flatnonzero(t.kind == MODULE_TAG)
        if not rows.size:
            return
        o = self.scan.orphans
        live_o = np.flatnonzero(o["free_i"] > base)  # before the log: live from its opening to their free
        start = np.concatenate((o["addr"][live_o], bt["addr"]))
        size = np.concatenate((o["block_size"][live_o], bt["block_size"]))
        made = np.concatenate((np.full(live_o.size, -1, dtype=np.int64), bt["alloc_i"]))
        ends = np.concatenate((o["free_i"][live_o], bt["end"]))
        got = holders(t.addr[rows], base + rows, start, size, made, ends)
        self.unmatched += int((got < 0).sum())
        hit = got >= 0
        target, module, role = got[hit], t.size[rows][hit].astype(np.int64), t.flags[rows][hit].astype(np.int64)
        # a block's later tag wins: keep each block's last
        last = target.size - 1 - np.unique(target[::-1], return_index=True)[1]
        target, module, role = target[last], module[last], role[last]
        orphan = target < live_o.size
        self.orphan_module[live_o[target[orphan]]] = module[orphan]
        self.orphan_tag[live_o[target[orphan]]] = role[orphan]
        bt["module"][target[~orphan] - live_o.size] = module[~orphan]
        bt["tag"][target[~orphan] - live_o.size] = role[~orphan]

    def ended(self, bt: dict[str, np.ndarray], ended: np.ndarray, ends: dict[str, np.ndarray]) -> None:
        """Blocks of the table that ended in this piece (positions `ended`); `ends`: their end columns."""
        module = bt["module"][ended]
        self._live(module, bt["block_size"][ended], bt["alloc_i"][ended], ends["free_i"])
        if self.followed is not None:
            self.followed.ended(bt["ordinal"][ended], dict(ends, module=module, tag=bt["tag"][ended]))

    def orphans_ended(self, k: np.ndarray, free_i: np.ndarray) -> None:
        """Blocks from before the log (their indices) freed in this piece, at `free_i`."""
        self._live(self.orphan_module[k], self.scan.orphans["block_size"][k], np.full(k.size, -1), free_i)

    def at_moment(self, i: int, bt: dict[str, np.ndarray], rows: np.ndarray, orphans: np.ndarray,
                  orphan_reasons: np.ndarray, t: Any, base: int) -> None:
        """At the peak, in piece t (its first event: `base`): the table's blocks live then (positions `rows`) and
        those from before the log (indices `orphans`, with their reasons), followed to their end. Those that ended
        later in the piece have their end."""
        if i != self.scan.peak_i:
            return
        self.followed = Followed(bt, rows, orphans, orphan_reasons)
        done = rows[bt["end"][rows] != INT_MAX]
        self.followed.ended(bt["ordinal"][done], end_columns(t, base, bt["end"][done] - base, bt["real"][done] > 0,
                                                             bt["free_site"][done], bt["returned"][done],
                                                             bt["rerun"][done], bt["reason"][done]))

    def orphan(self, k: int) -> dict[str, int]:
        return {"module": int(self.orphan_module[k]), "tag": int(self.orphan_tag[k])}

    def finish(self, bt: dict[str, np.ndarray]) -> None:
        """The end of the log: the blocks still live."""
        n = len(bt["ordinal"])
        self._live(bt["module"], bt["block_size"], bt["alloc_i"], np.full(n, INT_MAX, dtype=np.int64))
        if self.followed is not None:
            self.followed.ended(bt["ordinal"], {"module": bt["module"], "tag": bt["tag"],
                                                "reason": np.full(n, _PERSISTENT, dtype=np.int64)})

    def _live(self, module: np.ndarray, size: np.ndarray, alloc_i: np.ndarray, end: np.ndarray) -> None:
        """Blocks whose module is final: each counts at the moments it was live at (alloc_i <= moment < end)."""
        if not module.size:
            return
        self.seen.update(np.unique(module).tolist())
        lo = np.searchsorted(self.moments, alloc_i, side="left")
        hi = np.searchsorted(self.moments, end, side="left")
        some = np.flatnonzero(hi > lo)
        if not some.size:
            return
        module, size, lo, hi = module[some], size[some].astype(np.int64), lo[some], hi[some]
        ids, inverse = np.unique(module, return_inverse=True)
        for g, m in enumerate(ids.tolist()):
            sel = inverse.reshape(-1) == g
            diff = self.diff.setdefault(m, np.zeros(self.moments.size + 1, dtype=np.int64))
            np.add.at(diff, lo[sel], size[sel])
            np.subtract.at(diff, hi[sel], size[sel])

    # -- the section ---------------------------------------------------------------------------------
    def modules(self, strings: dict[int, str], phase_name: Callable[[int], str], peak: int) -> Modules:
        """The section's `Modules`: its rows, from the blocks live at the peak (followed to their end) and the
        bytes per module at each phase's peak."""
        names = {m: strings.get(s, f"module #{m}") for m, s in self.names}
        result = Modules(names, peak, {}, [], self.unmatched)
        if not names and not any(self.seen):
            return result  # no module records: a log written without track()'s modules
        result.phase_peaks = named_peaks(self.scan.alloc_peaks, phase_name)
        _, module, what, size = self.peak_blocks()
        held, count = held_at(module, what, size)
        totals = {m: np.cumsum(d)[:-1] for m, d in self.diff.items()}
        ids = np.array(sorted(totals), dtype=np.int64)
        by_phase: dict[int, dict[str, int]] = defaultdict(dict)
        for phase, i in result.phase_peaks.items():
            j = int(np.searchsorted(self.moments, i))
            add_phase(by_phase, phase, ids, np.array([totals[m][j] for m in ids.tolist()], dtype=np.int64))
        result.rows = module_rows(result, held, count, by_phase)
        return result

    def peak_blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The blocks live at the peak, in the blocks' order: index (k), final module, what it is (WHAT), size."""
        f = self.followed
        if f is None:
            return tuple(np.zeros(0, np.int64) for _ in range(4))  # type: ignore[return-value]
        o, c = self.scan.orphans, f.cols
        k = np.concatenate((f.orphans, len(o["addr"]) + c["ordinal"]))
        module = np.concatenate((self.orphan_module[f.orphans], c["module"]))
        category = np.concatenate((np.full(f.orphans.size, _BEFORE_LOG), c["category"]))
        reason = np.concatenate((f.orphan_reasons, c["reason"]))
        tag = np.concatenate((self.orphan_tag[f.orphans], c["tag"]))
        size = np.concatenate((o["block_size"][f.orphans], c["block_size"]))
        return k, module, what_codes(category, reason, tag), size

    def peak_details(self, positions: list[int], site: int) -> list[dict[str, Any]]:
        """Details (stream_details) of blocks live at the peak, by their position among them (peak_blocks')."""
        f = self.followed
        assert f is not None
        out = []
        first = len(self.scan.orphans["addr"])
        for j in positions:
            if j < f.orphans.size:
                k = int(f.orphans[j])
                out.append(detail_orphan(self.scan.orphans, k, site, self.scan.first_ns, int(f.orphan_reasons[j]),
                                         self.orphan(k)))
                continue
            b = j - f.orphans.size
            d = detail_alloc(first, f.cols, b)
            if f.cols["free_i"][b] >= 0:
                with_end(d, *(f.cols[c][b] for c in _END_COLUMNS))
            out.append(d)
        return out


# -- the section: its rows, its part of the pass, its view --------------------------------------------------
def _rows(a: Any, follower: Follower | None) -> tuple[Modules, list[str]]:
    """The section's rows and sentences, for the analysis `a` (result.Analysis)."""
    peak = a.scan.peak_i if a.scan.n else 0
    if isinstance(follower, ModulesFollower):
        m = follower.modules(a.table.strings, a.phase_name, peak)
    else:  # no module records
        m = Modules({}, peak, {}, [], 0)
    return m, module_sentences(m, a.allocated_at(peak) if a.scan.n else 0)


def _follow(log: ChunkedLog, scan: Scan) -> ModulesFollower | None:
    return ModulesFollower(scan) if scan.module_records else None  # a log without track()'s modules: nothing


# Memory by module's part of the second pass; its blocks' modules show in their details, so the page's pass has it too.
MODULES = Part("modules", _follow, _rows, in_details=True)


def _view(a: Analyzed, top: int) -> SectionView | None:
    m, sentences = a.section_rows(MODULES.key)
    if not m.rows:
        return None
    phases = list(m.phase_peaks)
    shown = m.rows[:top]
    cells = [(r.module, fmt_bytes(r.at_peak), str(r.blocks_at_peak),
              *[fmt_bytes(r.by_phase.get(p, 0)) for p in phases]) for r in shown]
    more = (f"... {len(m.rows) - top} more modules, {fmt_bytes(sum(r.at_peak for r in m.rows[top:]))} at the peak"
            if len(m.rows) > top else "")
    table = Table(["module", "at the peak", "blocks", *[f"at {p}'s peak" for p in phases]], cells,
                  right=range(1, 3 + len(phases)), css="modules", row_notes=[[what_words(r.what_at_peak)] for r in shown],
                  more=more, row_key="data-module")
    return SectionView(table, sentences, {"phase_peaks": m.phase_peaks, "tags_unmatched": m.tags_unmatched,
                                          "modules": [r.to_dict() for r in m.rows]})


SECTION = Section("modules", "Memory by module",
                  "The bytes each nn.Module's blocks hold (torchalloc.track): what was allocated inside its forward "
                  "or backward, and its parameters, their gradients and optimizer state. With JavaScript, click a "
                  "module for its blocks at the peak.", _view, MODULES)
