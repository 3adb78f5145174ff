"""The docs' quotes of the tools, made by the tools: every block the README and docs/ quote is produced here.

A quote in a Markdown file is a fenced block right after a marker line:

    <!-- quote: NAME -->
    ```text
    ...the lines QUOTES[NAME] makes...
    ```

(indented as the list item it sits in). QUOTES maps each NAME to what makes
its lines: `torchalloc` run in this process on the bundled data, at 100
columns, and the lines picked from its output (for the HTML page, a sentence
that measures the file it wrote). test_doc_quotes.py fails when a block
differs from what its maker prints today, when a marker names no maker, or
when a maker is quoted nowhere.

    python3 python/tests/doc_quotes.py           # say which quotes are stale
    python3 python/tests/doc_quotes.py --write   # rewrite every quoted block from the tools' output

Figures measured on a GPU cannot be made here: the docs give those with the
GPU, the machine and the date instead.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA = REPO / "python" / "torchalloc" / "data"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WIDTH = "100"  # the report's width for every quote: a terminal of 100 columns
MARKER = re.compile(r"^(?P<indent>\s*)<!-- quote: (?P<name>[\w.-]+) -->\s*$")
# cli_in_process beside this file, and the package it runs (when PYTHONPATH does not name it already).
sys.path[:0] = [str(HERE), str(REPO / "python")]


@functools.lru_cache(maxsize=None)
def tool_output(*args: str) -> tuple[str, ...]:
    """The lines `torchalloc ARGS` prints at 100 columns (trailing blanks dropped); each command runs once per
    process, however many quotes take lines from it (the demo's report takes seconds)."""
    from cli_in_process import cli

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        status, out, err = cli(*args)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    if status != 0:
        raise RuntimeError(f"torchalloc {' '.join(args)}: exit {status}: {err.strip()}")
    return tuple(line.rstrip() for line in out.splitlines())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _dedent(lines: Sequence[str]) -> list[str]:
    """`lines` without the indentation they all share (a quote starts at its block's left edge)."""
    common = min((_indent(line) for line in lines if line.strip()), default=0)
    return [line[common:] for line in lines]


def _wrapped(lines: Sequence[str], first: int) -> list[str]:
    """Line `first` and the lines wrapped under it (those indented deeper)."""
    end = first + 1
    while end < len(lines) and lines[end].strip() and _indent(lines[end]) > _indent(lines[first]):
        end += 1
    return list(lines[first:end])


def paragraph(lines: Sequence[str], start: str) -> list[str]:
    """The first line matching the regex `start` (its indentation aside) and the lines wrapped under it, dedented."""
    first = next((i for i, line in enumerate(lines) if re.match(start, line.lstrip())), None)
    if first is None:
        raise LookupError(f"no line matches {start!r}")
    return _dedent(_wrapped(lines, first))


def section(lines: Sequence[str], title: str) -> list[str]:
    """The report section whose heading is `== TITLE`, without its heading and trailing blank lines."""
    start = next((i for i, line in enumerate(lines) if line.startswith(f"== {title}")), None)
    if start is None:
        raise LookupError(f"no section {title!r}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("== ")), len(lines))
    body = list(lines[start + 1:end])
    while body and not body[-1].strip():
        body.pop()
    return body


def table(lines: Sequence[str], start: str) -> list[str]:
    """From the first line matching the regex `start` to the next blank line: a table as printed."""
    first = next((i for i, line in enumerate(lines) if re.match(start, line)), None)
    if first is None:
        raise LookupError(f"no line matches {start!r}")
    end = next((i for i in range(first, len(lines)) if not lines[i].strip()), len(lines))
    return list(lines[first:end])


def replay_tables(lines: Sequence[str]) -> list[str]:
    """Replay's table (at 100 columns, two tables, each led by the policy): from the blank line after the trace's
    lines to the blank line before "replay speed"."""
    start = lines.index("") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("replay speed"))
    return list(lines[start:end - 1])


def marker_rows(lines: Sequence[str], labels: Sequence[str]) -> list[str]:
    """The "Between markers" table's header and the rows of the markers `labels` (each with the groups freed and
    kept under it), in the table's order."""
    body = section(lines, "Between markers")
    starts = tuple(f"'{label}' " for label in labels)
    rows = [i for i, line in enumerate(body) if line.lstrip().startswith(starts)]
    if len(rows) != len(labels):
        raise LookupError(f"not every marker of {list(labels)} has one row in 'Between markers'")
    return _dedent(body[:2] + [line for i in rows for line in _wrapped(body, i)])  # body[:2]: column names, rules


def page_size(log: str) -> list[str]:
    """What `torchalloc report LOG --html` writes for `log`: the page's size, its embedded data's and its static
    SVG's (KB: 1000 bytes), and how many blocks a click can list, as one sentence wrapped at 100 columns."""
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        tool_output("report", log, "--html", str(page))
        html = page.read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    svg = re.search(r"<svg.*?</svg>", html, re.S)
    head = re.search(r"(\d+) events, (\d+) blocks", html)
    if data is None or svg is None or head is None:
        raise LookupError(f"the page of {log} has no data element, SVG or heading")
    budget = json.loads(data[1])["budget"]

    def kb(text: str) -> str:
        return f"{round(len(text.encode()) / 1000)} KB"

    sentence = (f"For the bundled {Path(log).relative_to(REPO)} ({int(head[1]):,} events, {int(head[2]):,} blocks) "
                f"the page is {kb(html)}: {kb(data[1])} of data, {kb(svg[0])} of static SVG. It holds "
                f"{budget['held']} blocks: {budget['per_moment']} at the peak, at least {budget['exact']} at "
                "every other moment.")
    return textwrap.wrap(sentence, int(WIDTH))


def after(lines: Sequence[str], start: str) -> list[str]:
    """From the first line matching the regex `start` to the end of the output."""
    first = next((i for i, line in enumerate(lines) if re.match(start, line)), None)
    if first is None:
        raise LookupError(f"no line matches {start!r}")
    return list(lines[first:])


DEMO = ("report",)
PHASES = str(DATA / "phases_trace.talog.xz")
WALKED = ("rebinding", "function temporary", "checkpoint", "stray reference cleared")
PLAN = ("plan", "--capacity", "4GiB", "--batch", "24", "--recorded", "8")  # the demo's batch: 8 sequences

# What each quote is: the maker of its lines.
QUOTES: dict[str, Callable[[], list[str]]] = {
    "demo-summary": lambda: section(tool_output(*DEMO), "Summary"),
    "demo-markers": lambda: marker_rows(tool_output(*DEMO), WALKED),
    "demo-optimizer": lambda: paragraph(tool_output(*DEMO), r"optimizer: reserved "),
    "demo-reserve": lambda: paragraph(tool_output(*DEMO), r"At the peak allocated \("),
    "demo-policies": lambda: paragraph(tool_output(*DEMO), r"The one change that would have saved"),
    "phases-reserve": lambda: paragraph(tool_output("report", PHASES), r"At the peak allocated \("),
    "phases-policies": lambda: paragraph(tool_output("report", PHASES), r"The one change that would have saved"),
    "phases-phase-arena": lambda: paragraph(tool_output("report", PHASES), r"phase_arena loses here"),
    "phases-page": lambda: page_size(PHASES),
    "replay-default": lambda: replay_tables(tool_output("replay")),
    "replay-handle": lambda: table(replay_tables(tool_output("replay", "--policies", "caching+reclaim", "--handle",
                                                              "4MiB,8MiB,16MiB")), r"\s*peak"),
    "replay-run": lambda: table(replay_tables(tool_output("replay", "--policies", "caching+reclaim", "--run",
                                                           "0,64MiB")), r"\s*peak"),
    "top-demo": lambda: list(tool_output("top", "--once")),  # no log: the bundled demo
    # no log: the bundled demo (the first line names its path, which differs between checkouts: left out)
    "plan-demo": lambda: table(tool_output(*PLAN), r"\s*policy ") + [""] + paragraph(tool_output(*PLAN),
                                                                                   r"The setting that fits"),
    "plan-demo-limits": lambda: after(tool_output(*PLAN), r"Limits:"),
}


@dataclass
class Quote:
    """One quoted block of a document: its maker's name, its lines (indentation dropped) and where they sit."""

    path: Path
    name: str
    indent: str
    first: int  # index of the block's first content line in the file's lines
    lines: list[str]


def quotes_in(path: Path) -> list[Quote]:
    """Every marked block of `path`; a marker without a fenced block right after it is an error."""
    text = path.read_text().splitlines()
    found = []
    for i, line in enumerate(text):
        m = MARKER.match(line)
        if not m:
            continue
        indent = m["indent"]
        fence = text[i + 1] if i + 1 < len(text) else ""
        if not fence.startswith(indent + "```"):
            raise ValueError(f"{path.name}:{i + 1}: quote {m['name']!r} is not followed by a fenced block")
        end = next((j for j in range(i + 2, len(text)) if text[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{path.name}:{i + 1}: quote {m['name']!r}: its block never closes")
        lines = [row[len(indent):] if row.startswith(indent) else row.lstrip() for row in text[i + 2:end]]
        found.append(Quote(path, m["name"], indent, i + 2, lines))
    return found


def made(name: str) -> list[str]:
    """The lines the quote `name` must hold today."""
    if name not in QUOTES:
        raise KeyError(f"no maker for the quote {name!r} (python/tests/doc_quotes.py QUOTES)")
    return list(_made(name))


@functools.lru_cache(maxsize=None)
def _made(name: str) -> tuple[str, ...]:
    return tuple(QUOTES[name]())


def where(q: Quote) -> str:
    """The quote's file and the line number of its first quoted line, as an editor takes them."""
    path = q.path.relative_to(REPO) if q.path.is_relative_to(REPO) else q.path
    return f"{path}:{q.first + 1}"


def stale(paths: Sequence[Path]) -> list[Quote]:
    """The quoted blocks of `paths` that differ from what their makers print today."""
    return [q for path in paths for q in quotes_in(path) if q.lines != made(q.name)]


def rewrite(path: Path) -> bool:
    """Every quoted block of `path` replaced by what its maker prints; True when the file changed."""
    old = path.read_text()
    text = old.splitlines()
    for q in reversed(quotes_in(path)):  # from the end: earlier blocks keep their line numbers
        text[q.first:q.first + len(q.lines)] = [(q.indent + line) if line else "" for line in made(q.name)]
    new = "\n".join(text) + "\n"
    if new == old:
        return False
    path.write_text(new)
    return True


def main(argv: Sequence[str] | None = None, paths: Sequence[Path] = DOCS) -> int:
    """Say which quotes of `paths` are stale (status 1 when any is), or with --write rewrite them all."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite every quoted block from the tools' output")
    args = parser.parse_args(argv)
    if args.write:
        for path in paths:
            if rewrite(path):
                print(f"rewrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        return 0
    found = stale(paths)
    for q in found:
        print(f"{where(q)}: quote {q.name} is stale (python3 python/tests/doc_quotes.py --write rewrites it)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
