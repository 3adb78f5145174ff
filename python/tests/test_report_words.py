"""The report's words agree with each other (issue 25 item 4): one category per anatomy row, the same counts in
every table, whole-run blocks persistent whatever their phase. Each test runs on the log read whole and read in
pieces (report_ways.py); what a block is comes from the log (log_oracle.py) and what the report
says of it from the report itself: its lifetimes table and the page's data."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from log_oracle import LogOracle  # noqa: E402
from report_ways import BUNDLED, BUNDLED_PIECES, analyse, embedded, page_block, row_of  # noqa: E402
from report_ways import way  # noqa: E402,F401  (a fixture)
from synthlog import SynthLog  # noqa: E402

from torchalloc.report.html import render_html  # noqa: E402

MiB = 1 << 20


def test_anatomy_rows_are_one_category_each_and_agree_with_the_category_line(way: str) -> None:
    a = analyse(BUNDLED, way, pieces=BUNDLED_PIECES)
    anat = a.anatomy("peak")
    per_cat: dict[str, int] = {}
    for row in anat.rows:
        per_cat[row.category] = per_cat.get(row.category, 0) + row.bytes
    assert per_cat == anat.by_category
    params = [r for r in anat.rows if r.category == "parameters"]
    lifetimes = [r for r in a.lifetimes() if r.category == "parameters" and r.reason == "persistent"]
    assert [(r.count, r.bytes) for r in params] == [(r.count, r.bytes) for r in lifetimes]
    assert params[0].reason == "persistent"


def test_a_block_living_through_the_whole_run_is_persistent_whatever_its_phase(way: str) -> None:
    log = SynthLog()
    log.alloc(0x1000, 4 * MiB)  # a parameter, made before the first phase
    for _ in range(2):
        log.begin("forward")
        log.alloc(0x900000, 2 * MiB)
        log.free(0x900000)
        log.end()
    log.free(0x1000)  # teardown, after the last phase
    path = log.file()
    a, o = analyse(path, way), LogOracle(path)
    d = embedded(render_html(a))
    (k,) = [b.id for b in o.blocks if b.addr == 0x1000]
    assert not o.blocks[k].never_freed  # freed in the log: only after the run's last phase
    block = page_block(d, row_of(d, k))
    assert block["reason"] == "persistent" and "lived through the whole run" in block["why"]
    others = [page_block(d, row_of(d, b.id)) for b in o.blocks if b.id != k]
    assert len(others) == 2 and all(p["reason"] != "persistent" for p in others)
    # the lifetimes table says the same: one persistent row, the parameter's, in the same words
    (row,) = [r for r in a.lifetimes() if r.reason == "persistent"]
    assert (row.count, row.bytes) == (1, 4 * MiB) and "lived through the whole run" in row.explanation
