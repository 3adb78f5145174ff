"""A block's details: what explains it and what the HTML page lists of it.

One dict per block shown (a lifetime row's block, a block the page can
list), with the keys report/data.py and the lifetimes section's sentence
read: `k` (its index in the blocks' order: those from before the log
first), where and when it was allocated, and, once it ended, where and
when and why. Built from the second pass' block table (second.py: one
column per name below, one row per block) and a block's end columns
(follow.end_columns), from the first pass' blocks allocated before the
log (`Scan.orphans`), or from the columns the modules section
(sections/modules.py) keeps of the blocks live at the peak (the same
names).
`module` and `tag` are its module and its tag's role, final once it ended:
columns the modules section's follower adds to the block table
(follow.py), 0 in a pass without it (`SHOWN`).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..rules.categorize import CATEGORY_CODE, Category
from ..rules.classify import REASON_CODE, Reason

R = REASON_CODE
# The columns a follower adds (follow.Follower.columns) that a block's details show, with their value where
# no follower of the pass gives them.
SHOWN = {"module": 0, "tag": 0}
# A block's end columns (follow.end_columns' keys), in with_end's order.
END_COLUMNS = ("free_i", "free_t", "free_phase", "free_stack", "free_site", "returned", "rerun", "reason")


def detail_alloc(first: int, bt: Mapping[str, np.ndarray], b: int) -> dict[str, Any]:
    """Row b of a block table (`first`: the index of the block of ordinal 0), as allocated."""
    return {"k": first + int(bt["ordinal"][b]), "addr": int(bt["addr"][b]), "size": int(bt["size"][b]),
            "block_size": int(bt["block_size"][b]), "phase": int(bt["phase"][b]), "site": int(bt["site"][b]),
            "category": int(bt["category"][b]), "occ": int(bt["occ"][b]), "alloc_i": int(bt["alloc_i"][b]),
            "alloc_t": int(bt["time"][b]), "alloc_stack": int(bt["stack"][b]), "free_i": -1, "free_t": -1,
            "free_phase": -1, "free_stack": 0, "free_site": -1, "returned": -1, "rerun": False,
            "reason": R[Reason.PERSISTENT],
            **{c: int(bt[c][b]) if c in bt else default for c, default in SHOWN.items()}}


def with_end(d: dict[str, Any], free_i: int, free_t: int, free_phase: int, free_stack: int, free_site: int,
             returned: int, rerun: bool, reason: int) -> dict[str, Any]:
    """`d` with its end: the free (or the next alloc of its address) at event free_i, and its reason."""
    d.update(free_i=int(free_i), free_t=int(free_t), free_phase=int(free_phase), free_stack=int(free_stack),
             free_site=int(free_site), returned=int(returned), rerun=bool(rerun), reason=int(reason))
    return d


def detail_ended(first: int, bt: Mapping[str, np.ndarray], b: int, row: int, real: bool, t: Any, base: int,
                 reason: int, free_site: int, returned: int, rerun: bool) -> dict[str, Any]:
    """Row b of a block table, ended at row `row` of piece `t` (starting at event `base`); `real`: by a free."""
    return with_end(detail_alloc(first, bt, b), base + int(row), int(t.time_ns[row]), int(t.phase[row]),
                    int(t.stack[row]) if real else 0, free_site, returned, rerun, reason)


def detail_with_end(first: int, bt: Mapping[str, np.ndarray], b: int, ends: Mapping[str, np.ndarray], j: int
                    ) -> dict[str, Any]:
    """Row b of a block table, ended: its end is row j of `ends` (END_COLUMNS, as follow.end_columns gives them)."""
    return with_end(detail_alloc(first, bt, b), *(ends[c][j] for c in END_COLUMNS))


def detail_orphan(orphans: Mapping[str, np.ndarray], k: int, site: int, first_ns: int, reason: int,
                  shown: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Block k, allocated before the log (`orphans`: Scan.orphans; `site`: the before-the-log site's id; `shown`:
    its values of SHOWN's columns, from the followers, default where absent)."""
    o = orphans
    return {"k": k, "addr": int(o["addr"][k]), "size": int(o["size"][k]), "block_size": int(o["block_size"][k]),
            "phase": -1, "site": site, "category": CATEGORY_CODE[Category.BEFORE_LOG], "occ": -1, "alloc_i": -1,
            "alloc_t": first_ns, "alloc_stack": 0, "free_i": int(o["free_i"][k]), "free_t": int(o["free_t"][k]),
            "free_phase": int(o["free_phase"][k]), "free_stack": int(o["free_stack"][k]), "free_site": -1,
            "returned": -1, "rerun": False, "reason": int(reason),
            **{c: int((shown or {}).get(c, default)) for c, default in SHOWN.items()}}
