"""Memory by module: which nn.Module each block belongs to, and what it is to it.

Holds `Modules`: one `ModuleRow` per module path with the bytes its blocks
hold at the peak, by what they are to it ("activations saved for
backward", "temporaries", "gradients", "parameters", "optimizer state",
"other"), and at each phase's own peak (the moment that phase's allocated
level was highest), with its sentences (`module_sentences`).

The log says which module a block belongs to in two ways
(docs/LOG_FORMAT.md, "Modules"), both written by `torchalloc.track`:

- a MODULE record makes a module current; every ALLOC after it in the
  log's order was made inside that module (until the next MODULE record);
- a MODULE_TAG record names a block by an address inside it: that block,
  live at the tag, is the module's parameter, a parameter's gradient or
  optimizer state (ranges.holders finds it: of the blocks live then that
  hold the address, the one starting highest). A tag beats the current
  module: a gradient is made by the autograd engine while some other
  module's backward runs, and optimizer state outside every module; a
  block's later tag beats an earlier one.

Without a tag, what a block is comes from its reason and category
(rules/classify.py, rules/categorize.py). Logs without module records
give no rows.

`ModulesFollower` takes what the second pass hands it, piece by piece: the
piece's module records, its new blocks, its ended blocks (each with its
final module and tag, once its reason is known), and at the peak the
blocks live then:

- a block's module is the current one at its ALLOC (current_modules),
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
the section's part of the pass (section.Part), `SECTION` its entry of
sections.SECTIONS, with its view.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Callable, Sequence

import numpy as np

from ..._records import MODULE, MODULE_NAME, MODULE_TAG, TAG_GRADIENT, TAG_OPTIMIZER_STATE, TAG_PARAMETER
from ...log.chunks import ChunkedLog
from ...units import fmt_bytes
from ..passes.details import END_COLUMNS, detail_alloc, detail_orphan, with_end
from ..passes.first import Scan
from ..passes.first_state import INT_MAX
from ..passes.follow import Follower, FreedOrphans, end_columns
from ..passes.ranges import holders
from ..rules.categorize import CATEGORIES, CATEGORY_CODE, Category
from ..rules.classify import REASON_CODE, REASONS, Reason
from .section import Part, Section
from .views import Analyzed, SectionView, Table

OUTSIDE = "(outside modules)"
SAVED = "activations saved for backward"
TEMPORARIES = "temporaries"
OTHER = "other"
# What a block is to its module, in the order the report lists them.
WHAT: tuple[str, ...] = (SAVED, TEMPORARIES, "gradients", "parameters", "optimizer state", OTHER)
_FROM_TAG = {TAG_PARAMETER: "parameters", TAG_GRADIENT: "gradients", TAG_OPTIMIZER_STATE: "optimizer state"}
_FROM_CATEGORY = {
    Category.PARAMETERS: "parameters",
    Category.GRADIENTS: "gradients",
    Category.OPTIMIZER_STATE: "optimizer state",
    Category.ACTIVATIONS: SAVED,
    Category.TEMPORARIES: TEMPORARIES,
    Category.BACKWARD_TEMPORARIES: TEMPORARIES,
    Category.OPTIMIZER_INTERMEDIATES: TEMPORARIES,
}


@dataclasses.dataclass
class ModuleRow:
    module: str  # its path, "model.layers.3.mlp"
    at_peak: int  # bytes its blocks hold at the run's peak
    blocks_at_peak: int
    what_at_peak: dict[str, int]  # WHAT -> bytes at the peak, largest first
    by_phase: dict[str, int]  # phase -> bytes held at that phase's own peak

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Modules:
    """The section: its rows, and the module names they use. Nothing per block: a block the page lists has its
    module in its details (passes/details.py)."""

    names: dict[int, str]  # module id -> path
    peak_index: int
    phase_peaks: dict[str, int]  # phase -> the event index of its own peak
    rows: list[ModuleRow]
    tags_unmatched: int  # tags naming an address no live block holds

    def name(self, module: int) -> str:
        if module == 0:
            return OUTSIDE
        return self.names.get(module, f"module #{module}")


def current_modules(alloc_i: np.ndarray, module_at: np.ndarray, module_ids: np.ndarray, before: int = 0) -> np.ndarray:
    """Per block (the index of its ALLOC, -1 before the log), the module current then: that of the last MODULE
    record before it (`module_at`: their indices, ascending; `module_ids`: their modules), else `before`."""
    k = np.searchsorted(module_at, alloc_i, side="right") - 1
    current = np.where(k >= 0, module_ids[np.maximum(k, 0)] if module_ids.size else 0, before)
    return np.where(alloc_i >= 0, current, 0).astype(np.int64)


def what_codes(category: np.ndarray, reason: np.ndarray, tag: np.ndarray) -> np.ndarray:
    """Per block, what it is to its module (an index into WHAT): its tag's role, else saved for backward by its
    reason, else by its category."""
    code = {w: k for k, w in enumerate(WHAT)}
    cat = np.array([code[_FROM_CATEGORY.get(c, OTHER)] for c in CATEGORIES], dtype=np.int64)
    what = cat[category.astype(np.int64)] if category.size else np.zeros(0, dtype=np.int64)
    what = np.where(reason == REASONS.index(Reason.SAVED_FOR_BACKWARD), code[SAVED], what)
    for role, name in _FROM_TAG.items():
        what = np.where(tag == role, code[name], what)
    return what


def named_peaks(peak_of: dict[int, int], phase_name: Any) -> dict[str, int]:
    """Per phase name, the event index of its peak (`peak_of`: per phase id; a later id of the same name wins)."""
    out: dict[str, int] = {}
    for p in sorted(peak_of):
        out[phase_name(p)] = peak_of[p]
    return out


def held_at(module: np.ndarray, what: np.ndarray, size: np.ndarray) -> tuple[dict[int, dict[str, int]], dict[int, int]]:
    """Of the blocks live at a moment (in the blocks' order): per module, the bytes per WHAT and the count."""
    held: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    count: dict[int, int] = defaultdict(int)
    for m, w, n in zip(module.tolist(), what.tolist(), size.tolist()):
        held[m][WHAT[w]] += n
        count[m] += 1
    return held, count


def add_phase(by_phase: dict[int, dict[str, int]], phase: str, module: np.ndarray, size: np.ndarray) -> None:
    """by_phase[module][phase] += the bytes of the blocks live at that phase's peak (`module`, `size`: theirs)."""
    ids, inverse = np.unique(module, return_inverse=True)  # ids are the writer's: maybe large
    totals = np.bincount(inverse.reshape(-1), weights=size.astype(np.float64), minlength=ids.size)
    for m, n in zip(ids.tolist(), totals.tolist()):
        if n:
            by_phase[m][phase] = int(n)


def module_rows(result: Modules, held: dict[int, dict[str, int]], count: dict[int, int],
                by_phase: dict[int, dict[str, int]]) -> list[ModuleRow]:
    """One row per module, the most bytes at the peak first (then at a phase's peak)."""
    def largest(m: int) -> tuple[int, int]:
        return (-sum(held[m].values()) if m in held else 0, -max(by_phase[m].values(), default=0))

    rows = []
    for m in sorted(set(held) | set(by_phase), key=largest):
        what = dict(sorted(((k, v) for k, v in held[m].items() if v), key=lambda kv: -kv[1])) if m in held else {}
        rows.append(ModuleRow(result.name(m), sum(what.values()), count.get(m, 0), what, by_phase.get(m, {})))
    return rows


# The block table's columns a followed block keeps (details.detail_alloc reads them), then its end.
_ALLOC_COLUMNS = ("ordinal", "addr", "size", "block_size", "phase", "site", "category", "occ", "alloc_i", "time",
                  "stack", "module", "tag")
_BEFORE_LOG, _PERSISTENT = CATEGORY_CODE[Category.BEFORE_LOG], REASON_CODE[Reason.PERSISTENT]


class Followed:
    """The blocks live at one moment, as columns (the block table's, then their end: -1 until they end)."""

    def __init__(self, bt: dict[str, np.ndarray], rows: np.ndarray, orphans: np.ndarray, orphan_reasons: np.ndarray
                 ) -> None:
        self.orphans = orphans  # the blocks from before the log live then (their indices), and their reasons
        self.orphan_reasons = orphan_reasons
        self.cols = {c: bt[c][rows].copy() for c in _ALLOC_COLUMNS}
        for c in END_COLUMNS:
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

    def orphans_ended(self, freed: FreedOrphans) -> None:
        """Blocks from before the log freed in this piece: their module is final."""
        k = freed.k
        self._live(self.orphan_module[k], self.scan.orphans["block_size"][k], np.full(k.size, -1), freed.free_i)

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
        """Details (passes/details.py) of blocks live at the peak, by their position among them (peak_blocks')."""
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
                with_end(d, *(f.cols[c][b] for c in END_COLUMNS))
            out.append(d)
        return out


def what_words(what: dict[str, int]) -> str:
    """"8.0 MiB activations saved for backward, 4.0 MiB parameters" (largest first)."""
    return ", ".join(f"{fmt_bytes(n)} {w}" for w, n in what.items()) or "nothing at the peak"


def module_sentences(m: Modules, allocated_at_peak: int) -> list[str]:
    """What the largest modules hold at the peak, and what the attribution could not place."""
    rows = [r for r in m.rows if r.at_peak and r.module != OUTSIDE]
    out = []
    if rows:
        top = rows[0]
        share = f" ({100 * top.at_peak / allocated_at_peak:.0f}% of the {fmt_bytes(allocated_at_peak)} allocated)" \
            if allocated_at_peak else ""
        out.append(f"At the peak, {top.module} holds the most: {fmt_bytes(top.at_peak)}{share}: "
                   f"{what_words(top.what_at_peak)}.")
    outside = next((r for r in m.rows if r.module == OUTSIDE and r.at_peak), None)
    if outside:
        out.append(f"{fmt_bytes(outside.at_peak)} at the peak was allocated outside every tracked module's forward "
                   "and backward (inputs, the loss, blocks from before track()) and is no module's parameter, "
                   f"gradient or optimizer state: {what_words(outside.what_at_peak)}.")
    if m.tags_unmatched:
        out.append(f"{m.tags_unmatched} parameter, gradient or optimizer-state addresses named no live block "
                   "(a tensor off this device, or a log opened after track()): those blocks count where they "
                   "were allocated.")
    return out


# -- the section: its rows, its part of the pass, its view --------------------------------------------------
def _rows(a: Any, follower: Follower | None) -> tuple[Modules, list[str]]:
    """The section's rows and sentences, for the analysis `a` (front.Analysis)."""
    peak = a.scan.peak_i if a.scan.n else 0
    if isinstance(follower, ModulesFollower):
        m = follower.modules(a.table.strings, a.phase_name, peak)
    else:  # no module records
        m = Modules({}, peak, {}, [], 0)
    return m, module_sentences(m, a.allocated_at(peak) if a.scan.n else 0)


def _follow(log: ChunkedLog, scan: Scan) -> ModulesFollower | None:
    return ModulesFollower(scan) if scan.module_records else None  # a log without track()'s modules: nothing


def _moments(scan: Scan) -> Sequence[int]:
    return [scan.peak_i] if scan.n else []  # the blocks live at the peak, followed to their end


# Memory by module's part of the second pass; its blocks' modules show in their details, so the page's pass has it too.
MODULES = Part("modules", _follow, _rows, in_details=True, moments=_moments)


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
