"""The tools' outputs stay the same, byte for byte: `torchalloc report` (text, --json, --html), `export` and
`replay --json --no-search` on the bundled traces, the reclaim log and the hand-made scenarios, against what
report_golden.py recorded in data/report_golden.json.

A change to the analysis that is meant to change no figure (one pipeline for logs read whole or in pieces,
say) must leave this green; a change meant to change a report records it anew (`python3
python/tests/report_golden.py --write`) in the same commit."""
from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import report_golden  # noqa: E402

GOLDEN = json.loads(report_golden.GOLDEN.read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("golden")
    names = report_golden.write_logs(d)
    assert names == sorted(GOLDEN), "the golden set's logs changed: record it anew"
    return d


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_report_is_the_recorded_one(folder: Path, name: str) -> None:
    got = report_golden.reports(folder, name)
    want = GOLDEN[name]
    if got["text"] != want["text"]:
        diff = "".join(difflib.unified_diff(want["text"].splitlines(True), got["text"].splitlines(True),
                                            "recorded", "today", n=1))
        pytest.fail(f"the text report of {name} changed:\n{diff[:6000]}")
    changed = [fmt for fmt in report_golden.OUTPUTS if fmt != "text"
               and report_golden.digest(got[fmt]) != want[f"{fmt}_sha256"]]
    assert not changed, f"what torchalloc {', '.join(changed)} made of {name} changed"
