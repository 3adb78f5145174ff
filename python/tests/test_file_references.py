"""Every repository file that the docs or a source comment names exists.

Read: every Markdown file (README.md, BENCHMARKS.md, docs/, ...) whole, code
blocks included; the comments of the C and C++ sources under allocator/,
include/, bridge/, tests/, bench/, examples/ (and the top-level policies/);
the comments and docstrings (any statement that is a lone string) of the
Python files under python/, bench/, tests/, examples/; the comment lines of
the shell scripts. Code is not read: an include or an import of a missing
file fails the build or the import already, and a string in code is data (a
user's file, a file the tool writes), not a reference.

The repository's files are `git ls-files`, tracked and untracked-but-not-
ignored, that exist in the working tree (a move in progress is judged on the
tree as it is). Without git the test skips.

A reference is a token of file-name characters (letters, digits, `_`, `-`,
`.`, `/`) that is one of:

- a name with a source or doc extension (SOURCE_EXTENSIONS: `entry.c`,
  `log/chunks.py`, `DESIGN.md`). A bare name passes when any repository file
  has that name; a path passes when it names a file or folder from the
  repository root, from the referring file's folder, or as the tail of a
  repository path (`analysis/streamed.py` is python/torchalloc/analysis/
  streamed.py);
- a name with a data or output extension (DATA_EXTENSIONS: logs, reports,
  snapshots, libraries) only in a path from a top-level folder of the
  repository (`python/tests/data/small_snapshot.pickle`), or relative (`./`):
  a bare `run.talog` or `out.json` is the user's or a tool's file;
- a path with no extension from a top-level folder (`allocator/policies/`),
  or one folder with a slash (`segments/`): it passes on a file or folder by
  the same rule, or on a program's source (`bench/make_big_log` is built
  from bench/make_big_log.c);
- a dotted name from the package, `torchalloc.a.b`, whose first part that is
  no subpackage was a module once and is no longer (git history):
  `torchalloc.job`, now torchalloc.analysis.job; an attribute
  (`torchalloc.log.read_log`) passes;
- in Python comments and docstrings and in Markdown, `name.attr` where
  `name` is the snake_case module name of a Python file the repository had
  and has no longer (git history) and the file's code does not bind it (an
  import alias such as `from torchalloc.log import chunks as log_chunks`):
  `report_data.page_data` after report_data.py became report/data.py.

Not references, by structure: absolute (/tmp/...) and home (~) paths, URLs,
suffixes (`.talog.xz`), a name with a glob or placeholder character (`*`,
`?`, `%`, `$`, `{`, `<`, `@`, `+`: `run.%p.talog`, `$LOG.txt`) or a
capitals folder (`PATH/TO/test_cuda.py`), the value of a command-line option
(`--markdown table.md`: a file the command writes) and a path git ignores
(`build-asan/`, `build/libtorchalloc.so`: build outputs). The few others that
are not repository files are in ALLOWED, each with its reason.

Shallow clones know less history, so the last two rules find fewer names there.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# Extensions of source, doc and build files: a name with one is checked wherever it stands.
SOURCE_EXTENSIONS = {"c", "h", "cpp", "cc", "cu", "cuh", "hpp", "py", "pyi", "md", "rst", "sh", "toml", "cfg", "ini",
                     "yml", "yaml", "cmake", "in"}
# Extensions of data and output files (logs, reports, snapshots, traces, libraries): mostly a user's or a
# tool's files (`run.talog`, `report.html`, `out.json`, `build/libtorchalloc.so`), so checked only in a
# path from a top-level folder of the repository (`python/torchalloc/data/demo_trace.talog.xz`).
DATA_EXTENSIONS = {"talog", "json", "jsonl", "csv", "txt", "html", "png", "svg", "pickle", "gz", "xz", "css", "js",
                   "so"}

C_DIRS = ("allocator", "include", "bridge", "tests", "bench", "examples", "policies")
PY_DIRS = ("python", "bench", "tests", "examples")
C_EXTS = (".c", ".h", ".cpp", ".cc", ".cu", ".cuh", ".hpp")

# Names that look like repository files and are not; each with why. A name whose last part is here
# passes anywhere; a key ending in "/" passes every path below it.
ALLOWED = {
    "train.py": "the user's training script in usage examples",
    "modeling_llama.py": "transformers' Llama model, a frame in the sample report",
    "modeling_utils.py": "transformers' model loading (from_pretrained, .cuda()), a frame in top's sample frame",
    "sitecustomize.py": "the start-up hook `torchalloc compare` writes into a temporary folder",
    "cuda.h": "the CUDA toolkit's header",
    "driver_types.h": "the CUDA toolkit's header",
    "test/test_cuda.py": "PyTorch's allocator tests, in the user's PyTorch checkout",
    "test_cuda.py": "the same file by its name (bench/pytorch_tests.py's defaults go by it)",
    "test/test_cuda_multigpu.py": "PyTorch's tests of several GPUs, in the user's PyTorch checkout",
    "test_cuda_multigpu.py": "the same file by its name (bench/pytorch_tests.py's defaults go by it)",
    "torch/": "PyTorch's source tree",
    "c10/": "PyTorch's source tree",
    "bridge_src/": "the bridge's sources as setup.py copies them into the installed package",
    "a.b.c": "torch's flat stats keys (stats.py), not a file",
    "../x": "the path a hostile $RANK must not put into a log's name (log_path.h)",
}

# Files not read: this one (its docstring shows stale names as examples).
NOT_READ = {THIS}

OPTION = re.compile(r"--?[A-Za-z][\w-]*")  # its value, the next token, is the command's file
SPLIT = re.compile(r"[\s`'\"()\[\],;:=|#!]+")
PATH = re.compile(r"(?:\.{1,2}/)*[\w.-]+(?:/[\w.-]+)*/?")
PLACEHOLDER = re.compile(r"[*?%${}<>@+~\\]")
CAPITAL_FOLDER = re.compile(r"(?:^|/)[A-Z][A-Z0-9_]+/")  # PATH/TO/test_cuda.py, DIR/run.talog: placeholders
URL = re.compile(r"\w+://\S+")
MODULE_ATTR = re.compile(r"(?<![\w.])(([A-Za-z_]\w*_\w*)\.(?!py\b)[A-Za-z_]\w*)")  # report_data.page_data
PACKAGE_NAME = re.compile(r"(?<![\w./-])torchalloc(?:\.[A-Za-z_]\w*)+")


def _git(*args: str) -> list[str]:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if line]


class Repo:
    """The files and folders of the working tree, and the Python files its history had."""

    def __init__(self) -> None:
        listed = _git("ls-files", "--cached", "--others", "--exclude-standard")
        self.files = sorted({p for p in listed if (REPO / p).is_file()})
        self.dirs: set[str] = set()
        for p in self.files:
            while "/" in p:
                p = p.rsplit("/", 1)[0]
                self.dirs.add(p)
        self.paths = set(self.files) | self.dirs
        self.tails = {p[p.find("/"):] for p in self.paths}  # "/a/b" for "x/a/b", "x/y/a/b", ...
        for p in self.paths:
            while "/" in p[1:]:
                p = p[p.find("/", 1):]
                self.tails.add(p)
        self.names = {p.rsplit("/", 1)[-1] for p in self.files}
        self.top = {p for p in self.dirs if "/" not in p}
        try:  # every path a commit touched; a shallow clone knows fewer, and fails fewer names
            self.ever = set(_git("log", "--format=", "--name-only", "HEAD"))
        except subprocess.CalledProcessError:
            self.ever = set()
        stems = {Path(p).stem for p in self.files if p.endswith(".py")}
        folders = {p.rsplit("/", 1)[-1] for p in self.dirs}
        # Modules that moved or went: snake_case names only, so that a word such as `log` (the old log.py,
        # now the log/ package) or a variable's attribute is not taken for one.
        self.former_modules = {Path(p).stem for p in self.ever if p.endswith(".py")} - stems - folders
        self.former_modules = {m for m in self.former_modules if "_" in m.strip("_")}

    def exists(self, path: str, referrer: str) -> bool:
        """A file or folder from the root, from the referrer's folder, or as the tail of a repository path."""
        path = path.rstrip("/")
        joined = os.path.normpath(os.path.join(os.path.dirname(referrer), path)).replace(os.sep, "/")
        if path in self.paths or joined in self.paths:
            return True
        return not path.startswith(".") and "/" + path in self.tails

    def ignored(self, found: list[tuple[str, int, str]]) -> set[tuple[str, str]]:
        """(referrer, name) of each name git ignores: build outputs (build*/, *.so), never repository files."""
        asked: dict[str, set[tuple[str, str]]] = {}
        for referrer, _line, word in found:
            path = word
            if word.startswith(("./", "../")):
                path = os.path.normpath(os.path.join(os.path.dirname(referrer), word)).replace(os.sep, "/")
            if not path.startswith("../"):  # git refuses a path outside the repository
                asked.setdefault(path + ("/" if word.endswith("/") else ""), set()).add((referrer, word))
        if not asked:
            return set()
        done = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, input="\n".join(asked),
                              capture_output=True, text=True)
        return {pair for path in done.stdout.splitlines() for pair in asked.get(path, ())}


def _c_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of each line of each comment; strings and character literals skipped."""
    out: list[tuple[int, str]] = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append((line, text[i + 2:end]))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, end)
            i = end + 2
        elif c in "\"'":
            i += 1
            while i < n and text[i] != c and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            i += 1
        else:
            i += 1
    return out


def _py_comments(tokens: list[tokenize.TokenInfo]) -> list[tuple[int, str]]:
    """(line, text) of each comment and of each line of each lone-string statement (docstrings)."""
    out: list[tuple[int, str]] = []
    start_of_line = True
    for k, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string[1:]))
        elif tok.type == tokenize.STRING and start_of_line:
            nxt = tokens[k + 1] if k + 1 < len(tokens) else None
            if nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.COMMENT):
                for j, part in enumerate(tok.string.split("\n")):
                    out.append((tok.start[0] + j, part))
        if tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            start_of_line = True
        elif tok.type not in (tokenize.NL, tokenize.COMMENT):
            start_of_line = False
    return out


def _shell_comments(text: str) -> list[tuple[int, str]]:
    return [(k, line.strip()[1:]) for k, line in enumerate(text.split("\n"), 1)
            if line.strip().startswith("#") and not line.startswith("#!")]


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return path.split("/", 1)[0] in dirs


def _texts(repo: Repo) -> list[tuple[str, str, list[tuple[int, str]], set[str]]]:
    """(path, kind, lines read, names its code uses) of each file read."""
    out = []
    for path in repo.files:
        if path in NOT_READ:
            continue
        if path.endswith(".md"):
            kind = "md"
        elif path.endswith(C_EXTS) and _under(path, C_DIRS):
            kind = "c"
        elif path.endswith(".py") and _under(path, PY_DIRS):
            kind = "py"
        elif path.endswith(".sh") or path == ".ci/run":
            kind = "sh"
        else:
            continue
        text = (REPO / path).read_text(encoding="utf-8", errors="replace")
        names: set[str] = set()
        if kind == "md":
            lines = list(enumerate(text.split("\n"), 1))
        elif kind == "c":
            lines = _c_comments(text)
        elif kind == "py":
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
            lines = _py_comments(tokens)
            names = {t.string for t in tokens if t.type == tokenize.NAME}
        else:
            lines = _shell_comments(text)
        out.append((path, kind, lines, names))
    return out


def _moved_module(repo: Repo, name: str) -> bool:
    """torchalloc.a.b names a module the package had and has no longer (torchalloc.job, now analysis/job.py).

    Each part is followed while it is a subpackage; a part that is a module or any other name (an
    attribute: torchalloc.log.read_log) ends the walk, and fails only when it was a module once."""
    parts = name.split(".")
    here = "python/" + parts[0]
    for part in parts[1:]:
        if f"{here}/{part}/__init__.py" in repo.paths:
            here = f"{here}/{part}"
            continue
        return f"{here}/{part}.py" not in repo.paths and (f"{here}/{part}.py" in repo.ever or any(
            p.startswith(f"{here}/{part}/") for p in repo.ever))
    return False


def _references(line: str) -> list[str]:
    """The path-like tokens of a line that name a file or folder (module docstring)."""
    out = []
    after_option = False
    for word in SPLIT.split(URL.sub(" ", line)):
        word, option, after_option = word.strip("*").rstrip("."), after_option, OPTION.fullmatch(word) is not None
        if (option or not word or word.startswith(("/", "...")) or (word.startswith(".") and "/" not in word)
                or PLACEHOLDER.search(word) or CAPITAL_FOLDER.search(word) or not PATH.fullmatch(word)):
            continue
        last = word.rstrip("/").rsplit("/", 1)[-1]
        _stem, dot, ext = last.rpartition(".")
        if dot and ext in SOURCE_EXTENSIONS and not word.endswith("/"):
            out.append(word)
        elif dot and ext in DATA_EXTENSIONS and "/" in word:
            out.append(word)
        elif "/" in word and "." not in last:
            out.append(word)
    return out


def _allowed(word: str) -> bool:
    return word.rsplit("/", 1)[-1] in ALLOWED or word in ALLOWED or any(
        key.endswith("/") and word.startswith(key) for key in ALLOWED)


def _stale_path(repo: Repo, word: str, referrer: str) -> bool:
    last = word.rstrip("/").rsplit("/", 1)[-1]
    _stem, dot, ext = last.rpartition(".")
    relative = word.startswith(("./", "../"))
    first = word.split("/", 1)[0]
    if dot and ext in SOURCE_EXTENSIONS:
        if "/" not in word:
            return word not in repo.names
        return not repo.exists(word, referrer)
    if dot:  # data: from a top-level folder (or relative) only
        return (first in repo.top or relative) and not repo.exists(word, referrer)
    # a folder, or a program named by its source without the extension (bench/make_big_log)
    if not (first in repo.top or relative or (word.endswith("/") and word.count("/") == 1)):
        return False
    return not repo.exists(word, referrer) and not any(
        repo.exists(f"{word}.{e}", referrer) for e in ("c", "cpp", "py", "sh"))


def stale_references(repo: Repo) -> list[str]:
    """"file:line: name" of every name of a repository file or folder that does not exist."""
    found: list[tuple[str, int, str]] = []
    for path, kind, lines, bound in _texts(repo):
        for number, line in lines:
            for word in _references(line):
                if not _allowed(word) and _stale_path(repo, word, path):
                    found.append((path, number, word))
            for name in PACKAGE_NAME.findall(URL.sub(" ", line)):
                if _moved_module(repo, name):
                    found.append((path, number, name))
            if kind in ("py", "md"):
                for name, module in MODULE_ATTR.findall(line):
                    if module in repo.former_modules and module not in bound:
                        found.append((path, number, name))
    ignored = repo.ignored(found)
    return [f"{p}:{n}: {word}" for p, n, word in found if (p, word) not in ignored]


@pytest.fixture(scope="module")
def repo() -> Repo:
    try:
        return Repo()
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout: {error}")


def test_every_named_file_exists(repo: Repo) -> None:
    stale = stale_references(repo)
    assert not stale, "names of files the repository does not have:\n" + "\n".join(stale)


if __name__ == "__main__":
    print("\n".join(stale_references(Repo())))
