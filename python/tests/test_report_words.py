"""The report's words agree with each other (issue 25 item 4): one category per anatomy row, the same counts in
every table, whole-run blocks persistent whatever their phase."""
from __future__ import annotations

from pathlib import Path

from synthlog import SynthLog
from torchalloc import analysis as A

MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "torchalloc" / "data"


def test_anatomy_rows_are_one_category_each_and_agree_with_the_category_line() -> None:
    a = A.analyze(DATA / "phases_trace.talog.xz")
    anat = a.anatomy("peak")
    per_cat: dict[str, int] = {}
    for row in anat.rows:
        per_cat[row.category] = per_cat.get(row.category, 0) + row.bytes
    assert per_cat == anat.by_category
    params = [r for r in anat.rows if r.category == "parameters"]
    lifetimes = [r for r in a.lifetimes() if r.category == "parameters" and r.reason == "persistent"]
    assert [(r.count, r.bytes) for r in params] == [(r.count, r.bytes) for r in lifetimes]
    assert params[0].reason == "persistent"


def test_a_block_living_through_the_whole_run_is_persistent_whatever_its_phase() -> None:
    log = SynthLog()
    log.alloc(0x1000, 4 * MiB)  # a parameter, made before the first phase
    for _ in range(2):
        log.begin("forward")
        log.alloc(0x900000, 2 * MiB)
        log.free(0x900000)
        log.end()
    log.free(0x1000)  # teardown, after the last phase
    a = log.analyze()
    k = int(next(i for i in range(len(a.blocks)) if a.blocks.addr[i] == 0x1000))
    assert A.REASONS[int(a.classified.reason[k])] is A.Reason.PERSISTENT
    assert "lived through the whole run" in a.explanation(k)
    other = 1 - k
    assert A.REASONS[int(a.classified.reason[other])] is not A.Reason.PERSISTENT
