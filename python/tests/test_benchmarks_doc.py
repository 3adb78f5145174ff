"""BENCHMARKS.md states measurements: where, when and by which command, not how the project got there.

Checked mechanically:

- every section that reports figures (a `##` or `###` heading with text under
  it) names a machine (H100, H200, ..., the 2-core VM, the simulated device)
  and a date (YYYY-MM-DD), in its own heading or text or in its `##` parent's
  heading; the one section that describes the method (METHOD_SECTION) is
  exempt, and holds no date, so that no measurement hides in it;
- no development-log wording (HISTORY_WORDS: issue numbers, "stop",
  "session", "now", ...): a reader wants the figures, not their history;
- every option that a command in a code span passes to a program of the
  repository (`bench/models.py --rounds 2`, `bench/vmm_costs.c --peers`,
  `torchalloc replay --no-search`, `tests/gpu_checks.sh steptime`) is one the
  program accepts: its `--help` for a Python script or the CLI, its source's
  string literals for a C program, its stage names for gpu_checks.sh.

That every repository path the file names exists is test_file_references.py's
job (it reads every Markdown file).
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "BENCHMARKS.md"

METHOD_SECTION = "How the model suite runs"
MACHINE = re.compile(r"\b(?:[ABHL]\d{2,3}|2-core VM|simulated device)\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# Wording of a development log; each pattern with the reason a reader does not need it.
HISTORY_WORDS = {
    r"\bissue\s*#?\d+": "an issue number: say what was measured, not which ticket asked",
    r"\bstop\b": "a work stop ('first/second/third stop') is history",
    r"\bsessions?\b": "a work session is history",
    r"\bused to\b": "what the code used to do is history; name the configuration or the date",
    r"\bnow\b": "'now' goes stale: give the date",
    r"\btoday\b": "'today' goes stale: give the date",
    r"\bwhat changed\b": "a change log, not a measurement",
    r"\bdevice time\b": "why a run was short is history; say how many rounds ran",
    r"\bpending\b|\bto be filled\b|\bnext step\b": "plans are not measurements",
    r"\bgoals?\b|\bmet\b|\bmissed\b": "an old issue's goals; state the figures",
    r"\bthis (?:work|change)\b|\bfinal code\b": "refers to a piece of work, not a configuration",
}

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
# A program of the repository as a command names it; what follows it in the span is its arguments.
PROGRAM = re.compile(r"(?<![\w/.-])(?:[\w.-]+/)*?(bench/\w+(?:\.py|\.c)?|bench_pairs|tests/gpu_checks\.sh"
                     r"|torchalloc\s+(?:report|replay|export))(?![\w/])")
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")


def sections(text: str) -> list[tuple[str, str, str]]:
    """(parent `##` heading, heading, text under it up to the next heading) of every `##`/`###` heading."""
    out: list[tuple[str, str, str]] = []
    parent = ""
    parts = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2]):
        if heading.startswith("## "):
            parent = heading
        out.append((parent, heading, body))
    return out


def _title(heading: str) -> str:
    return heading.lstrip("#").strip()


def undated_sections(text: str) -> list[str]:
    """Headings of the sections with text that name no machine or no date."""
    bad = []
    for parent, heading, body in sections(text):
        if _title(parent) == METHOD_SECTION or not body.strip():
            continue
        where = "\n".join((parent, heading, body))
        missing = [what for what, pattern in (("machine", MACHINE), ("date", DATE)) if not pattern.search(where)]
        if missing:
            bad.append(f"{heading!r} names no {' and no '.join(missing)}")
    return bad


def history_wording(text: str) -> list[str]:
    """'line N: "words" (why)' for each development-log phrase."""
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        for pattern, why in HISTORY_WORDS.items():
            for match in re.finditer(pattern, line, re.I):
                found.append(f"line {number}: {match.group(0)!r} ({why})")
    return found


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(program, arguments) of each command in a code span or fenced block."""
    spans = [line for block in FENCE.findall(text) for line in block.replace("\\\n", " ").split("\n")]
    spans += INLINE.findall(FENCE.sub("", text))
    out = []
    for span in spans:
        span = span.split(" #", 1)[0]  # a shell comment after the command
        found = list(PROGRAM.finditer(span))
        for k, match in enumerate(found):
            end = found[k + 1].start() if k + 1 < len(found) else len(span)
            out.append((" ".join(match.group(1).split()), span[match.end():end].split()))
    return out


def _source(program: str) -> Path:
    """The file a program of bench/ is built or run from (bench/make_big_log: bench/make_big_log.c)."""
    name = "bench/bench_pairs" if program == "bench_pairs" else program
    path = REPO / name
    if path.suffix:
        return path
    return next((p for p in (path.with_suffix(".c"), path.with_suffix(".py")) if p.exists()), path)


def _help_text(argv: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    done = subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)} --help failed:\n{done.stderr[-2000:]}"
    return done.stdout


@functools.lru_cache(maxsize=None)
def accepted(program: str) -> frozenset[str]:
    """The options (or, for gpu_checks.sh, the stages) a program accepts."""
    if program.startswith("torchalloc"):
        return frozenset(OPTION.findall(_help_text(["-m", "torchalloc.cli", program.split()[1]])))
    if program == "tests/gpu_checks.sh":
        script = (REPO / program).read_text()
        return frozenset(re.findall(r"\bwants (\w+)", script)) | {"all"}
    source = _source(program)
    assert source.exists(), f"{program}: no {source.relative_to(REPO)} in the repository"
    if source.suffix == ".py":
        return frozenset(OPTION.findall(_help_text([str(source.relative_to(REPO))])))
    return frozenset(re.findall(r'"(--[\w-]+)"', source.read_text()))


def unknown_options(text: str) -> list[str]:
    bad = []
    for program, args in commands(text):
        if program == "tests/gpu_checks.sh":
            wrong = [a for a in args if re.fullmatch(r"\w+", a) and a not in accepted(program)]
        else:
            wrong = [o for a in args for o in OPTION.findall(a.split("=", 1)[0]) if o not in accepted(program)]
        bad += [f"{program} {w}" for w in wrong]
    return bad


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_every_section_names_its_machine_and_date(doc: str) -> None:
    assert sections(doc), "BENCHMARKS.md has no sections"
    bad = undated_sections(doc)
    assert not bad, "sections of BENCHMARKS.md without a machine or date:\n" + "\n".join(bad)


def test_the_method_section_reports_no_measurement(doc: str) -> None:
    method = [body for parent, _heading, body in sections(doc) if _title(parent) == METHOD_SECTION]
    assert method, f"BENCHMARKS.md has no '## {METHOD_SECTION}' section"
    dated = [m.group(0) for body in method for m in DATE.finditer(body)]
    assert not dated, f"'{METHOD_SECTION}' is exempt from naming a machine and date, yet carries {dated}"


def test_no_development_log_wording(doc: str) -> None:
    found = history_wording(doc)
    assert not found, "BENCHMARKS.md reads as a development log:\n" + "\n".join(found)


def test_every_command_option_is_accepted(doc: str) -> None:
    named = commands(doc)
    assert any(p == "bench/models.py" and args for p, args in named), "no bench/models.py command found"
    bad = unknown_options(doc)
    assert not bad, "BENCHMARKS.md passes options its programs do not accept:\n" + "\n".join(bad)


# The checks themselves, on hand-made text: each must catch what it is for.

def test_checks_catch_what_they_are_for() -> None:
    text = ("# T\n\n## Figures (H100, 2026-11-25)\n\nA table.\n\n### Sub\n\nMore.\n\n"
            "## Undated (H100)\n\nx\n\n## Nowhere, 2026-11-27\n\ny\n\n## Empty\n\n"
            f"## {METHOD_SECTION}\n\nNo figures.\n")
    assert undated_sections(text) == ["'## Undated (H100)' names no date",
                                      "'## Nowhere, 2026-11-27' names no machine"]
    assert history_wording("The third stop now beats issue 24.\nfine line") == [
        f"line 1: {w!r} ({HISTORY_WORDS[p]})" for w, p in
        (("issue 24", r"\bissue\s*#?\d+"), ("stop", r"\bstop\b"), ("now", r"\bnow\b"))]
    assert commands("run `python3 bench/vmm_async.py --rounds 3 --bogus` and\n```\n"
                    "python3 bench/fit.py --workloads llama \\\n    --precision 0.02   # note --not-an-option\n```\n"
                    "`build/bench/bench_pairs --one caching` `bash tests/gpu_checks.sh parity nosuch`") == [
        ("bench/fit.py", ["--workloads", "llama", "--precision", "0.02"]),  # fenced blocks first
        ("bench/vmm_async.py", ["--rounds", "3", "--bogus"]),
        ("bench/bench_pairs", ["--one", "caching"]),
        ("tests/gpu_checks.sh", ["parity", "nosuch"])]
    assert unknown_options("`python3 bench/vmm_async.py --rounds 3 --bogus` `bench_pairs --one x` "
                           "`bench/vmm_costs.c --peers --nope` `bash tests/gpu_checks.sh parity nosuch`") == [
        "bench/vmm_async.py --bogus", "bench/vmm_costs.c --nope", "tests/gpu_checks.sh nosuch"]
