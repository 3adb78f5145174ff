"""Lifetimes: per allocation site and reason, how many blocks, how many bytes, how long they lived.

One `LifetimeRow` per group of blocks that share site, reason, free site,
returning function, whether the line ran again (rebinding) and category,
largest first, with the sentence for the group (`reason_sentence`,
written from the block that speaks for it).

`LifetimesFollower` takes, piece by piece, the blocks that ended (or, at
the end of the log, the persistent ones) with their row's key and keeps
per row what the row shows: counts and sums, the set of allocating phases,
the block that speaks for it (the lowest block index), and the lifetimes
for the typical one: exact while few (`EXACT_LIFETIMES` per row,
`EXACT_BUDGET` over all rows), then a histogram with bins 0.1 % wide, so a
row costs at most a few hundred KB however many blocks it has. The rows
list the groups' sites in the report's order (rules/blocks.py's
canonical ids); `Explain` gives any block's sentence (the HTML page's
blocks' too).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from ...log.chunks import ChunkedLog
from ...units import fmt_bytes, fmt_seconds
from ..passes.details import detail_alloc, detail_with_end
from ..passes.first import Scan
from ..passes.follow import Blocks, Follower, FreedOrphans
from ..rules.categorize import CATEGORIES, CATEGORY_CODE, Category
from ..rules.classify import REASON_CODE, REASONS, Reason
from ..rules.sites import NO_PYTHON
from .section import Part, Section
from .views import Analyzed, SectionView, Table

EXACT_LIFETIMES = 1 << 16  # a lifetime row's blocks whose lifetimes are kept exactly; past it, a histogram
EXACT_BUDGET = 1 << 22  # exact lifetimes kept over all rows (32 MiB): past it, the largest rows go to histograms
MANTISSA_BITS = 10  # the histogram's bins: 2^10 per power of two (0.1 % wide)
INT_MAX = np.iinfo(np.int64).max


class Lifetimes:
    """A lifetime row's lifetimes (ns): exact while few, then a histogram with bins 0.1 % wide (its median within a
    bin of the exact one), kept as two arrays (bin keys, counts)."""

    def __init__(self) -> None:
        self.exact: list[np.ndarray] = []
        self.count = 0
        self.keys: np.ndarray | None = None  # None: exact
        self.counts = np.zeros(0, dtype=np.int64)

    @property
    def hist(self) -> bool:
        return self.keys is not None

    @property
    def exact_count(self) -> int:
        return 0 if self.hist else self.count

    def add(self, ns: np.ndarray) -> None:
        self.count += ns.size
        if self.keys is None:
            self.exact.append(ns)
            if self.count > EXACT_LIFETIMES:
                self.to_histogram()
        else:
            self._bin(ns)

    def to_histogram(self) -> None:
        if self.keys is None:
            self.keys = np.zeros(0, dtype=np.int64)
            self._bin(np.concatenate(self.exact) if self.exact else np.zeros(0, dtype=np.int64))
            self.exact = []

    def _bin(self, ns: np.ndarray) -> None:
        assert self.keys is not None
        keys, counts = np.unique(_bin_of(ns), return_counts=True)
        merged = np.concatenate((self.keys, keys))
        uniq, inv = np.unique(merged, return_inverse=True)
        total = np.zeros(uniq.size, dtype=np.int64)
        np.add.at(total, inv.reshape(-1), np.concatenate((self.counts, counts)))
        self.keys, self.counts = uniq, total

    def median_s(self) -> float:
        """np.median of the lifetimes in seconds (exactly, or from the histogram's bins)."""
        if self.keys is None:
            return float(np.median(np.concatenate(self.exact) / 1e9))
        cum = np.cumsum(self.counts)
        n = int(cum[-1])
        lo = _bin_value(self.keys[np.searchsorted(cum, (n - 1) // 2, side="right")])
        hi = _bin_value(self.keys[np.searchsorted(cum, n // 2, side="right")])
        return (lo + hi) / 2 / 1e9


def _bin_of(ns: np.ndarray) -> np.ndarray:
    """Histogram bin of each lifetime (ns >= 0): its exponent and the next MANTISSA_BITS bits."""
    x = np.maximum(ns, 0).astype(np.int64)
    small = x < (1 << MANTISSA_BITS)
    e = np.zeros(x.size, dtype=np.int64)
    big = ~small
    e[big] = np.floor(np.log2(x[big].astype(np.float64))).astype(np.int64) - MANTISSA_BITS
    e[big] = np.maximum(e[big], 0)
    mant = np.where(big, x >> e, x)
    fix = big & (mant >= (2 << MANTISSA_BITS))  # log2 of a float rounded up
    mant[fix] >>= 1
    e[fix] += 1
    return (e << 20) | mant


def _bin_value(key: int) -> float:
    e, mant = int(key) >> 20, int(key) & ((1 << 20) - 1)
    return float((mant << e) + ((1 << e) - 1) / 2) if e else float(mant)


@dataclasses.dataclass
class Group:
    """The blocks of one lifetime row so far."""

    count: int = 0
    bytes: int = 0
    largest: int = 0
    phases: set[int] = dataclasses.field(default_factory=set)
    persistent: bool = False
    negative: bool = False  # a lifetime below 0 (clocks of two threads): the row's typical lifetime is then -1
    lives: Lifetimes = dataclasses.field(default_factory=Lifetimes)
    first: int = INT_MAX  # the lowest block index: the block that speaks for the row
    rep: dict[str, Any] = dataclasses.field(default_factory=dict)


_KEY = ("site", "reason", "free_site", "returned", "rerun", "category")
# bits of each key column in one int64 (the +1 columns may be -1): site, reason, free_site + 1, returned + 1, rerun,
# category
_WIDTHS = (20, 4, 20, 14, 1, 4)


def group_keys(cols: dict[str, np.ndarray]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct lifetime-row keys of these blocks, and each block's: one int64 per block when the ids fit
    (they do but in huge logs of distinct call sites), else rows of the key."""
    shift = (0, 0, 1, 1, 0, 0)
    values = [cols[c].astype(np.int64) + d for c, d in zip(_KEY, shift)]
    if all(int(v.max(initial=0)) < (1 << w) for v, w in zip(values, _WIDTHS)):
        packed = np.zeros(values[0].size, dtype=np.int64)
        for v, w in zip(values, _WIDTHS):
            packed = (packed << w) | v
        uniq, inv = np.unique(packed, return_inverse=True)
        out = []
        for u in uniq.tolist():
            parts = []
            for w in reversed(_WIDTHS):
                parts.append(u & ((1 << w) - 1))
                u >>= w
            parts.reverse()
            out.append(tuple(x - d for x, d in zip(parts, shift)))
        return out, inv.reshape(-1)
    key = np.stack([cols[c] for c in _KEY], axis=1)
    uniq2, inv = np.unique(key, axis=0, return_inverse=True)
    return [tuple(int(x) for x in row) for row in uniq2], inv.reshape(-1)


@dataclasses.dataclass
class LifetimeRow:
    site: str
    location: str
    reason: str
    category: str
    phases: list[str]
    count: int
    bytes: int  # block bytes, summed over the blocks
    largest: int
    typical_lifetime_s: float  # median; -1 for blocks never freed
    free_site: str | None
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class LifetimesFollower(Follower):
    """The lifetime rows as they fill (module docstring): `ended` and `orphans_ended` add the blocks that ended in
    each piece, `finish` the persistent ones."""

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self.first = len(scan.orphans["addr"])  # the index of the block of ordinal 0
        self.groups: dict[tuple[int, int, int, int, int, int], Group] = {}
        self.exact_total = 0

    def ended(self, bt: Blocks, ended: np.ndarray, ends: dict[str, np.ndarray]) -> None:
        cols = {"site": bt["site"][ended], "reason": ends["reason"], "free_site": ends["free_site"],
                "returned": ends["returned"], "rerun": ends["rerun"], "category": bt["category"][ended]}
        life = ends["free_t"] - bt["time"][ended]
        self._group(cols, self.first + bt["ordinal"][ended], bt["block_size"][ended], bt["phase"][ended], life, False,
                    lambda j: detail_with_end(self.first, bt, ended[j], ends, j))

    def orphans_ended(self, freed: FreedOrphans) -> None:
        """Blocks from before the log freed: their own lifetime row."""
        o, k, n_ = self.scan.orphans, freed.k, freed.k.size
        cols = {"site": np.full(n_, freed.site), "reason": freed.reason, "free_site": np.full(n_, -1),
                "returned": np.full(n_, -1), "rerun": np.zeros(n_, dtype=np.int64),
                "category": np.full(n_, CATEGORY_CODE[Category.BEFORE_LOG])}
        life = o["free_t"][k] - self.scan.first_ns
        self._group(cols, k, o["block_size"][k], np.full(n_, -1), life, False, freed.detail)

    def finish(self, bt: Blocks) -> None:
        """The blocks live at the end of the log: persistent."""
        n_ = len(bt["ordinal"])
        if not n_:
            return
        cols = {"site": bt["site"], "reason": np.full(n_, REASON_CODE[Reason.PERSISTENT]),
                "free_site": np.full(n_, -1), "returned": np.full(n_, -1), "rerun": np.zeros(n_, dtype=np.int64),
                "category": bt["category"]}
        self._group(cols, self.first + bt["ordinal"], bt["block_size"], bt["phase"], None, True,
                    lambda j: detail_alloc(self.first, bt, int(j)))

    def _group(self, cols: dict[str, np.ndarray], k: np.ndarray, size: np.ndarray, phase: np.ndarray,
               life: np.ndarray | None, persistent: bool, detail: Callable[[int], dict[str, Any]]) -> None:
        """Add blocks to their lifetime rows (group_keys: each row's key)."""
        uniq, inv = group_keys(cols)
        order = np.argsort(inv, kind="stable")
        bounds = np.flatnonzero(np.concatenate(([True], inv[order][1:] != inv[order][:-1], [True])))
        for g in range(len(uniq)):
            members = order[bounds[g]:bounds[g + 1]]
            gkey = uniq[g]
            grp = self.groups.get(gkey)
            if grp is None:
                grp = self.groups[gkey] = Group()
            s = size[members]
            grp.count += members.size
            grp.bytes += int(s.sum())
            grp.largest = max(grp.largest, int(s.max()))
            grp.phases.update(np.unique(phase[members]).tolist())
            if persistent:
                grp.persistent = True
            elif life is not None:
                lm = life[members]
                before = grp.lives.exact_count
                grp.lives.add(lm)
                self.exact_total += grp.lives.exact_count - before
                if (lm < 0).any():
                    grp.negative = True
            while self.exact_total > EXACT_BUDGET:  # the row keeping the most exact lifetimes goes to a histogram
                most = max(self.groups.values(), key=lambda x: x.lives.exact_count)
                self.exact_total -= most.lives.exact_count
                most.lives.to_histogram()
            j = int(members[np.argmin(k[members])])
            if int(k[j]) < grp.first:
                grp.first = int(k[j])
                grp.rep = detail(j)


def reason_sentence(reason: Reason, category: Category, site: str, free_site: str | None, fn: str | None, phase: str,
                    free_phase: str, rerun: bool, has_stacks: bool) -> str:
    """Why a block was freed when it was, from its reason, category, sites (labels) and phases (names)."""
    if reason is Reason.TEMPORARY:
        return (f"temporary: made and freed on the same line ({site}); invisible to memory measured before and "
                "after that line, but part of its peak")
    if reason is Reason.FUNCTION_RETURNED:
        return (f"freed when its function returned: {fn}() kept it in a local variable until its frame exited, "
                f"back at the caller's line {free_site}")
    if reason is Reason.REBINDING:
        if rerun:
            return (f"freed on rebinding: the same line ({free_site}) ran again and assigned its name a new value, "
                    "freeing this one")
        via = f", after {fn}() returned it" if fn else ""
        return (f"freed on rebinding at {free_site}: it lived until the name holding it was assigned again "
                f"(or deleted) on that line{via}")
    if reason is Reason.SAVED_FOR_BACKWARD:
        return (f"saved for backward: allocated in {phase}, kept alive by autograd for the backward pass "
                f"and freed during it{f' ({free_phase})' if free_phase and free_phase != phase else ''}")
    if reason is Reason.PERSISTENT:
        detail = {
            Category.PARAMETERS: "model parameters or buffers",
            Category.GRADIENTS: f".grad of parameters, allocated in {phase}",
            Category.OPTIMIZER_STATE: f"optimizer state (e.g. Adam's exp_avg and exp_avg_sq), allocated in {phase}",
            Category.WORKSPACE: (f"a library workspace (cuBLAS's, per thread and stream), allocated at the first "
                                 f"matmul in {phase} and never freed"),
        }.get(category, f"allocated in {phase}, still referenced when the log ended")
        if free_phase:  # freed, but only after the run's work ended (rules/classify.py, rule 1: the whole run)
            return (f"persistent: lived through the whole run, freed only after its last phase ended (in "
                    f"{free_phase}) -- {detail.replace(', still referenced when the log ended', '')}")
        return f"persistent: still live at the end of the log -- {detail}"
    no_stacks = " (logged without stacks:1: only phases are known)" if not has_stacks else ""
    if reason is Reason.SAME_PHASE:
        if phase.startswith("the first occurrence of "):  # Explain's wording for a phase that repeats
            return f"freed within {phase}, which allocated it{no_stacks}"
        return f"freed within the same occurrence of {phase} that allocated it{no_stacks}"
    if reason is Reason.LATER_PHASE:
        return f"outlived {phase}; freed later, in {free_phase}{no_stacks}"
    if category is Category.BEFORE_LOG:
        return "allocated before the log began; freed during it"
    if free_site is None:
        if category in (Category.BACKWARD_TEMPORARIES, Category.GRADIENTS):
            return (f"allocated and freed by autograd's engine during backward ({free_phase or phase}): gradients of "
                    "intermediate results, or recomputation")
        return f"freed on a thread without Python (autograd's engine or a C++ thread), in {free_phase or phase}"
    if site == NO_PYTHON.label:
        return f"allocated on a thread without Python (autograd's engine, in {phase}); freed at {free_site}"
    return f"freed at {free_site}, from a different call path than the one that made it{no_stacks}"


class Explain:
    """Why a block was freed when it was, in words: reason_sentence with the analysis' names for its sites,
    function and phases (a block's details, passes/details.py)."""

    def __init__(self, a: Any) -> None:
        self.a = a
        self.occ_first: dict[int, int] = {}
        self.occ_count: dict[int, int] = {}
        for row, p in enumerate(a.scan.occ_phase.tolist()):
            self.occ_first.setdefault(p, row)
            self.occ_count[p] = self.occ_count.get(p, 0) + 1

    def __call__(self, d: dict[str, Any], phases: list[str] | None = None) -> str:
        """The sentence of the block of details `d`; with `phases`, for a lifetime row: the phases its blocks were
        allocated in."""
        a = self.a
        site = a.site(d["site"]).label
        free_site = a.site(d["free_site"]).label if d["free_site"] >= 0 else None
        fn = a.passed.rules.functions[d["returned"]] if d["returned"] >= 0 else None
        phase = a.phase_name(d["phase"])
        free_phase = a.phase_name(d["free_phase"]) if d["free_phase"] >= 0 else ""
        first, count = self.occ_first.get(d["phase"], -1), self.occ_count.get(d["phase"], 0)
        if count > 1 and d["occ"] == first:
            phase = f"the first occurrence of {phase}"
        text = reason_sentence(REASONS[d["reason"]], CATEGORIES[d["category"]], site, free_site, fn, phase, free_phase,
                               bool(d["rerun"]), a.has_stacks)
        if phases is None or len(phases) == 1:
            return text
        return text.replace(f"in {a.phase_name(d['phase'])}", f"in {', '.join(phases)}")


@dataclasses.dataclass
class LifetimeRows:
    """The section's rows, largest first, each with the details of the block that speaks for it, and `explain`."""

    rows: list[tuple[LifetimeRow, dict[str, Any]]]
    explain: Explain


def _rows(a: Any, follower: Follower | None) -> LifetimeRows:
    """The rows, for the analysis `a` (front.Analysis): the groups' keys in the report's site order."""
    assert isinstance(follower, LifetimesFollower)
    explain = Explain(a)
    canonical = []
    for key, g in follower.groups.items():
        site, reason, free_site, returned, rerun, cat = key
        ckey = (int(a.site_map[site]), reason, int(a.site_map[free_site]) if free_site >= 0 else -1,
                int(a.fn_map[returned]) if returned >= 0 else -1, rerun, cat)
        canonical.append((ckey, key, g))
    canonical.sort(key=lambda x: x[0])
    rows = []
    for _, (site, reason, free_site, _ret, _rerun, cat), g in canonical:
        phases = sorted({a.phase_name(p) for p in g.phases})
        typical = -1.0 if g.persistent or g.negative else g.lives.median_s()
        s_ = a.site(site)
        rows.append((LifetimeRow(
            site=s_.label, location=s_.location, reason=str(REASONS[reason]), category=str(CATEGORIES[cat]),
            phases=phases, count=g.count, bytes=g.bytes, largest=g.largest, typical_lifetime_s=typical,
            free_site=a.site(free_site).label if free_site >= 0 else None,
            explanation=explain(g.rep, phases)), g.rep))
    rows.sort(key=lambda rr: (-rr[0].bytes, rr[0].site, rr[0].reason))
    return LifetimeRows(rows, explain)


def _follow(log: ChunkedLog, scan: Scan) -> LifetimesFollower:
    return LifetimesFollower(scan)


LIFETIMES = Part("lifetimes", _follow, _rows)


def _view(a: Analyzed, top: int) -> SectionView:
    rows = [r for r, _ in a.section_rows(LIFETIMES.key).rows]
    shown = rows[:top]
    cells = [(r.site, r.reason, r.category, str(r.count), fmt_bytes(r.bytes),
              fmt_seconds(r.typical_lifetime_s) if r.typical_lifetime_s >= 0 else "until the end", ", ".join(r.phases))
             for r in shown]
    more = (f"... {len(rows) - top} more (site, reason) groups, {fmt_bytes(sum(r.bytes for r in rows[top:]))}"
            if len(rows) > top else "")
    table = Table(["allocated at", "reason", "category", "blocks", "bytes", "typical lifetime", "phases"], cells,
                  right=(3, 4, 5), css="lifetimes", row_notes=[[r.explanation] for r in shown], more=more,
                  row_key="data-lifetime", row_titles=[r.location for r in shown])
    return SectionView(table, [], [r.to_dict() for r in (rows[:top] if top else rows)])


SECTION = Section("lifetimes", "Lifetimes: per allocation site, why its blocks were freed when they were",
                  "With JavaScript, click a site for the stacks of the block its sentence speaks for.", _view, LIFETIMES)
