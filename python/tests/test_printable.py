"""No control character from a log or a file name reaches the terminal (issue 23, finding 6).

A log's strings -- phase names, marker texts, file and function names --
and the paths and arguments echoed in messages are shown with their
control characters escaped (torchalloc.printable) in every text output:
the report, the job report, replay, export's messages and the CLI's errors.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from torchalloc.printable import printable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_logs as H  # noqa: E402
from cli_in_process import cli  # noqa: E402

ESC = "\x1b"
# What a terminal acts on: C0 (newline is the output's own), DEL, C1, and the bidi and line-separator marks.
CONTROL = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F),
                            *range(0x2066, 0x206A)]} - {"\n"}


def raw_controls(text: str) -> set[str]:
    return {c for c in text if c in CONTROL}




def test_printable_escapes_every_control_character() -> None:
    assert printable("fwd\x1b[2J") == "fwd\\x1b[2J"
    assert printable("a\r\x07\x08\x00\x7f\x9b\u202e\u2028b") == "a\\x0d\\x07\\x08\\x00\\x7f\\x9b\\u202e\\u2028b"
    assert printable("line\nnext\ttab") == "line\\x0anext\\x09tab"
    assert printable("line\nnext", newlines=True) == "line\nnext"
    plain = "forward / backward: données, 日本語, emoji 🙂, back\\slash"
    assert printable(plain) == plain
    assert not raw_controls(printable("".join(map(chr, range(0x2100)))))


@pytest.fixture
def evil_log(tmp_path: Path) -> Path:
    # The file's own name carries an ESC sequence too: messages echo it.
    path = tmp_path / f"run{ESC}[31m.talog"
    path.write_bytes(H.control_characters())
    return path


def test_report_text_and_notes_escape_log_strings(evil_log: Path, library_path: Path) -> None:
    status, out, err = cli("report", str(evil_log), "--at", "1e-6")
    assert status == 0, err
    assert not raw_controls(out) and not raw_controls(err)
    assert "\\x1b]0;pwned\\x07" in out  # the phase name, shown escaped
    assert "\\x1b[31m" in out  # the file name, in the header line
    assert "mark\\x1b" in out  # the marker
    status, out, err = cli("report", str(evil_log), "--json")
    assert status == 0 and not raw_controls(out) and not raw_controls(err)
    doc = json.loads(out)
    assert any("\\x1b" in p["phase"] for p in doc["phases"])


def test_job_report_escapes_log_strings(evil_log: Path, tmp_path: Path, library_path: Path) -> None:
    other = tmp_path / "other.talog"
    other.write_bytes(H.control_characters())
    status, out, err = cli("report", str(evil_log), str(other))
    assert status == 0, err
    assert not raw_controls(out) and not raw_controls(err)
    assert "\\x1b]0;pwned" in out


def test_replay_and_export_messages_escape(evil_log: Path, tmp_path: Path, library_path: Path) -> None:
    status, out, err = cli("replay", str(evil_log), "--no-search")
    assert status == 0, err
    assert not raw_controls(out) and not raw_controls(err) and "\\x1b[31m" in out
    status, out, err = cli("export", str(evil_log), "-o", str(tmp_path / f"s{ESC}[2J.pickle"))
    assert status == 0 and not raw_controls(out) and not raw_controls(err) and "\\x1b[2J" in err


def test_cli_errors_escape_what_they_echo(evil_log: Path, tmp_path: Path) -> None:
    for args in (
        ("report", str(evil_log), "--at", f"no such{ESC}]52;c;aGk=\x07"),  # a marker that is not there
        ("report", str(tmp_path / f"missing{ESC}[2J.talog")),  # no such file
        ("export", str(evil_log), "-o", str(tmp_path / f"nodir{ESC}[2J" / "s.pickle")),
        ("replay", str(tmp_path / f"missing\r{ESC}[2J.talog")),
        (f"repo{ESC}[2Jrt",),  # an unknown command
    ):
        status, out, err = cli(*args)
        assert status != 0, args
        assert err and not raw_controls(out) and not raw_controls(err), (args, err)
