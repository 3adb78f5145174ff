"""Which address range held an address at a moment: a block's segment (sections/reserve/terms.py), a tagged
block (sections/modules.py).

`holders` answers many such questions at once, for ranges that each held
[start, start + size) from one event index to another. The second pass
asks it piece by piece, about the ranges of the piece (those live at some
moment in it), so the work is bounded by the piece.
"""
from __future__ import annotations

import numpy as np


def holders(addr: np.ndarray, at: np.ndarray, start: np.ndarray, size: np.ndarray, made: np.ndarray,
            ended: np.ndarray) -> np.ndarray:
    """Per question (address, event index), the range holding it: of the ranges live then (made before the index,
    ended after it) whose [start, start + size) holds the address, the one starting highest, of those the last
    made (then the last given). -1: none. In a consistent log at most one range is live at an address.

    The ranges sorted by (start, made): a question looks at the highest start at or below its address whose
    ranges reach the address (a jump table finds it), and there at the last range made before its index; if
    that one had ended or is too short, at earlier ranges of that start while one of them may be live still,
    then at the next start down that reaches the address, until none does."""
    out = np.full(addr.size, -1, dtype=np.int64)
    if not start.size or not addr.size:
        return out
    addr = np.asarray(addr, dtype=np.uint64)
    order = np.lexsort((made, start))
    S, A, F = np.asarray(start, dtype=np.uint64)[order], made[order], ended[order]
    E = S + np.asarray(size, dtype=np.int64)[order].astype(np.uint64)
    new_group = np.concatenate(([True], S[1:] != S[:-1]))
    first = np.flatnonzero(new_group)
    gid = np.cumsum(new_group) - 1
    table = _JumpTable(np.maximum.reduceat(E, first))
    # per range, the latest end among the ranges of its start made no later: in rank space (ends may be int64's
    # largest), each start offset past the one below so that the running maximum restarts at each start
    e_values, e_rank = np.unique(F, return_inverse=True)
    span = e_values.size
    live_until = e_values[np.maximum.accumulate(gid * span + e_rank.reshape(-1)) - gid * span]
    # (start, made) as one sortable key: made + 1 (>= 0) below a span per start; a question's index caps at the span
    span_t = int(A.max()) + 2
    if int(gid[-1]) + 1 > (1 << 62) // span_t:  # (indices too large for one int64 key: ranks instead)
        t_values = np.unique(np.concatenate((A, at)))
        span_t = t_values.size + 1
        key, at_key = gid * span_t + np.searchsorted(t_values, A) + 1, np.searchsorted(t_values, at) + 1
    else:
        key, at_key = gid * span_t + A + 1, np.minimum(at + 1, span_t)

    def last_made_before(g: np.ndarray, todo: np.ndarray) -> np.ndarray:
        return np.searchsorted(key, g * span_t + at_key[todo], side="left") - 1

    todo = np.arange(addr.size)
    g = table.reaching(np.searchsorted(S[first], addr, side="right") - 1, addr)
    keep = g >= 0
    todo, g = todo[keep], g[keep]
    pos = last_made_before(g, todo)
    while todo.size:
        a, b = addr[todo], at[todo]
        p = np.maximum(pos, 0)
        maybe = (pos >= 0) & (gid[p] == g) & (live_until[p] > b)  # a range of this start made before may be live
        hit = maybe & (F[p] > b) & (E[p] > a)
        out[todo[hit]] = order[p[hit]]
        down = ~maybe
        pos = np.where(maybe, pos - 1, pos)
        g = np.where(down, table.reaching(g - 1, a), g)
        keep = ~hit & (g >= 0)
        todo, g, pos, down = todo[keep], g[keep], pos[keep], down[keep]
        if down.any():
            pos[down] = last_made_before(g[down], todo[down])
    return out


class _JumpTable:
    """Per start (ascending), the highest end of its ranges; finds the highest start at or below a given one
    whose ranges reach an address, in log2(starts) steps for all questions at once."""

    def __init__(self, high: np.ndarray) -> None:
        self.levels = [high]  # levels[k][j]: the highest end of starts j .. j + 2^k - 1
        while (1 << len(self.levels)) <= len(high):
            w = 1 << (len(self.levels) - 1)
            last = self.levels[-1]
            self.levels.append(np.maximum(last[:-w], last[w:]))

    def reaching(self, g: np.ndarray, addr: np.ndarray) -> np.ndarray:
        """For each g (a start's rank, -1: none), the highest rank <= g whose ranges end above addr; -1: none."""
        cur = g.copy()
        there = (cur >= 0) & (self.levels[0][np.maximum(cur, 0)] > addr)  # most: the start itself reaches
        if there.all():
            return cur
        todo = np.flatnonzero(~there)
        cur[todo] = self._down(cur[todo], addr[todo])
        return cur

    def _down(self, g: np.ndarray, addr: np.ndarray) -> np.ndarray:
        cur = g.copy()
        for k in range(len(self.levels) - 1, -1, -1):
            w = 1 << k
            lo = cur - w + 1
            ok = lo >= 0
            level = self.levels[k]
            skip = np.zeros(cur.size, dtype=bool)
            skip[ok] = level[lo[ok]] <= addr[ok]
            cur = np.where(skip, cur - w, cur)
        return cur
