"""Leaks: sites whose live bytes at the step markers gain a low point never given back (leaks.py says which).

The second pass hands `LeaksFollower` each piece's new and ended blocks
(`step`). A block counts at step marker j when it was allocated before the
marker and ended after it; so the follower adds a block's bytes to its site
at the first step marker after its allocation and takes them away at the
first after its end, keeps these changes only for the markers the pass has
not gone past yet, and once the pass has read up to a step marker hands
the sites' live bytes then to leaks.Trends. It holds each site's live
bytes and its trend: nothing per marker. It follows the step markers among
the first markers the first pass keeps (first.MARKERS_KEPT); the
blocks from before the log are not any site's and are left out.

The rows (`Leaks`) are the leaks, the largest growth per step first, and
the sites that grew, then stayed; the section lists both, the summary
(summary.py) names the first leaks, or says the run had too few step
markers for the rule.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..log.chunks import ChunkedLog
from ..printable import printable
from ..units import fmt_bytes, fmt_time
from .leaks import MIN_STEPS, Leak, Settled, Trends, step_markers, too_few
from .passes.follow import Blocks, Follower, Part, Section
from .passes.first import Scan
from .passes.pieces import report_start_ns
from .views import Analyzed, SectionView, Table


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
