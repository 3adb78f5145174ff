"""Leaks named: allocation sites whose live bytes, seen at the step markers, gain a low point that is never given back.

A leak keeps a little more now and then -- every step, every tenth step (a
logging step keeping `loss` with its graph), in bursts, a drawn size each
time -- and never gives it back. A cycle comes back: gradient accumulation
keeps a gradient per micro-step and frees them all at the optimizer step, a
KV cache grows token by token within one generate(), a per-epoch buffer
grows through the epoch. A warm-up (a cache filling to its bound) grows for
a few steps, then stays. So the rule looks at each site's low points, not
at its rises: `Trends` is fed, one step marker at a time, each site's live
bytes then, and keeps per site the lowest live bytes in each of at most
LOWS stretches of markers (the run cut in equal stretches that double in
length, pairs merging, as the run grows) and a few running figures. When
asked, it cuts the stretches into four quarters of the run and takes the
lowest live bytes in each (`floors`):

- a *leak*: the last quarter's floor is above the third's -- bytes held
  through a whole quarter of the run that were not held at some point of
  the quarter before -- by more than the site ever gave back at once (its
  largest fall from an earlier high). A cycle shorter than a quarter of
  the run has a low point in every quarter, so its floors stay level; a
  longer one cut by the end of the log rises no more than its earlier
  cycles fell; a site whose bytes come and go at random rises no more
  than it fell. Bytes that never come back raise the floors whatever
  their rhythm, once the growth has lasted about a quarter of the run;
  other sites do not matter (each site is its own). The price: growth on
  top of a cycle at the same site is named only when a quarter's growth
  outgrows the cycle.
- *grew, then stable*: not a leak, the last half's floors level and above
  the first quarter's, and no new high in the last half (a warm-up).
  Reported as such, never as a leak.
- nothing otherwise.

The rule needs MIN_STEPS step markers (two per quarter); `enough()` says
whether it had them, and a caller says so rather than guess.

Feeding it: `Trends()`, then `marker(label, t_s, live)` for each step marker
in the log's order, `live` mapping each site's key (any hashable: the
report's site ids) to its live bytes then (a site not in it has 0), then
`leaks(describe)` and `settled(describe)`, `describe(key)` giving a site's
label ("train.py:42 main") and its long location. A caller that knows which
sites changed since the last marker says so (`changed`): a marker then
costs those sites, the others are brought up to date when next looked at.
Per site: LOWS low points and seven figures, kept once the site has had
bytes at a marker (its falls are what tells its cycles from a leak); per
run: the labels of the markers a site's figures name. Nothing per marker,
however many a log has.

Which markers are step markers (`step_markers` for a list of labels;
`step_kind` for counts of kinds kept as markers come): labels that differ only in
their numbers are one kind ("step 1", "step 2" ...: "step N"; a label that
repeats unchanged, "step", is a kind too). The step markers are those of the
kind that names a step, iteration, epoch or batch (the most frequent such),
else of the most frequent kind that repeats at all -- a marker put at the
same place of each step is a step marker whatever its name. A log with no
repeated marker has no step markers and no leak is looked for: phases
(each forward, say) could stand in, but a phase begins many times per step
in some runs (gradient accumulation, several models), so the figure "per
step" would not be per step; markers are what the user said a step is.

A `Leak` says what its site kept since the last step marker it held its
fewest bytes at (`since`): the bytes gained by the last step marker over
the markers between (`grown`, `steps`, and their quotient `per_step`,
rounded down), and its live bytes at the last one. `leaks` lists them the
largest growth per step first. A `Settled` site says how much it grew and
over which markers before it stayed.

The section: the second pass hands `LeaksFollower` each piece's new and
ended blocks (`step`). A block counts at step marker j when it was
allocated before the marker and ended after it; so the follower adds a
block's bytes to its site at the first step marker after its allocation
and takes them away at the first after its end, keeps these changes only
for the markers the pass has not gone past yet, and once the pass has read
up to a step marker hands the sites' live bytes then to `Trends`. It holds
each site's live bytes and its trend: nothing per marker. It follows the
step markers among the first markers the first pass keeps
(first.MARKERS_KEPT); the blocks from before the log are not any site's
and are left out. Its rows (`Leaks`) are the leaks, the largest growth per
step first, and the sites that grew, then stayed; the section lists both,
the summary (summary.py) names the first leaks, or says the run had too
few step markers for the rule. `torchalloc top` applies the same rule to
a log as it is written (cli/top_state.py).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from ...log.chunks import ChunkedLog
from ...printable import printable
from ...units import fmt_bytes, fmt_time
from ..passes.first import Scan
from ..passes.follow import Blocks, Follower
from ..passes.pieces import report_start_ns
from .section import Part, Section
from .views import Analyzed, SectionView, Table

MIN_STEPS = 8  # step markers the rule needs: two in each quarter of the run
LOWS = 16  # low points kept per site, each over an equal stretch of step markers
_STEP_WORDS = re.compile(r"\b(step|iter|iteration|epoch|batch)\b", re.I)


@dataclasses.dataclass
class Leak:
    site: str  # where its blocks were allocated ("train.py:42 main")
    location: str  # the long form ("/path/train.py:42 in main")
    per_step: int  # grown / steps, rounded down
    since: str  # the last step marker at which the site held its fewest bytes: its label
    since_t_s: float  # and its time
    steps: int  # step markers from `since` to the last one
    grown: int  # live bytes at the last step marker less those at `since`
    live: int  # the site's live bytes at the last step marker
    last: str  # the last step marker's label

    def words(self) -> str:
        """'grows 4.0 MiB per step at train.py:42 main since step 3 (+28.0 MiB over 7 steps, never given back;
        28.0 MiB live at step 10)'"""
        return (f"grows {fmt_bytes(self.per_step)} per step at {self.site} since {self.since} "
                f"(+{fmt_bytes(self.grown)} over {self.steps} steps, never given back; {fmt_bytes(self.live)} live "
                f"at {self.last})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Settled:
    """A site that grew, then stayed: not a leak (module docstring)."""

    site: str
    location: str
    grown: int  # its floor over the last half of the run less its fewest bytes before the growth
    since: str | None  # the last step marker before the growth at which it held its fewest bytes; None: the first
    until: str  # the step marker it reached its most bytes at
    steps: int  # step markers from `since` (or the first) to `until`
    live: int  # at the last step marker

    def words(self) -> str:
        """'train.py:9 warm grew during the first 6 steps, then stable (+24.0 MiB; 24.0 MiB live)'"""
        when = f"during the first {self.steps} steps" if self.since is None else f"from {self.since} to {self.until}"
        return f"{self.site} grew {when}, then stable (+{fmt_bytes(self.grown)}; {fmt_bytes(self.live)} live)"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def too_few(count: int, kind: str) -> str:
    """What is said of a run with fewer step markers than the rule needs: "5 step markers like 'step 1', fewer
    than the 8 the leak rule needs: no leak looked for"."""
    return (f"{count} step marker{'s' if count != 1 else ''} like '{kind}', fewer than the {MIN_STEPS} the leak "
            "rule needs: no leak looked for")


def marker_kind(label: str) -> str:
    """'step 12' -> 'step N': labels that differ only in their numbers are one kind."""
    return re.sub(r"\d+", "N", label)


def step_kind(counts: Mapping[str, int]) -> str | None:
    """The kind of the step markers (module docstring), from each kind's count of markers (marker_kind's kinds, in
    the order they first appeared: ties go to the first); None when no kind repeats. A live view that counts the
    kinds as markers come asks this each time."""
    repeated = [k for k, c in counts.items() if c > 1]
    if not repeated:
        return None
    named = [k for k in repeated if _STEP_WORDS.search(k)]
    return max(named or repeated, key=lambda k: counts[k])


def step_markers(labels: Sequence[str]) -> list[int]:
    """The positions in `labels` (the log's markers, in order) of its step markers (module docstring)."""
    counts: dict[str, int] = {}
    for label in labels:
        counts[marker_kind(label)] = counts.get(marker_kind(label), 0) + 1
    kind = step_kind(counts)
    return [p for p, label in enumerate(labels) if marker_kind(label) == kind]


@dataclasses.dataclass
class _Site:
    """One site's figures, as of step marker `at` (markers are counted from 0, the first fed)."""

    lows: list[int] = dataclasses.field(default_factory=list)  # the fewest live bytes in each stretch of markers
    live: int = 0  # at marker `at`
    at: int = -1
    floor: int = 0  # the fewest live bytes at any marker
    floor_at: int = 0  # the last marker it held that few at
    high: int = 0  # the most live bytes at any marker
    high_at: int = 0  # the first marker it held that many at
    given_back: int = 0  # its largest fall from an earlier high


class Trends:
    """Per site, its low points over the step markers and a few running figures (module docstring)."""

    def __init__(self) -> None:
        self.sites: dict[Hashable, _Site] = {}
        self.width = 1  # step markers per stretch
        self.fed = 0
        self._named: dict[int, tuple[str, float]] = {}  # fed marker -> (label, t_s): those a site's figures name
        self._forget_at = 16  # _named's size that sends it through _forget next

    def enough(self) -> bool:
        """Whether the rule has the step markers it needs (MIN_STEPS)."""
        return self.fed >= MIN_STEPS

    def marker(self, label: str, t_s: float, live: Mapping[Hashable, int],
               changed: Iterable[Hashable] | None = None) -> None:
        """The next step marker: its label, time and each site's live bytes then. `changed`, when given: every
        site whose live bytes differ from the last marker's (a marker then costs what changed, not a look at
        every site). A site whose bytes did not change is brought up to date when next looked at."""
        k = self.fed
        self.fed += 1
        if k // self.width == LOWS:  # the stretches are full: each pair becomes one twice as long
            self.width *= 2
            for st in self.sites.values():
                st.lows = [min(st.lows[b: b + 2]) for b in range(0, len(st.lows), 2)]
        self._named[k] = (label, t_s)
        keys = set(self.sites) | {s for s, b in live.items() if b} if changed is None else changed
        for key in keys:
            now = int(live.get(key, 0))
            st = self.sites.get(key)
            if st is None:
                if not now:
                    continue  # a site never seen with bytes at a marker: nothing to remember of it
                st = self.sites[key] = _Site()
            elif now == st.live:
                continue  # unchanged: brought up to date when next looked at
            self._hold(st, k - 1)
            self._set(st, k, now)
        if len(self._named) > self._forget_at:  # now and then: forgetting looks at every site
            self._forget()
            self._forget_at = 2 * len(self._named) + 16

    def _stretch(self, st: _Site, b: int, live: int) -> None:
        if b < len(st.lows):
            st.lows[b] = min(st.lows[b], live)
        else:
            st.lows.append(live)

    def _hold(self, st: _Site, k: int) -> None:
        """Brings the site up to marker k, its bytes unchanged since marker `st.at` (0 before its first)."""
        if k <= st.at:
            return
        for b in range((st.at + 1) // self.width, k // self.width + 1):
            self._stretch(st, b, st.live)
        if st.live <= st.floor:
            st.floor_at = k
        st.at = k

    def _set(self, st: _Site, k: int, now: int) -> None:
        """The site's bytes at marker k (it is up to marker k - 1)."""
        self._stretch(st, k // self.width, now)
        if st.at < 0:  # at the first marker
            st.floor = st.high = now
        else:
            if now > st.high:
                st.high, st.high_at = now, k
            st.given_back = max(st.given_back, st.high - now)
            if now <= st.floor:
                st.floor, st.floor_at = now, k
        st.live, st.at = now, k

    def _forget(self) -> None:
        """Keeps the labels of the first and last markers and of those a site's figures name."""
        keep = {0, self.fed - 1}
        for st in self.sites.values():
            keep.update((st.floor_at, st.high_at))
        self._named = {k: v for k, v in self._named.items() if k in keep}

    def _quarters(self) -> list[int]:
        """Where each quarter of the run begins, in stretches, and where the last ends."""
        n = (self.fed - 1) // self.width + 1
        return [round(n * q / 4) for q in range(5)]

    def floors(self, key: Hashable) -> list[int]:
        """The site's fewest live bytes in each quarter of the run (module docstring)."""
        st = self.sites[key]
        self._hold(st, self.fed - 1)
        cuts = self._quarters()
        return [min(st.lows[cuts[q]: cuts[q + 1]]) for q in range(4)]

    @staticmethod
    def _is_leak(st: _Site, floors: list[int]) -> bool:
        """The last quarter's floor above the third's by more than the site ever gave back at once."""
        return floors[3] - floors[2] > st.given_back

    def leaks(self, describe: Callable[[Hashable], tuple[str, str]] = lambda k: (str(k), str(k))) -> list[Leak]:
        """The leaks, the largest growth per step first ([] before MIN_STEPS markers); `describe(key)`: a site's
        label and location."""
        if not self.enough():
            return []
        last = self.fed - 1
        out = []
        for key, st in self.sites.items():
            if not self._is_leak(st, self.floors(key)):
                continue
            label, location = describe(key)
            since_label, since_t = self._named[st.floor_at]
            steps = last - st.floor_at
            grown = st.live - st.floor
            out.append(Leak(label, location, grown // steps, since_label, since_t, steps, grown, st.live,
                            self._named[last][0]))
        out.sort(key=lambda x: (-x.per_step, -x.grown, x.site))
        return out

    def settled(self, describe: Callable[[Hashable], tuple[str, str]] = lambda k: (str(k), str(k))
                ) -> list[Settled]:
        """The sites that grew, then stayed (module docstring), the largest growth first."""
        if not self.enough():
            return []
        half = self._quarters()[2] * self.width  # the last half's first marker
        out = []
        for key, st in self.sites.items():
            f = self.floors(key)
            if self._is_leak(st, f) or f[3] != f[2] or f[2] <= f[0] or st.high_at > half:
                continue
            label, location = describe(key)
            since = None if st.floor_at == 0 else self._named[st.floor_at][0]
            out.append(Settled(label, location, f[3] - st.floor, since, self._named[st.high_at][0],
                               st.high_at - st.floor_at, st.live))
        out.sort(key=lambda x: (-x.grown, x.site))
        return out


def follow(markers: Iterable[tuple[str, float, Mapping[Hashable, int]]]) -> Trends:
    """The trends of step markers given as (label, t_s, {site key: live bytes}), in order (module docstring)."""
    trends = Trends()
    for label, t_s, live in markers:
        trends.marker(label, t_s, live)
    return trends


SETTLED_SHOWN = 3  # sites that grew, then stayed, named in the section
RULE = ("A site is named when the fewest bytes live at it over the last quarter of them are more than over the "
        "quarter before, by more than it ever gave back at once (a cycle cut by the end of the log rises no more "
        "than its earlier cycles fell).")


@dataclasses.dataclass
class Leaks:
    rows: list[Leak]
    settled: list[Settled]  # sites that grew, then stayed: no leaks
    step_markers: int  # the step markers followed (0: the log has none; no leak was looked for)
    kind: str  # their first label ("step 1")

    def enough(self) -> bool:
        """Whether the rule had the step markers it needs (leaks.MIN_STEPS); a log with none has no verdict."""
        return self.step_markers >= MIN_STEPS


class LeaksFollower(Follower):
    """Each site's live bytes at each step marker, handed to Trends as the pass reaches it (module docstring)."""

    def __init__(self, at: np.ndarray, labels: list[str], t_s: list[float]) -> None:
        self.at, self.labels, self.t_s = at, labels, t_s
        self.trends = Trends()
        self.live: dict[int, int] = {}  # site id -> its live bytes at the last step marker handed on
        self.pending: dict[int, dict[int, int]] = {}  # step marker -> site id -> the change in its live bytes
        self.next = 0  # the next step marker to hand on

    def _change(self, i: np.ndarray, site: np.ndarray, size: np.ndarray) -> None:
        """Adds `size` to each site's bytes from the first step marker after event i (none after: dropped)."""
        j = np.searchsorted(self.at, i, side="right")
        sel = j < len(self.at)
        if not sel.any():
            return
        keys, inv = np.unique(np.stack((j[sel], site[sel]), axis=1), axis=0, return_inverse=True)
        total = np.zeros(len(keys), dtype=np.int64)
        np.add.at(total, inv.reshape(-1), size[sel])
        for (jj, s), b in zip(keys.tolist(), total.tolist()):
            at_j = self.pending.setdefault(jj, {})
            at_j[s] = at_j.get(s, 0) + b

    def step(self, bt: Blocks, nc: int, ended: np.ndarray, end_i: np.ndarray, base: int, m: int) -> None:
        self._change(bt["alloc_i"][nc:], bt["site"][nc:], bt["block_size"][nc:])
        if ended.size:
            self._change(end_i, bt["site"][ended], -bt["block_size"][ended])
        self._hand_on(base + m)

    def _hand_on(self, read: int) -> None:
        """Hands on the step markers before event `read` (the pass has read every event before it)."""
        while self.next < len(self.at) and self.at[self.next] < read:
            changes = self.pending.pop(self.next, {})
            for s, b in changes.items():
                now = self.live.get(s, 0) + b
                if now:
                    self.live[s] = now
                else:
                    self.live.pop(s, None)
            self.trends.marker(self.labels[self.next], self.t_s[self.next], self.live, changes)
            self.next += 1

    def finish(self, bt: Blocks) -> None:
        self._hand_on(int(self.at[-1]) + 1)


def _follow(log: ChunkedLog, scan: Scan) -> LeaksFollower | None:
    labels = [printable(log.strings.get(lid, "")) for _, lid, _, _ in scan.markers]
    steps = step_markers(labels)
    if not steps:
        return None
    base_ns = report_start_ns(log.header.created_monotonic_ns, scan.first_ns)
    marks = [scan.markers[k] for k in steps]
    return LeaksFollower(np.asarray([m[0] for m in marks], dtype=np.int64), [labels[k] for k in steps],
                         [(m[3] - base_ns) / 1e9 for m in marks])


def _rows(a: Any, follower: Follower | None) -> Leaks:
    if not isinstance(follower, LeaksFollower):
        return Leaks([], [], 0, "")

    def describe(key: Any) -> tuple[str, str]:
        site = a.site(int(key))
        return site.label, site.location

    trends = follower.trends
    return Leaks(trends.leaks(describe), trends.settled(describe), len(follower.at), follower.labels[0])


LEAKS = Part("leaks", _follow, _rows)


def _view(a: Analyzed, top: int) -> SectionView | None:
    s: Leaks = a.section_rows(LEAKS.key)
    if not s.step_markers or (s.enough() and not s.rows and not s.settled):
        return None
    if not s.enough():
        return SectionView(None, [too_few(s.step_markers, s.kind) + "."], [])
    table = None
    if s.rows:
        shown = s.rows[:top]
        cells = [(r.site, fmt_bytes(r.per_step), f"{r.since} ({fmt_time(r.since_t_s)})", fmt_bytes(r.grown),
                  fmt_bytes(r.live)) for r in shown]
        more = f"... {len(s.rows) - len(shown)} more growing sites" if len(s.rows) > len(shown) else ""
        table = Table(["allocated at", "per step", "since", "grown", "live at the last"], cells, right=(1, 3, 4),
                      css="leaks", row_notes=[[r.words()] for r in shown], more=more,
                      row_titles=[r.location for r in shown])
    sentences = [f"Step markers: the {s.step_markers} like '{s.kind}'. {RULE}"]
    if s.settled:
        shown_settled = s.settled[:SETTLED_SHOWN]
        sentences.append("Grew, then stable (no leak): " + "; ".join(x.words() for x in shown_settled)
                         + (f"; ... {len(s.settled) - len(shown_settled)} more" if len(s.settled) > SETTLED_SHOWN
                            else "") + ".")
    return SectionView(table, sentences, [r.to_dict() for r in s.rows])


SECTION = Section("leaks", "Leaks: sites whose live bytes at the step markers rise and are never given back",
                  "Live bytes of each allocation site at each step marker; a site named held, all through the last "
                  "quarter of the step markers, bytes it did not hold at some marker of the quarter before.", _view,
                  LEAKS)
