"""examples/puzzle_common.py reads the analysis through its public API (the GPU puzzles use it; this
runs it on the bundled demo trace, without a GPU, so a change of that API fails here first)."""
from __future__ import annotations

import sys
from pathlib import Path

from torchalloc.analysis import analyze

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import puzzle_common  # noqa: E402

DEMO = REPO / "python" / "torchalloc" / "data" / "demo_trace.talog.xz"


def test_reasons_at_sums_the_lifetime_rows_of_one_line() -> None:
    a = analyze(DEMO)
    row = next(r for r in a.lifetimes() if r.location and ".py:" in r.site)
    file, line = row.site.split(" ")[0].rsplit(":", 1)
    reasons = puzzle_common.reasons_at(a, "/any/dir/" + file, int(line))
    same_line = [r for r in a.lifetimes() if r.site.split(" ")[0] == f"{file}:{line}"]
    assert reasons and sum(reasons.values()) == sum(r.bytes for r in same_line)
    assert row.reason in reasons and reasons[row.reason] >= row.bytes
    shown = puzzle_common.explain_line(a, file, int(line), "the demo's line")
    assert [r["bytes"] for r in shown] == [r.bytes for r in same_line]
    assert puzzle_common.reasons_at(a, file, 10**6) == {}
