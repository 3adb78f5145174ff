"""docs/ARCHITECTURE.md is true to the tree: every file it names exists, and every room of the tree is in it.

Named files: the rules of test_file_references.py (a path from the root, from
docs/, or as the tail of a repository path; a bare name that some repository
file has), and besides them every `name.*` (`errors.*`: the header and its
source) must match at least one file.

Rooms that must be mentioned, each in a code span (`...`):

- every folder of allocator/, spelled from the root (`allocator/heap/`);
- every folder and file directly in policies/ (`policies/parts/`,
  `caching.c`), every public header in include/ and every file of bridge/,
  by name;
- every top-level module and folder of python/torchalloc (`_lib`,
  `printable`, `log/`, `data/`), in the section on Python: a module by its
  name with or without `.py`, a folder by its name with a slash.

A new folder, policy, public header or top-level module fails here until the
page says where it sits; a file the page names and the tree lost fails too.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import test_file_references as refs

REPO = refs.REPO
DOC = "docs/ARCHITECTURE.md"
PYTHON_SECTION = "## Python"  # the heading the Python modules are placed under

CODE_SPAN = re.compile(r"`([^`\n]+)`")
SPAN_SPLIT = re.compile(r"[\s,;:()]+")
STAR_NAME = re.compile(r"^[\w./-]*\w\.\*$")  # errors.*, log/log.*


def missing_files(repo: refs.Repo, text: str, referrer: str = DOC) -> list[str]:
    """"line: name" of every file or folder `text` names that the repository does not have."""
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        for word in refs._references(line):
            if not refs._allowed(word) and refs._stale_path(repo, word, referrer):
                out.append(f"{number}: {word}")
        for span in CODE_SPAN.findall(line):
            for word in SPAN_SPLIT.split(span):
                if STAR_NAME.match(word) and not _matches_star(repo, word[:-1]):
                    out.append(f"{number}: {word}")
    return out


def _matches_star(repo: refs.Repo, prefix: str) -> bool:
    """Some repository file is `prefix` + an extension, from the root or as a path's tail (`log/log.` ...)."""
    pattern = re.compile(r"(?:^|/)" + re.escape(prefix) + r"[^/]+$")
    return any(pattern.search(f) for f in repo.files)


def spans(text: str) -> set[str]:
    """Every word of every code span of `text`, as written."""
    return {word for span in CODE_SPAN.findall(text) for word in SPAN_SPLIT.split(span) if word}


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same level."""
    start = text.find("\n" + heading)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(heading) + 1)
    return text[start:] if end < 0 else text[start:end]


def unmentioned(repo: refs.Repo, text: str) -> list[str]:
    """The rooms of the tree (module docstring) that `text` does not mention."""
    words = spans(text)
    names = {w.rstrip("/").rsplit("/", 1)[-1] for w in words}
    out = []
    for d in sorted(repo.dirs):
        if d.count("/") == 1 and d.startswith("allocator/") and f"{d}/" not in words:
            out.append(f"{d}/")
    for f in sorted(repo.paths):
        top, _, rest = f.partition("/")
        if top in ("policies", "include", "bridge") and rest and "/" not in rest and rest not in names:
            out.append(f)
    python_words = spans(section(text, PYTHON_SECTION))
    package = "python/torchalloc/"
    for p in sorted(repo.paths):
        if not p.startswith(package) or "/" in p[len(package):]:
            continue
        name = p[len(package):]
        if p in repo.dirs:
            if f"{name}/" not in python_words:
                out.append(p + "/")
        elif name.endswith(".py") and name[:-3] not in python_words and name not in python_words:
            out.append(p)
    return out


@pytest.fixture(scope="module")
def repo() -> refs.Repo:
    try:
        return refs.Repo()
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout: {error}")


@pytest.fixture(scope="module")
def doc() -> str:
    return (REPO / DOC).read_text(encoding="utf-8")


def test_every_file_the_page_names_exists(repo: refs.Repo, doc: str) -> None:
    missing = missing_files(repo, doc)
    assert not missing, f"{DOC} names files the repository does not have:\n" + "\n".join(missing)


def test_every_room_of_the_tree_is_on_the_page(repo: refs.Repo, doc: str) -> None:
    absent = unmentioned(repo, doc)
    assert not absent, f"{DOC} does not say where these sit:\n" + "\n".join(absent)


def test_the_checks_see_what_they_look_for(repo: refs.Repo, doc: str) -> None:
    """The two checks above on pages known to be wrong: a lost file, a lost `name.*`, a room left out."""
    assert missing_files(repo, "`allocator/heap/heap_gone.c`, `passes/gone.py`, `errors.*`, `gone.*`") == [
        "1: allocator/heap/heap_gone.c", "1: passes/gone.py", "1: gone.*"]
    assert missing_files(repo, "`log/log.*` and `heap_pools.h`") == []
    trimmed = doc.replace("`allocator/heap/`", "heap").replace("`caching.c`", "caching").replace(
        "`printable`", "printable").replace("`cli/`", "cli")
    assert {"allocator/heap/", "policies/caching.c", "python/torchalloc/printable.py",
            "python/torchalloc/cli/"} <= set(unmentioned(repo, trimmed))
    assert "python/torchalloc/printable.py" in unmentioned(repo, doc.replace(PYTHON_SECTION, "## Elsewhere"))
