"""The report's summary, its width and the markers' stretches (issue 35, items 1 and 2).

The text report opens with a summary of at most 25 lines (the peak, the
reserve split, the top reasons live at the peak, what each kind of marker
shows, the change to try first, the OOM), fits COLUMNS (else
100) without cutting a figure, and the JSON carries the same summary. The
"Between markers" section says what each stretch from a marker to the next
allocated, freed and kept: its sums are checked against a hand-made log,
and the demo's walked cases (a rebinding, a function's temporary, a
checkpoint, a stray reference cleared) are in the default report.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import cli  # noqa: E402
from synthlog import SynthLog  # noqa: E402

from torchalloc.analysis.sections.reserve.rows import ReplayRow, Reserve  # noqa: E402
from torchalloc.analysis.summary import Change, first_change  # noqa: E402
from torchalloc.units import MiB, fmt_bytes  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "torchalloc" / "data"
BUNDLED = [DATA / "demo_trace.talog.xz", DATA / "phases_trace.talog.xz"]


def _summary_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("== Summary")
    return lines[start:lines.index("", start)]


def _flat(text: str) -> str:
    """The text with its line breaks and indents as single spaces: a wrapped phrase reads as one."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bundled logs, and a hand-made run that ends out of memory (test_streamed's scenario)."""
    from synthfile import write_log
    from test_streamed import SCENARIOS

    oom = write_log(SCENARIOS["oom_demo"](), tmp_path_factory.mktemp("oom") / "oom.talog", start_ns=10**9)
    return {**{p.name: p for p in BUNDLED}, "oom": oom}


@pytest.fixture(scope="module")
def reports(logs: dict[str, Path]) -> dict[str, dict[str, object]]:
    """Each log's JSON report, once."""
    out: dict[str, dict[str, object]] = {}
    for name, log in logs.items():
        status, stdout, stderr = cli("report", "--json", str(log))
        assert status == 0, stderr
        out[name] = json.loads(stdout)
    return out


def _figures(s: dict) -> list[str]:
    """The summary's figures as the text prints them, each of which must appear whole in the summary's lines."""
    out = [fmt_bytes(s["peak"]["allocated"]), fmt_bytes(s["peak"]["reserved"])]
    if s["reserve"]:
        out += [fmt_bytes(s["reserve"][k]) for k in ("reserved", "allocated", "fragmentation", "cache")]
    out += [fmt_bytes(x["bytes"]) for x in s["live"]]
    if s["change"]:
        out += [fmt_bytes(s["change"]["reserves"]), fmt_bytes(s["change"]["saves"])]
    return out


@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("name", [p.name for p in BUNDLED] + ["oom"])
def test_the_text_fits_columns_and_opens_with_the_summary(name: str, columns: int, logs: dict, reports: dict,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    status, text, err = cli("report", str(logs[name]))
    assert status == 0, err
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line) > columns]
    assert not too_wide, too_wide[:3]
    assert next(line for line in lines if line.startswith("== ")) == "== Summary"  # first, before the timeline
    summary = _summary_lines(text)
    assert len(summary) <= 25
    said = "\n".join(summary)
    s = reports[name]["summary"]
    for figure in _figures(s):  # whole: a figure broken over two lines would not be found
        assert figure in said, (figure, said)
    for x in s["live"]:
        assert x["site"] in _flat(said)
    if s["change"]:
        assert f"TORCHALLOC_CONF={s['change']['setting']}" in _flat(said)
    if s["oom"]:
        assert f"asking {fmt_bytes(s['oom']['requested'])}: {s['oom']['verdict']}" in _flat(said)
        assert f"First advice: {s['oom']['advice']}" in _flat(said)


def test_without_columns_a_pipe_gets_100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    status, text, err = cli("report", str(BUNDLED[0]))  # captured: not a terminal
    assert status == 0, err
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) <= 100 and max(widths) > 80  # 100 is used, not a narrower guess


def test_the_json_summary_is_the_peak_and_the_sections_figures(reports: dict) -> None:
    d = reports["demo_trace.talog.xz"]
    s = d["summary"]
    assert s["peak"]["allocated"] == d["peak_allocated"] and s["peak"]["reserved"] == d["peak_reserved"]
    assert s["peak"]["allocated_t_s"] == pytest.approx(d["timeline"]["peak"]["t_s"], abs=1e-6)
    at_peak = next(m for m in d["reserve"]["moments"] if m["at"] == "peak allocated")
    r = s["reserve"]
    assert (r["reserved"], r["allocated"], r["fragmentation"], r["cache"]) == (
        at_peak["reserved"], at_peak["allocated"], at_peak["fragmented"], at_peak["cached"])
    assert r["allocated"] + r["fragmentation"] + r["cache"] + r["mapped_free"] + r["before_log"] == r["reserved"]
    anatomy = d["peak_anatomy"]["rows"]
    with_line = [row for row in anatomy if not row["site"].startswith("(")]
    assert [x["site"] for x in s["live"]] == [row["site"] for row in with_line[:3]]  # source lines first
    replays = d["reserve_replays"]["replays"]
    base = replays[0]["peak_reserved"]
    # the demo: only exact (no cache) and +compact (synchronizes) reserve less; compact keeps a cache
    assert s["change"]["policy"] == "caching+compact" and "synchronize" in s["change"]["cost"]
    assert s["change"]["least_policy"] == d["reserve_replays"]["best"] == "exact"
    assert s["change"]["saves"] == base - next(r["peak_reserved"] for r in replays if r["policy"] == "caching+compact")
    kinds = {re.sub(r"\d+", "N", m["label"]) for m in d["timeline"]["markers"]}
    assert s["marker_kinds"] == len(kinds) and len(s["markers"]) == len(kinds)
    step = next(m for m in s["markers"] if m["label"].startswith("step "))
    assert step["label"] == "step 1" and step["kind_count"] == sum(m["label"].startswith("step ")
                                                                     for m in d["timeline"]["markers"])


def _stretches(d: dict) -> dict[str, dict]:
    return {r["label"]: r for r in d["stretches"]["stretches"]}


def test_the_demos_walked_cases_are_in_the_default_report(reports: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    status, text, err = cli("report")
    assert status == 0, err
    flat = _flat(text)
    rows = _stretches(reports["demo_trace.talog.xz"])

    def group(label: str, reason: str, where: str = "") -> dict:
        found = [g for g in rows[label]["freed_groups"] if g["reason"] == reason and where in g["site"]]
        assert found, (label, reason, rows[label]["freed_groups"])
        return found[0]

    walked = [group("rebinding", "freed on rebinding", "record_demo_trace.py"),
              group("function temporary", "freed when its function returned", "normalized"),
              group("checkpoint", "saved for backward", "checkpointed_step"),
              group("stray reference cleared", "freed on rebinding")]
    stray = walked[-1]  # stray.clear(): the logits, allocated in the model, freed on the line that clears the list
    assert "record_demo_trace.py" not in stray["site"] and "record_demo_trace.py" in stray["free_site"]
    for g in walked:
        words = f"{fmt_bytes(g['bytes'])} in {g['count']} block{'s' if g['count'] != 1 else ''}, {g['reason']}, " \
                f"allocated at {g['site']}"
        assert words in flat, words
        assert g["free_site"] is None or g["free_site"] in flat


def _stretch_log() -> SynthLog:
    """Markers 'one', 'two', 'step 1', 'step 2' around known allocations (sizes in MiB, multiples of 512 B)."""
    log = SynthLog()
    here = {n: log.stack(("train.py", n, "main")) for n in (5, 10, 11, 12, 20, 30, 31)}
    log.segment(0x10000000, 256 * MiB)
    log.alloc(0x10000000, 1 * MiB, here[5])  # a: before the markers, freed after 'one'
    log.mark("one")
    log.alloc(0x10100000, 2 * MiB, here[10])  # b: kept by 'one', freed after 'two'
    log.free(0x10000000, here[11])
    log.alloc(0x10300000, 4 * MiB, here[12])  # c: made and freed on one line
    log.free(0x10300000, here[12])
    log.mark("two")
    log.free(0x10100000, here[20])
    log.alloc(0x10300000, 8 * MiB, here[30])  # d: live to the end
    log.mark("step 1")
    log.alloc(0x10b00000, 16 * MiB)  # e: no Python stack, freed by 'step 2''s stretch
    log.mark("step 2")
    log.free(0x10b00000, here[31])
    return log


@pytest.mark.parametrize("chunk_records", [3, 1 << 18])
def test_stretch_sums_are_the_logs(chunk_records: int) -> None:
    a = _stretch_log().analyze(chunk_records=chunk_records)
    rows = {r.label: r for r in a.section_rows("markers").rows}
    assert list(rows) == ["one", "two", "step 1", "step 2"]
    expected = {"one": (1, 6, 5, 2), "two": (2, 8, 2, 8), "step 1": (8, 16, 0, 16), "step 2": (24, 0, 16, 0)}
    for label, (live, allocated, freed, kept) in expected.items():
        r = rows[label]
        assert (r.live, r.allocated, r.freed, r.kept) == (live * MiB, allocated * MiB, freed * MiB, kept * MiB), label
        assert r.live == a.allocated_at(r.index)
    one = {(g.site, g.free_site): g for g in rows["one"].freed_groups}
    assert one[("train.py:5 main", "train.py:11 main")].bytes == 1 * MiB
    assert one[("train.py:12 main", "train.py:12 main")].reason == "temporary"
    assert [(g.site, g.bytes) for g in rows["one"].kept_groups] == [("train.py:10 main", 2 * MiB)]
    assert rows["two"].until == "step 1" and rows["step 2"].until is None
    s = a.summary()
    assert [(m.label, m.kind_count) for m in s.markers] == [("one", 1), ("two", 1), ("step 1", 2)]
    assert s.markers[2].kept_top is not None and s.markers[2].kept_top.site == "(no Python stack)"


def test_the_summarys_reasons_prefer_a_source_line() -> None:
    log = SynthLog()
    line = log.stack(("train.py", 7, "main"))
    log.segment(0x10000000, 64 * MiB)
    log.alloc(0x10000000, 32 * MiB)  # the largest, with no Python stack
    log.alloc(0x12000000, 1 * MiB, line)
    log.free(0x12000000, line)
    a = log.analyze()
    live = a.summary().live
    assert [(x.site, x.has_line) for x in live] == [("train.py:7 main", True), ("(no Python stack)", False)]


def test_only_the_first_markers_are_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchalloc.analysis.sections import markers

    monkeypatch.setattr(markers, "STRETCHES", 2)
    a = _stretch_log().analyze(chunk_records=3)
    s = a.section_rows("markers")
    assert [r.label for r in s.rows] == ["one", "two"] and s.markers == 4
    two = s.rows[1]  # its stretch still ends at the next marker, not at the log's end
    assert (two.until, two.allocated, two.freed, two.kept) == ("step 1", 8 * MiB, 2 * MiB, 8 * MiB)
    view = markers.SECTION.view(a, 15)
    assert view is not None and view.table is not None and view.table.more == "... 2 more markers"


def _replay(policy: str, reserved: int, synchronizes: int = 0, recording: bool = False) -> ReplayRow:
    return ReplayRow(policy, reserved, 100, recording, False, synchronizes)


def test_the_change_to_try_first_keeps_a_cache_and_never_synchronizes_when_one_saves_memory() -> None:
    """Issue 50: exact (no cache) and +compact (synchronizes) come first only when nothing else saves memory, and
    then the summary says what they cost; when they save more, they are named after the change, with the cost."""
    def change(*replays: ReplayRow) -> Change | None:
        return first_change(Reserve([], "caching", list(replays), []))

    base = _replay("caching", 200, recording=True)
    c = change(base, _replay("exact", 120), _replay("caching+compact", 130, synchronizes=9),
               _replay("caching+reclaim", 150))
    assert c is not None and (c.policy, c.setting, c.saves, c.cost) == ("caching+reclaim", "policy:caching,expandable:3",
                                                                        50, "")
    assert (c.least_policy, c.least_saves, c.least_cost) == ("exact", 80, "no cache: every request asks the device")
    assert c.words().startswith("TORCHALLOC_CONF=policy:caching,expandable:3 reserves ")
    c = change(base, _replay("exact", 120), _replay("caching+compact", 130, synchronizes=9))
    assert c is not None and c.policy == "caching+compact" and c.cost.startswith("it synchronizes the device")
    assert c.cost.endswith(": 9 times in the replay")
    assert "nothing that keeps a cache and never synchronizes saves memory here" in c.words()
    c = change(base, _replay("exact", 120))
    assert c is not None and c.policy == "exact" and c.least_policy is None and "no cache" in c.words()
    assert change(base, _replay("exact", 250)) is None


@pytest.mark.parametrize("name", [p.name for p in BUNDLED])
def test_the_change_ends_within_the_first_25_lines_at_100_columns(name: str, logs: dict,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    status, text, err = cli("report", str(logs[name]))
    assert status == 0, err
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("The change to try first: ")), None)
    assert start is not None, "\n".join(lines[:30])  # both bundled logs have a replay that reserves less
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("    "))
    assert end <= 25, "\n".join(lines[:end])
