"""Inputs that made the tools slow, wrong or unsafe to print (issue 36, findings on the report and `info`).

- `report --json` on a log read whole took an anatomy per marker label, each
  finding its moment by scanning every marker: quadratic in the steps of a
  run with one 'step N' marker per step. It now lists the first
  MARKER_ANATOMIES labels, each found once.
- the OOM sentence said 'as much as' for any free <= requested.
- the text report printed every marker on one line, and `torchalloc info`
  echoed ESC bytes from a bad TORCHALLOC_CONF.

No assertion here is on seconds: the work is counted (calls), the output measured.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hostile_logs as H
from synthlog import MiB, SynthLog
from torchalloc import analysis as A
from torchalloc.analysis import anatomy as anatomy_module
from torchalloc.analysis import front
from torchalloc.analysis.passes.moments import MARKER_ANATOMIES
from torchalloc.analysis.sections.ooms.diagnosis import OomRow, oom_explanation
from torchalloc.report.text import LABEL_CHARS, render_text
from cli_in_process import cli as _cli  # noqa: E402

PYTHON_DIR = Path(__file__).resolve().parents[1]
CAP = MARKER_ANATOMIES


class _Synth(SynthLog):
    """SynthLog with its strings looked up in a dict: its own search is linear, so thousands of labels took
    seconds to build."""

    def __init__(self) -> None:
        super().__init__()
        self._ids: dict[str, int] = {}

    def _string(self, text: str) -> int:
        if text not in self._ids:
            self._ids[text] = self._next_id
            self.strings[self._next_id] = text
            self._next_id += 1
        return self._ids[text]


def _steps(n: int, label: str = "step {k}") -> _Synth:
    """A run of `n` steps, each a marker (as the Lightning and Hugging Face callbacks write) and a 4 MiB
    temporary, beside an 8 MiB weight live throughout."""
    s = _Synth()
    s.segment(0x7000_0000, 64 * MiB)
    s.alloc(0x7000_0000, 8 * MiB)
    for k in range(n):
        s.mark(label.format(k=k))
        s.alloc(0x7100_0000, 4 * MiB)
        s.free(0x7100_0000)
    return s


def _steps_file(path: Path, n: int) -> Path:
    b = H.LogBuilder()
    b.segment(0x7000_0000, 64 * MiB)
    b.alloc(0x7000_0000, 8 * MiB)
    for k in range(n):
        b.mark(f"step {k}")
        b.alloc(0x7100_0000, 4 * MiB)
        b.free(0x7100_0000, 4 * MiB)
    path.write_bytes(b.to_bytes())
    return path




# ---------------------------------------------------------------------------
# (1) report --json: capped, and each marker found once
# ---------------------------------------------------------------------------


def test_json_report_lists_at_most_the_cap_of_marker_anatomies() -> None:
    a = _steps(CAP + 200).analyze()
    d = a.to_dict()
    assert len(d["markers"]) == CAP
    assert [m["at"] for m in d["markers"]] == [f"marker 'step {k}'" for k in range(CAP)]  # the first ones, in order
    assert any(f"first {CAP} of {CAP + 200} marker labels" in note for note in d["notes"])
    assert len(d["timeline"]["markers"]) == CAP + 200  # the timeline still has them all
    assert a.anatomy(f"step {CAP + 150}").at == f"marker 'step {CAP + 150}'"  # and any is still asked for by name


def test_json_report_work_grows_linearly_with_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anatomies built during to_dict: one per listed label and a few for the sections, each from the blocks the
    analysis' one second pass kept for it (no pass per label); as many for twice the markers. Before: every
    label's lookup read every marker's text (n squared) and every label got an anatomy."""
    counts = {"anatomies": 0, "passes": 0}
    anatomy, more = front.Analysis._anatomy, front.Analysis._more

    def counted_anatomy(self: front.Analysis, *args: Any) -> Any:
        counts["anatomies"] += 1
        return anatomy(self, *args)

    def counted_more(self: front.Analysis, *args: Any) -> Any:
        counts["passes"] += 1
        return more(self, *args)

    monkeypatch.setattr(front.Analysis, "_anatomy", counted_anatomy)
    monkeypatch.setattr(front.Analysis, "_more", counted_more)
    seen = {}
    for n in (CAP + 200, 2 * (CAP + 200)):
        a = _steps(n).analyze()
        counts.update(anatomies=0, passes=0)
        d = a.to_dict()
        assert len(d["markers"]) == CAP
        assert counts["anatomies"] <= CAP + 1 + 10  # the peak, the listed labels, and a few for the sections
        assert counts["passes"] == 0, "a listed label needed a pass of its own"
        seen[n] = dict(counts)
    small, large = seen.values()
    assert large["anatomies"] == small["anatomies"]  # capped: no more anatomies for more markers


def test_one_piece_and_pieces_list_the_same_marker_anatomies(tmp_path: Path) -> None:
    path = _steps_file(tmp_path / "steps.talog", CAP + 50)
    whole = A.analyze(path)
    pieces = A.analyze(path, chunk_records=4096)
    w, s = whole.to_dict(), pieces.to_dict()
    assert [m["at"] for m in w["markers"]] == [m["at"] for m in s["markers"]]
    assert len(w["markers"]) == CAP


def test_report_json_command_caps_markers(tmp_path: Path) -> None:
    path = _steps_file(tmp_path / "steps.talog", CAP + 20)
    status, out, _ = _cli("report", "--json", str(path))
    assert status == 0
    assert len(json.loads(out)["markers"]) == CAP


def test_an_unknown_marker_names_a_few_labels_not_all() -> None:
    a = _steps(500).analyze()
    with pytest.raises(ValueError) as e:
        a.index_at("no such step")
    message = str(e.value)
    assert "and 480 more" in message and message.count("step ") == anatomy_module.LABELS_NAMED


# ---------------------------------------------------------------------------
# (2) the OOM sentence says what its numbers say
# ---------------------------------------------------------------------------


def _fragmentation(free: int, reserved: int, requested: int) -> OomRow:
    return OomRow(t_s=1.0, index=5, requested=requested, stream=0, phase="forward", site="train.py:10",
                  reserved=reserved, allocated=reserved - free, free_in_reserved=free, largest_free_range=2 * MiB,
                  segments=3, device_total=80 << 30, device_free=1 << 30, limit=0, held_elsewhere=0,
                  largest_free_on_stream=2 * MiB, usable=80 << 30, verdict="fragmentation",
                  verdict_from="the allocator, at the failure", blockers=[], alternatives=[], unknown=[],
                  explanation="")


def test_fragmentation_with_less_free_than_asked_says_less() -> None:
    """The review's numbers: 14 MiB free of 20 MiB reserved, 40 MiB asked for."""
    text = oom_explanation(_fragmentation(14 * MiB, 20 * MiB, 40 * MiB))
    assert "14.0 MiB of the 20.0 MiB torchalloc reserved was free -- less than the 40.0 MiB asked for" in text
    assert "as much as" not in text and "more than" not in text
    assert "split between live blocks" not in text  # it would not have served the request if it were whole


@pytest.mark.parametrize(("free", "word"), [(40 * MiB, "as much as"), (50 * MiB, "more than")])
def test_fragmentation_with_enough_free_says_so(free: int, word: str) -> None:
    text = oom_explanation(_fragmentation(free, 60 * MiB, 40 * MiB))
    assert f"-- {word} the 40.0 MiB asked for -- but split between live blocks" in text


# ---------------------------------------------------------------------------
# (3) the text report's markers, and `info`'s echo of the environment
# ---------------------------------------------------------------------------


def _marker_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("markers"))
    end = lines.index("", start)
    return lines[start:end]


def test_text_report_markers_are_bounded_and_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    a = _steps(5000).analyze()
    lines = _marker_lines(render_text(a, top=10))
    said = " ".join(lines)
    assert lines[0].startswith("markers (5000): 'step 0' at")
    assert all(len(line) <= 100 for line in lines) and len(lines) <= 4
    assert said.count("'step ") == 10 and "... 4990 more ..." in said
    assert "'step 4" + "999' at" in said  # the last one shown too
    assert len(_marker_lines(render_text(a, top=3))) == 1  # --top says how many
    assert all(len(line) <= 40 for line in _marker_lines(render_text(a, top=10, width=40)))  # or the caller


def test_text_report_markers_follow_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    lines = _marker_lines(render_text(_steps(200).analyze(), top=15))
    assert all(len(line) <= 60 for line in lines) and len(lines) > 1


def test_text_report_cuts_a_long_label(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    a = _steps(3, label="x" * 10_000 + "{k}").analyze()
    lines = _marker_lines(render_text(a))
    assert all(len(line) <= 100 for line in lines)
    assert "'" + "x" * (LABEL_CHARS - 3) + "...' at" in " ".join(lines)


def test_report_command_markers_respect_top(tmp_path: Path) -> None:
    path = _steps_file(tmp_path / "steps.talog", 3000)
    status, out, _ = _cli("report", "--top", "6", str(path))
    assert status == 0
    lines = _marker_lines(out)
    assert " ".join(lines).count("'step ") == 6 and max(map(len, lines)) <= 100


def test_info_escapes_what_it_echoes(capsys: pytest.CaptureFixture[str]) -> None:
    """In process, no library needed: the lines of a machine without a GPU, and of a library not found."""
    from torchalloc.cli import info

    base = {"package_version": "0", "stats_abi_version": 3, "library": "/lib/libtorchalloc.so", "event_log": True,
            "config_keys": ["policy"], "route": "plain", "route_reason": "no torch"}
    info._print_info({**base, "devices": None, "device_error": "no GPU \x1b]0;owned\x07 here"})
    info._print_info({**base, "library": None, "library_error": "cannot load /x\x1b[2J:\n  /tried/one"})
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "devices:     unavailable: no GPU \\x1b]0;owned\\x07 here" in out
    assert "cannot load /x\\x1b[2J:\n  /tried/one\n" in out  # the message's own line break kept


def test_info_escapes_a_bad_conf(library_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHALLOC_CONF"}
    env.update(TORCHALLOC_CONF="policy:\x1b[31mred\nforged: line", PYTHONPATH=str(PYTHON_DIR))
    done = subprocess.run([sys.executable, "-m", "torchalloc.cli", "info"], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 1
    assert "\x1b" not in done.stdout + done.stderr
    assert "bad value '\\x1b[31mred\\x0aforged: line' for key 'policy'" in done.stderr
    assert not any(line.startswith("forged") for line in done.stderr.splitlines())


def test_an_event_timed_before_the_first_is_sampled_in_the_first_bucket() -> None:
    """A damaged log whose clock went back: the timeline's sampler put such an event in a negative bucket and the
    report failed (IndexError; fuzz_log_decode found it once every log was read in pieces)."""
    import numpy as np

    from torchalloc.analysis.passes.first_state import Sampler

    s = Sampler(first_ns=10**10, last_ns=10**10 + 40_000, base_ns=10**10, max_points=10)
    times = 10**10 + 1000 * np.arange(40, dtype=np.int64)
    times[20] = 10**10 - 2 * 10**9  # two seconds before the first event
    cum = np.arange(40, dtype=np.int64) * MiB
    s.piece(0, times, cum, cum)
    index, levels, _, _ = s.finish([(39, int(cum[-1]), int(cum[-1]), int(times[-1]))])
    assert 20 in index.tolist()  # the highest of the first bucket
    assert levels.max() == 39 * MiB and index[-1] == 39
