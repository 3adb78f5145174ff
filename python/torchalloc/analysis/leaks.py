"""Leaks named: allocation sites whose live bytes grow at every step marker, N steps in a row.

A leak in a training loop looks like this: each step keeps a little more
than the step before (a list that keeps one activation per step, a loss
kept with its graph), so the bytes live at one allocation site, sampled once
per step, rise step after step. `Streaks` follows that with a few numbers
per site: it is fed, one step marker at a time, the live bytes of each site
at that marker, and flags a site whose live bytes rose at each of at least
`n` (default STEPS) consecutive step markers. A rise is any increase, however
small; a marker where the site's bytes stay the same or fall ends the
streak. The report's pass (stream_leaks.py) and the live view both feed it
from their own state; `find_leaks` is the same for a list of markers.

Feeding it: `Streaks(n)`, then `marker(label, t_s, live)` for each step
marker in the log's order, `live` mapping each site's key (any hashable: the
report's site ids) to its live bytes then (a site not in it has 0), then
`leaks(describe)`: the flagged sites, `describe(key)` giving a site's label
("train.py:42 main") and its long location. It keeps per site its live
bytes at the last marker, its running streak and its last flagged streak:
nothing per marker, however many markers a log has. A caller that knows
which sites changed since the last marker says so (`changed`), and a
marker costs those sites and the running streaks rather than every site.

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

A `Leak` is its site's last streak of at least n rises: the bytes it grew
per step (the streak's growth over its rises, rounded down), the marker it
began at ("since step 3": the last marker before the first rise), how many
rises, the site's live bytes at the streak's last marker, and the marker
after its last rise when the streak ended before the last step marker
(`until`; None: still growing at the last one). `leaks` lists them the
largest growth per step first.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from ..units import fmt_bytes

STEPS = 5  # consecutive rises that flag a site
_STEP_WORDS = re.compile(r"\b(step|iter|iteration|epoch|batch)\b", re.I)


@dataclasses.dataclass
class Leak:
    site: str  # where its blocks were allocated ("train.py:42 main")
    location: str  # the long form ("/path/train.py:42 in main")
    per_step: int  # bytes it grew per step over the streak
    since: str  # the step marker the streak began at: its label
    since_t_s: float  # and its time
    steps: int  # rises in the streak (>= n)
    live: int  # the site's live bytes at the streak's last marker
    until: str | None  # the first step marker it did not rise at, when the streak ended before the last one

    def words(self) -> str:
        """'grows 64.0 MiB per step at train.py:42 main since step 3 (7 steps in a row; 448.0 MiB live then)';
        a streak that ended says where: '(5 steps in a row, until step 9; 320.0 MiB live then)'"""
        until = f", until {self.until}" if self.until is not None else ""
        return (f"grows {fmt_bytes(self.per_step)} per step at {self.site} since {self.since} ({self.steps} steps "
                f"in a row{until}; {fmt_bytes(self.live)} live then)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    live: int = 0  # at the last marker
    rises: int = 0  # the running streak: rises so far
    since: int = -1  # the marker it began at (its position among those fed)
    since_live: int = 0  # the site's bytes then
    flagged: tuple[int, int, int, int, int | None] | None = None  # (rises, since, since_live, live, until)


class Streaks:
    """Per site, its running streak of rises across step markers (module docstring)."""

    def __init__(self, n: int = STEPS) -> None:
        if n < 1:
            raise ValueError(f"a leak needs at least 1 rise, not {n}")
        self.n = n
        self.sites: dict[Hashable, _Site] = {}
        self._named: dict[int, tuple[str, float]] = {}  # fed marker -> (label, t_s): those a streak names
        self._forget_at = 16  # _named's size that sends it through _forget next
        self.running: set[Hashable] = set()  # the sites with a running streak
        self.fed = 0

    def marker(self, label: str, t_s: float, live: Mapping[Hashable, int],
               changed: Iterable[Hashable] | None = None) -> None:
        """The next step marker: its label, time and each site's live bytes then. `changed`, when given: every
        site whose live bytes differ from the last marker's (the others are not looked at: a marker then costs
        what changed, not every site)."""
        k = self.fed
        self.fed += 1
        self._named[k] = (label, t_s)
        keys = (set(self.sites) | {s for s, b in live.items() if b} if changed is None
                else self.running | set(changed))
        for key in keys:
            now = int(live.get(key, 0))
            st = self.sites.setdefault(key, _Site())
            if k and now > st.live:
                if not st.rises:
                    st.since, st.since_live = k - 1, st.live
                    self.running.add(key)
                st.rises += 1
                if st.rises >= self.n:  # the last flagged streak: this one, still running
                    st.flagged = (st.rises, st.since, st.since_live, now, None)
            else:
                if st.rises >= self.n:
                    st.flagged = (st.rises, st.since, st.since_live, st.live, k)
                st.rises = 0
                self.running.discard(key)
            st.live = now
            if not now and not st.rises and st.flagged is None:
                del self.sites[key]  # nothing to remember of it
        if len(self._named) > self._forget_at:  # now and then: forgetting looks at every site
            self._forget()
            self._forget_at = 2 * len(self._named) + 16

    def _forget(self) -> None:
        """Keeps the labels of the markers a streak or a flag names, and the last one (a streak may begin there)."""
        keep = {self.fed - 1}
        for st in self.sites.values():
            if st.rises:
                keep.add(st.since)
            if st.flagged is not None:
                keep.add(st.flagged[1])
                if st.flagged[4] is not None:
                    keep.add(st.flagged[4])
        self._named = {k: v for k, v in self._named.items() if k in keep}

    def leaks(self, describe: Callable[[Hashable], tuple[str, str]] = lambda k: (str(k), str(k))) -> list[Leak]:
        """The flagged sites, the largest growth per step first; `describe(key)`: a site's label and location."""
        out = []
        for key, st in self.sites.items():
            if st.flagged is None:
                continue
            rises, since, since_live, live, until = st.flagged
            label, location = describe(key)
            since_label, since_t = self._named[since]
            out.append(Leak(label, location, (live - since_live) // rises, since_label, since_t, rises, live,
                            self._named[until][0] if until is not None else None))
        out.sort(key=lambda x: (-x.per_step, -x.steps, x.site))
        return out


def find_leaks(markers: Iterable[tuple[str, float, Mapping[Hashable, int]]], n: int = STEPS,
               describe: Callable[[Hashable], tuple[str, str]] = lambda k: (str(k), str(k))) -> list[Leak]:
    """The leaks of step markers given as (label, t_s, {site key: live bytes}), in order (module docstring)."""
    streaks = Streaks(n)
    for label, t_s, live in markers:
        streaks.marker(label, t_s, live)
    return streaks.leaks(describe)
