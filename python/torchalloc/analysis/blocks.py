"""Blocks and phase occurrences: the event table regrouped by what lived and when.

Takes an `EventTable`; gives `Blocks` -- one row per block, its alloc
paired with its free by address in log order, with both stacks, phases,
threads and times -- and `Occurrences`, each run of each phase as a span
[begin, end) of event indices. A log without phases has no occurrences;
every question asked of them (`Occurrences.of`, `Occurrences.end_of`) has
an answer then too.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .._records import ALLOC, FREE, FREE_DEFERRED, PHASE_BEGIN, PHASE_END
from .events import EventTable

NEVER = np.iinfo(np.int64).max  # free index of a block never freed


@dataclasses.dataclass
class Blocks:
    """One row per block. alloc_i/free_i index the (device's) event table; alloc_i is -1 for a
    block allocated before the log began, free_i is NEVER for one still live at the end."""

    alloc_i: np.ndarray
    free_i: np.ndarray
    addr: np.ndarray
    size: np.ndarray  # requested bytes
    block_size: np.ndarray
    stream: np.ndarray
    alloc_phase: np.ndarray
    free_phase: np.ndarray  # -1 when never freed
    alloc_stack: np.ndarray
    free_stack: np.ndarray
    alloc_tid: np.ndarray
    free_tid: np.ndarray
    alloc_t: np.ndarray  # ns
    free_t: np.ndarray  # ns, -1 when never freed
    deferred: np.ndarray  # bool: freed with the record_stream flag

    def __len__(self) -> int:
        return int(self.alloc_i.shape[0])

    @property
    def persistent(self) -> np.ndarray:
        return self.free_i == NEVER


def pair_blocks(t: EventTable) -> tuple[Blocks, dict[str, int]]:
    """Pair each alloc with the next free of its address (log order). Returns the blocks and counts
    of oddities: frees of blocks allocated before the log, allocs over a still-live address."""
    n = len(t)
    rel = np.flatnonzero((t.kind == ALLOC) | (t.kind == FREE))
    counts = {"before_log": 0, "lost_frees": 0}
    if rel.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Blocks(*(empty.copy() for _ in range(14)), np.zeros(0, dtype=bool)), counts
    order = rel[np.lexsort((rel, t.addr[rel]))]
    is_alloc = t.kind[order] == ALLOC
    same_next = np.zeros(order.size, dtype=bool)
    same_next[:-1] = t.addr[order[1:]] == t.addr[order[:-1]]
    next_kind_free = np.zeros(order.size, dtype=bool)
    next_kind_free[:-1] = t.kind[order[1:]] == FREE
    # alloc -> its free (the next event on the address, when a free)
    paired = is_alloc & same_next & next_kind_free
    # alloc followed by another alloc on the address: its free was lost; end it there
    lost = is_alloc & same_next & ~next_kind_free
    counts["lost_frees"] = int(lost.sum())
    # a free whose previous event on the address is not an alloc: allocated before the log
    prev_is_alloc = np.zeros(order.size, dtype=bool)
    prev_is_alloc[1:] = is_alloc[:-1] & same_next[:-1]
    orphan_free = ~is_alloc & ~prev_is_alloc
    counts["before_log"] = int(orphan_free.sum())

    alloc_pos = np.flatnonzero(is_alloc)
    alloc_i = order[alloc_pos]
    free_i = np.full(alloc_i.size, NEVER, dtype=np.int64)
    has_next = alloc_pos + 1 < order.size
    nxt = np.where(has_next, order[np.minimum(alloc_pos + 1, order.size - 1)], NEVER)
    ends = paired[alloc_pos] | lost[alloc_pos]
    free_i[ends] = nxt[ends]
    real_free = paired[alloc_pos]

    orphan_i = order[orphan_free]
    all_alloc = np.concatenate([np.full(orphan_i.size, -1, dtype=np.int64), alloc_i])
    all_free = np.concatenate([orphan_i, free_i])
    src = np.concatenate([orphan_i, alloc_i])  # where size/addr/stream come from
    real = np.concatenate([np.ones(orphan_i.size, dtype=bool), real_free])
    sort = np.argsort(all_alloc, kind="stable")
    all_alloc, all_free, src, real = all_alloc[sort], all_free[sort], src[sort], real[sort]
    freed = all_free != NEVER
    fi = np.where(freed, all_free, 0)
    before = all_alloc < 0
    ai = np.where(before, 0, all_alloc)
    blocks = Blocks(
        alloc_i=all_alloc,
        free_i=all_free,
        addr=t.addr[src],
        size=t.size[src],
        block_size=t.block_size[src],
        stream=t.stream[src],
        alloc_phase=np.where(before, -1, t.phase[ai]).astype(np.int32),
        free_phase=np.where(freed, t.phase[fi], -1).astype(np.int32),
        alloc_stack=np.where(before, 0, t.stack[ai]),
        free_stack=np.where(freed & real, t.stack[fi], 0),
        alloc_tid=np.where(before, -1, t.tid[ai]),
        free_tid=np.where(freed, t.tid[fi], -1),
        alloc_t=np.where(before, t.time_ns[0] if n else 0, t.time_ns[ai]),
        free_t=np.where(freed, t.time_ns[fi], -1),
        deferred=np.where(freed & real, (t.flags[fi] & FREE_DEFERRED) != 0, False),
    )
    return blocks, counts


# ---------------------------------------------------------------------------
# Phase occurrences
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Occurrences:
    """Each occurrence of each phase: [begin_i, end_i) in the event table (end_i = n if open at the end)."""

    phase: np.ndarray
    epoch: np.ndarray
    begin_i: np.ndarray
    end_i: np.ndarray

    def of(self, phase: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The occurrence (row here) of `phase` current at event `index`; -1 where none (phase 0, no begin)."""
        out = np.full(np.shape(index), -1, dtype=np.int64)
        for p in np.unique(phase):
            rows = np.flatnonzero(self.phase == p)
            if rows.size == 0:
                continue
            sel = phase == p
            k = np.searchsorted(self.begin_i[rows], index[sel], side="right") - 1
            out[sel] = np.where(k >= 0, rows[np.maximum(k, 0)], -1)
        return out

    def end_of(self, rows: np.ndarray, none: int) -> np.ndarray:
        """The end index of each occurrence in `rows` (rows here, as `of` gives them); `none` where a
        row is -1. Without any occurrence (a log without phases) every row is -1: all `none`."""
        if self.end_i.size == 0:
            return np.full(np.shape(rows), none, dtype=np.int64)
        return np.where(rows >= 0, self.end_i[np.maximum(rows, 0)], none)


def phase_occurrences(t: EventTable) -> Occurrences:
    """Every phase_begin record opens an occurrence; the phase_end of the same phase and epoch closes it."""
    n = len(t)
    begins = np.flatnonzero(t.kind == PHASE_BEGIN)
    ends = np.flatnonzero(t.kind == PHASE_END)
    end_of: dict[tuple[int, int], int] = {}
    for i in ends.tolist():
        end_of.setdefault((int(t.phase[i]), int(t.size[i])), i)
    phase = t.phase[begins].astype(np.int64)
    epoch = t.size[begins].astype(np.int64)
    end_i = np.array([end_of.get((int(p), int(e)), n) for p, e in zip(phase, epoch)], dtype=np.int64)
    return Occurrences(phase, epoch, begins.astype(np.int64), end_i)
