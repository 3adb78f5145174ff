"""Reserved memory explained (analysis/sections/reserve/): hand-made logs with known segment layouts,
and the bundled trace. The terms are kept at the two peaks (the section's moments) and, for fragmentation, at the
timeline's samples (the page's band; the log's last event is always one)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from synthlog import USER, SynthLog
from torchalloc import analysis as A
from torchalloc._records import SEGMENT_COMPACT, SEGMENT_EXPANDABLE, SEGMENT_RECLAIM
from torchalloc.analysis.sections.reserve.rows import policy_name

MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "torchalloc" / "data"


def _sum_is_reserved(a: A.Analysis) -> None:
    """At each moment of the section the terms add up to reserved, none below zero; at every sample the
    fragmented bytes lie within what reserved holds beyond allocated."""
    for m in a.reserve().moments:
        terms = [m.allocated, m.fragmented, m.cached, m.mapped_free, m.before_log]
        assert sum(terms) == m.reserved and min(terms) >= 0, m.at
    tl, frag = a.timeline, a.fragmented_samples()
    assert frag.size == tl.index.size and (frag >= 0).all() and (frag <= tl.reserved - tl.allocated).all()


def _at_end(a: A.Analysis) -> tuple[int, int, int, int]:
    """Reserved, allocated and fragmented after the last event, and the rest (cached + mapped_free + before_log)."""
    end = a.anatomy("end")
    fragmented = int(a.fragmented_samples()[-1])
    return end.reserved, end.allocated, fragmented, end.reserved - end.allocated - fragmented


def test_two_segments_one_pinned_one_wholly_free() -> None:
    log = SynthLog()
    big, small = 0x10000000, 0x20000000
    log.segment(big, 10 * MiB)
    log.alloc(big, 2 * MiB, stack=log.stack((USER, 7, "keep")))
    log.alloc(big + 2 * MiB, 3 * MiB)
    log.segment(small, 4 * MiB)
    log.alloc(small, 4 * MiB)
    log.free(small)
    log.free(big + 2 * MiB)
    a = log.analyze()
    _sum_is_reserved(a)
    r = a.reserve()
    peak_r = r.moments[0]
    assert peak_r.at == "peak reserved" and peak_r.reserved == 14 * MiB
    # reserved peaks when `small` is made: 2+3 MiB live in `big`, `small` empty
    assert (peak_r.allocated, peak_r.fragmented, peak_r.cached) == (5 * MiB, 5 * MiB, 4 * MiB)
    peak_a = r.moments[1]  # allocated peaks at 9 MiB, with `small` full
    assert (peak_a.allocated, peak_a.fragmented, peak_a.cached) == (9 * MiB, 5 * MiB, 0)
    assert (peak_a.holding, peak_a.empty) == (1, 0)
    assert _at_end(a) == (14 * MiB, 2 * MiB, 8 * MiB, 4 * MiB)  # at the end: only the 2 MiB block, `small` cached
    top = peak_a.pinned[0]
    assert (top.addr, top.free, top.live_blocks) == (big, 5 * MiB, 2)
    assert top.blocks[0].size == 3 * MiB and "keep" in top.blocks[1].site


def test_a_freed_segment_leaves_the_cache_and_expandable_granules_count_apart() -> None:
    log = SynthLog()
    seg, exp = 0x10000000, 0x40000000
    log.segment(seg, 8 * MiB)
    log.alloc(seg, 1 * MiB)
    log.free(seg)
    log.segment_free(seg, 8 * MiB)
    log._row(kind=A.SEGMENT_ALLOC, addr=exp, size=4 * MiB, block_size=4 * MiB, flags=SEGMENT_EXPANDABLE)
    log._row(kind=A.SEGMENT_ALLOC, addr=exp + 4 * MiB, size=4 * MiB, block_size=4 * MiB, flags=SEGMENT_EXPANDABLE)
    log.alloc(exp, 3 * MiB)
    log.alloc(exp + 6 * MiB, 1 * MiB)
    # unmap the middle granules [4, 6) MiB: the rest stays mapped
    log._row(kind=A.SEGMENT_FREE, addr=exp + 4 * MiB, size=2 * MiB, block_size=2 * MiB, flags=SEGMENT_EXPANDABLE)
    a = log.analyze()
    _sum_is_reserved(a)
    assert _at_end(a) == (6 * MiB, 4 * MiB, 0, 2 * MiB)  # the 2 MiB rest: the free mapped granules
    peak_r, peak_a = a.reserve().moments
    assert (peak_r.cached, peak_r.mapped_free, peak_r.before_log) == (8 * MiB, 0, 0)  # the plain segment, empty
    assert (peak_a.allocated, peak_a.mapped_free, peak_a.cached, peak_a.before_log) == (4 * MiB, 4 * MiB, 0, 0)


def test_one_unmap_over_two_mapped_runs_unmaps_both() -> None:
    """An expandable segment maps its granules run by run and may give back several runs with one record: each run
    the record's range covers is unmapped (the second used to stay mapped forever, counted among the segments)."""
    log = SynthLog()
    exp = 0x40000000
    for k in range(2):
        log._row(kind=A.SEGMENT_ALLOC, addr=exp + 2 * k * MiB, size=2 * MiB, block_size=2 * MiB,
                 flags=SEGMENT_EXPANDABLE)
    log.alloc(exp + 2 * MiB, 1 * MiB)
    log.free(exp + 2 * MiB)
    log._row(kind=A.SEGMENT_FREE, addr=exp, size=4 * MiB, block_size=4 * MiB, flags=SEGMENT_EXPANDABLE)
    log._row(kind=A.SEGMENT_ALLOC, addr=exp, size=4 * MiB, block_size=4 * MiB, flags=SEGMENT_EXPANDABLE)
    log.alloc(exp + 3 * MiB, 1 * MiB)
    log.alloc(exp, 1 * MiB)
    a = log.analyze()
    _sum_is_reserved(a)
    assert _at_end(a) == (4 * MiB, 2 * MiB, 0, 2 * MiB)
    peak_r, peak_a = a.reserve().moments
    assert (peak_r.segments, peak_r.mapped_free) == (2, 4 * MiB)  # the two runs mapped
    # after the one unmap and the new run: one segment (the second run did not stay mapped), its free bytes pinned
    assert (peak_a.at, peak_a.segments, peak_a.pinned[0].free) == ("peak allocated", 1, 2 * MiB)


def test_blocks_from_before_the_log_fall_in_the_before_log_term() -> None:
    log = SynthLog()
    log.live[0x5000000] = (2 * MiB, 2 * MiB)
    log.segment(0x10000000, 4 * MiB)
    log.alloc(0x10000000, 1 * MiB)
    log.free(0x5000000)  # allocated before the log began: its segment is unknown
    a = log.analyze()
    _sum_is_reserved(a)
    # reserved starts at the 2 MiB the pre-log block needs; once it is freed, its unknown segment is free
    m = a.reserve().moments[-1]
    assert (m.at, m.reserved, m.allocated, m.fragmented, m.before_log) == ("peak allocated", 6 * MiB, 3 * MiB,
                                                                           3 * MiB, 0)
    assert _at_end(a) == (6 * MiB, 1 * MiB, 3 * MiB, 2 * MiB)  # the rest: the freed pre-log block's segment


def test_the_bundled_trace_adds_up_exactly_and_names_the_best_change(library_path: Path) -> None:
    a = A.analyze(DATA / "phases_trace.talog.xz")
    _sum_is_reserved(a)
    r = a.reserve()
    by_at = {m.at: m for m in r.moments}
    pa = by_at["peak allocated"]
    assert pa.reserved == a.timeline.peak_reserved == 12383682560
    assert pa.allocated == a.timeline.peak_allocated
    assert pa.allocated + pa.fragmented + pa.cached + pa.mapped_free + pa.before_log == pa.reserved
    assert pa.fragmented > 0 and pa.cached > 0 and pa.pinned and pa.pinned[0].free >= pa.pinned[-1].free
    assert r.replays[0].recording and r.replays[0].policy == "caching"
    assert r.replays[0].peak_reserved == a.timeline.peak_reserved  # the replay is the recording
    assert r.best is not None and r.best.peak_reserved < r.replays[0].peak_reserved
    words = " ".join(r.sentences)
    assert "phase_arena loses here" in words and "saved the most" in words
    d = json.loads(json.dumps(a.to_dict(top=5)))
    assert d["reserve"]["moments"][0]["fragmented"] == r.moments[0].fragmented
    assert d["reserve_replays"]["best"] == r.best.policy


def test_a_reclaim_log_splits_reserved_with_no_negative_term() -> None:
    """A log recorded on the H100 under the default, expandable:reclaim (examples/record_demo_trace.py): a granule
    is mapped at its new address before its old one is unmapped, so the log's mapped runs outgrow the reserved
    memory for a while. Every term stays >= 0 and they add up to reserved (the before-log term
    went to -744 MiB before aliased granules were counted once): at the peaks, and the fragmentation at every
    sample."""
    d = A.analyze(Path(__file__).parent / "data" / "reclaim_demo.talog.xz")
    _sum_is_reserved(d)
    assert len(d.reserve().moments) == 2


def test_on_a_tie_the_best_change_is_the_one_that_never_waits_for_the_device() -> None:
    """caching+compact and a reclaim variant reserve the same on the phases trace; compact synchronizes 45 times."""
    from torchalloc.analysis.sections.reserve.rows import Reserve, ReplayRow

    rows = [ReplayRow("caching", 100, 50, True, False), ReplayRow("caching+compact", 60, 50, False, False, 45),
            ReplayRow("phase_arena+reclaim", 60, 50, False, False, 0)]
    r = Reserve(moments=[], recording_policy="caching", replays=rows, unknown=[])
    assert r.best is not None and r.best.policy == "phase_arena+reclaim"


@pytest.mark.parametrize("mode, variant", [("1", "caching+expandable"), ("2", "caching+compact"),
                                           ("3", "caching+reclaim"), ("off", "caching")])
def test_the_recording_variant_is_read_from_the_log(library_path: Path, tmp_path: Path, mode: str,
                                                    variant: str) -> None:
    """The library's segment records carry their policy's mode, so the report replays the variant that recorded
    the log as the recording one (a log of the default, reclaim, was replayed as caching+expandable)."""
    from torchalloc import _lib

    path = tmp_path / "run.talog"
    _lib.init(f"backend:sim,sim_capacity:1GiB,warn:0,oom_report:off,expandable:{mode},log:{path}")
    try:
        lib = _lib.lib()
        blocks = [lib.torchalloc_malloc(size << 20, 0, None) for size in (3, 9, 30, 1)]
        assert all(blocks)
        for p, size in zip(blocks, (3, 9, 30, 1)):
            lib.torchalloc_free(p, size << 20, 0, None)
    finally:
        _lib.teardown()  # closes the log
    r = A.analyze(path).reserve()
    assert r.recording_policy == variant
    assert r.replays[0].policy == variant and r.replays[0].recording


def test_a_log_before_the_mode_flags_names_the_expandable_variant() -> None:
    policies = np.zeros(256, dtype=np.int64)
    policies[0] = 5  # caching
    assert policy_name(policies, 0) == "caching"
    assert policy_name(policies, SEGMENT_EXPANDABLE) == "caching+expandable"
    assert policy_name(policies, SEGMENT_EXPANDABLE | SEGMENT_COMPACT) == "caching+compact"
    assert policy_name(policies, SEGMENT_EXPANDABLE | SEGMENT_COMPACT | SEGMENT_RECLAIM) == "caching+reclaim"
