"""A passing run warns nothing (issue 50). The RuntimeWarning "invalid value encountered in cast" at
analysis/sections/ooms/diagnosis.py came from the blocks live at an OOM: with no block from before the log, the
empty orphans' addresses were int64, their concatenation with the blocks' uint64 ones float64, and an address near
2**64 rounded past it before being cast back."""
from __future__ import annotations

import warnings

import numpy as np

from synthlog import SynthLog

TOP = 0xFFFF_FFFF_FFFF_F000  # a hand-made or damaged log's address in the last page of the address space


def test_the_blocks_live_at_a_moment_keep_their_exact_addresses_and_nothing_warns() -> None:
    log = SynthLog()
    log.segment(0x100000, 4 << 20)
    log.alloc(0x100000, 1 << 20)
    log.alloc(TOP, 2 << 20)
    log.oom(64 << 20, 4 << 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = log.analyze()
        snap = a.passed.snapshots[a.scan.peak_i]
        assert snap["addr"].dtype == np.uint64
        assert sorted(int(x) for x in snap["addr"]) == [0x100000, TOP]
        assert a.ooms() and a.ooms()[-1].requested == 64 << 20
