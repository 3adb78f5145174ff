"""The two ways the report's tests analyse a log, and what they read back from the page.

Every log is analysed as analyze(path) reads it (pieces of log/chunks.py's DEFAULT_CHUNK_RECORDS: a test log
is one piece), and in pieces of PIECES records (the bundled log: BUNDLED_PIECES), so that blocks, phase
occurrences and markers cross pieces; the report must not tell them apart. The tests hold the report against
the log itself (log_oracle.py), never against per-event or per-block arrays, which the analysis does not keep.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from log_oracle import LogOracle
from synthlog import SynthLog

from torchalloc import analysis as A

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "python" / "torchalloc" / "data" / "phases_trace.talog.xz"

WAYS = ("default", "pieces")
PIECES = 5
BUNDLED_PIECES = 20_000


def analyse(source: SynthLog | Path, way: str, pieces: int = PIECES, **kw: Any) -> Any:
    path = source.file() if isinstance(source, SynthLog) else source
    if way == "default":
        return A.analyze(path, **kw)
    return A.analyze(path, chunk_records=pieces, page=True, **kw)


@functools.lru_cache(maxsize=None)
def oracle(path: Path, device: int | None = None) -> LogOracle:
    return LogOracle(path, device)


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    return request.param


def embedded(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m, "the page embeds no report-data"
    return json.loads(m.group(1))


def row_of(d: dict[str, Any], block_id: int) -> int:
    """The page's row (column position) of the block with id `block_id`."""
    return d["blocks"]["id"].index(block_id)


def page_block(d: dict[str, Any], k: int) -> dict[str, Any]:
    """The k-th block the page holds, its ids resolved to what they name (site: [label, location, frame?])."""
    B = d["blocks"]
    return {
        "id": B["id"][k], "site": d["sites"][B["site"][k]],
        "free_site": d["sites"][B["free_site"][k]] if B["free_site"][k] >= 0 else None,
        "reason": d["reasons"][B["reason"][k]], "category": d["categories"][B["category"][k]],
        "phase": d["phase_names"][B["phase"][k]], "why": d["sentences"][B["why"][k]],
        "size": B["size"][k], "requested": B["requested"][k],
    }
