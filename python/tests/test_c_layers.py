"""The C core's layers hold: every include and every call runs downward.

A layer is a folder: LAYERS below lists the folders lowest first, as
docs/ARCHITECTURE.md draws them, so a file's place decides its layer (a new
file in an existing folder needs no edit here; a new folder fails
test_every_c_file_has_a_layer until it is placed). Checked:

- includes: a file includes headers of its own layer or of lower ones;
  a policy (policies/) includes only two headers of the core,
  allocator/policy/policy.h and the segment layer's services
  (allocator/segments/services.h): it never sees the heap, the segment
  layer's struct or the log;
- calls: each file is compiled on its own (no LTO) and `nm` says which
  file defines each symbol another uses; every such edge runs to the same
  or a lower layer, and the file graph has no circle at all;
- calls from headers: a function with a body in a header (static inline)
  is compiled into its includers, so `nm` charges its calls to them; each
  such function is held to its header's layer: what it calls or reads is
  defined in the same layer or a lower one;
- the public API is the top layer: every function the public headers
  (include/) declare is defined in a file of allocator/api/ (a lower layer
  keeps an internal ta_ function that the public one calls);
- the core names no policy: outside policies/, no code (comments aside)
  spells a policy's name, its ops table or an id constant for it.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from graph_circle import first_circle

ROOT = Path(__file__).resolve().parents[2]

# Lowest first: (layer, its folders relative to the repository root). A
# folder holds the files directly in it, not those of its subfolders.
LAYERS: list[tuple[str, list[str]]] = [
    ("public header", ["include"]),
    ("base", ["allocator/base"]),
    ("leaves", ["allocator/block", "allocator/accounting"]),
    ("device backends", ["allocator/device"]),
    ("log", ["allocator/log"]),
    ("policy interface", ["allocator/policy"]),
    ("segments", ["allocator/segments"]),
    ("policy building blocks", ["policies/parts"]),
    ("policies", ["policies"]),  # the registry (registry.c) too: it only reads the policies' tables
    ("context", ["allocator/context"]),
    ("heap", ["allocator/heap"]),
    ("runtime", ["allocator/runtime"]),
    ("public API", ["allocator/api"]),
    ("C++ bridge", ["bridge"]),
]

SOURCE_DIRS = ("include", "allocator", "policies", "bridge")
POLICIES = ROOT / "policies"
INCLUDE_DIRS = ("include", "allocator", ".")  # the compiler's -I (CMakeLists.txt), after the including file's own folder
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
C_SUFFIXES = (".c", ".h", ".cpp")


def c_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*")
                  if p.suffix in C_SUFFIXES)


def layer_of() -> dict[Path, int]:
    table: dict[Path, int] = {}
    for index, (_, folders) in enumerate(LAYERS):
        for folder in folders:
            for path in (ROOT / folder).glob("*"):
                if path.suffix in C_SUFFIXES:
                    table[path.resolve()] = index
    return table


def includes(path: Path) -> list[Path]:
    """The project headers `path` includes, resolved as the compiler does ("" is relative to the file first)."""
    out = []
    for name in INCLUDE.findall(path.read_text()):
        for base in (path.parent, *(ROOT / d for d in INCLUDE_DIRS)):
            candidate = (base / name).resolve()
            if candidate.is_file():
                out.append(candidate)
                break
    return out


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_every_c_file_has_a_layer() -> None:
    table = layer_of()
    unplaced = [rel(p) for p in c_files() if p.resolve() not in table]
    assert not unplaced, f"put these files in a layer's folder, or add their folder to LAYERS (python/tests/test_c_layers.py) and docs/ARCHITECTURE.md: {unplaced}"


def test_includes_run_downward() -> None:
    table = layer_of()
    upward = []
    for path in c_files():
        if path.resolve() not in table:
            continue  # test_every_c_file_has_a_layer names it
        me = table[path.resolve()]
        for header in includes(path):
            if header.resolve() in table and table[header.resolve()] > me:
                upward.append(f"{rel(path)} ({LAYERS[me][0]}) includes {rel(header)} ({LAYERS[table[header]][0]})")
    assert not upward, "includes that run upward:\n  " + "\n  ".join(upward)


POLICY_SEES = ("allocator/policy/policy.h", "allocator/segments/services.h")


def test_policies_see_only_the_policy_interface() -> None:
    allowed_core = {(ROOT / name).resolve() for name in POLICY_SEES}
    bad = []
    for path in sorted(p for p in POLICIES.rglob("*") if p.suffix in C_SUFFIXES):
        for header in includes(path):
            in_core = (ROOT / "allocator").resolve() in header.parents
            if in_core and header not in allowed_core:
                bad.append(f"{rel(path)} includes {rel(header)}")
    assert not bad, f"a policy may include only {' and '.join(POLICY_SEES)} of the core:\n  " + "\n  ".join(bad)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def policy_names() -> list[str]:
    names = []
    for path in POLICIES.rglob("*.c"):
        names += re.findall(r'\.name\s*=\s*"([a-z_0-9]+)"', path.read_text())
    return sorted(set(names))


def test_the_core_names_no_policy() -> None:
    names = policy_names()
    assert len(names) >= 3, names  # caching, exact, phase_arena at least: the parse works
    offenders = []
    for path in c_files():
        if POLICIES.resolve() in path.resolve().parents:
            continue
        code = _strip_comments(path.read_text())
        for name in names:
            pattern = rf'"{name}"|\bta_{name}_policy\b|\bTA_POLICY_{name.upper()}\b'
            if re.search(pattern, code):
                offenders.append(f"{rel(path)} names policy {name!r}")
    assert not offenders, "the core asks the registry, it never names a policy:\n  " + "\n  ".join(offenders)


# ---------------------------------------------------------------------------
# Calls, from the object files
# ---------------------------------------------------------------------------


def _symbols(obj: Path, nm: str) -> tuple[set[str], set[str]]:
    out = subprocess.run([nm, "-P", str(obj)], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind.upper() in "TDBRVWC" and kind not in "tdbr":  # global definitions only
            defined.add(name)
    return defined, undefined


@pytest.fixture(scope="module")
def symbols(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], dict[Path, set[str]]]:
    """Which .c file defines each global symbol, and the symbols each .c file uses from elsewhere."""
    cc, nm = shutil.which("cc") or shutil.which("gcc"), shutil.which("nm")
    if not cc or not nm:
        pytest.skip("needs a C compiler (cc) and nm to compile each file and read its symbols")
    out = tmp_path_factory.mktemp("objects")
    sources = [p for p in c_files() if p.suffix == ".c"]
    defined_by: dict[str, Path] = {}
    uses: dict[Path, set[str]] = {}
    for src in sources:
        obj = out / ("_".join(src.relative_to(ROOT).parts[:-1]) + "_" + src.stem + ".o")
        includes_flags = [flag for d in INCLUDE_DIRS for flag in ("-I", str(ROOT / d))]
        subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-O0", "-c", str(src), "-o", str(obj), *includes_flags],
                       check=True, capture_output=True)
        defined, undefined = _symbols(obj, nm)
        for name in defined:
            defined_by[name] = src.resolve()
        uses[src.resolve()] = undefined
    return defined_by, uses


@pytest.fixture(scope="module")
def call_graph(symbols: tuple[dict[str, Path], dict[Path, set[str]]]) -> dict[Path, set[Path]]:
    defined_by, uses = symbols
    return {src: {defined_by[s] for s in names if s in defined_by and defined_by[s] != src}
            for src, names in uses.items()}


def test_calls_run_downward(call_graph: dict[Path, set[Path]]) -> None:
    table = layer_of()
    upward = [f"{rel(a)} ({LAYERS[table[a]][0]}) calls into {rel(b)} ({LAYERS[table[b]][0]})"
              for a, callees in call_graph.items() for b in callees
              if a in table and b in table and table[b] > table[a]]
    assert not upward, "calls that run upward:\n  " + "\n  ".join(sorted(upward))


def test_no_call_circle(call_graph: dict[Path, set[Path]]) -> None:
    circle = first_circle(call_graph)
    assert circle is None, "files that call each other in a circle: " + " -> ".join(rel(p) for p in circle)


def test_the_graph_is_not_empty(call_graph: dict[Path, set[Path]]) -> None:
    """Guards the two tests above against a parse that finds nothing."""
    entry = (ROOT / "allocator" / "api" / "alloc_api.c").resolve()
    runtime = (ROOT / "allocator" / "runtime" / "runtime.c").resolve()
    assert runtime in call_graph[entry]
    arena = (POLICIES / "parts" / "arena.c").resolve()
    assert (ROOT / "allocator" / "segments" / "segments.c").resolve() in call_graph[arena]


def test_a_new_policy_is_found_by_its_folder() -> None:
    """CMake globs policies/ and this test places it by folder: the registry's list is the one edit."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert "policies/*.c" in cmake
    listed = re.search(r"#define TA_POLICY_LIST\(X\)(.*?)\n\n", (POLICIES / "policy_list.h").read_text(), re.S)
    assert listed, "TA_POLICY_LIST not found in policies/policy_list.h"
    assert sorted(re.findall(r"X\((\w+)\)", listed.group(1))) == policy_names()


# ---------------------------------------------------------------------------
# Functions defined in headers
# ---------------------------------------------------------------------------

# A function with a body in a header (static inline, or static and kept out
# of line): its code is compiled into every file that includes it, so the
# object files charge its calls to the includer, whose layer may be higher.
# Such a function is held to its header's layer instead.
HEADER_FUNCTION = re.compile(r"^static\b[^;{}=]*?\b([A-Za-z_]\w*)\s*\([^;{}]*?\)\s*\{", re.M | re.S)
IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")


def _strip_literals(code: str) -> str:
    """String and character literals emptied, so a brace or a name inside one is no code."""
    return re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', '""', code)


def header_functions(path: Path) -> dict[str, str]:
    """The functions `path` (a header) defines, each with its body."""
    code = _strip_literals(_strip_comments(path.read_text()))
    found = {}
    for match in HEADER_FUNCTION.finditer(code):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        found[match.group(1)] = code[match.end():end]
    return found


@pytest.fixture(scope="module")
def header_uses(symbols: tuple[dict[str, Path], dict[Path, set[str]]]) -> dict[tuple[Path, str], set[Path]]:
    """(header, function) -> the files defining what that function calls or reads (a .c file's global, or
    another header's function)."""
    defined_by = dict(symbols[0])
    bodies = {}
    for header in (p.resolve() for p in c_files() if p.suffix == ".h"):
        for name, body in header_functions(header).items():
            bodies[(header, name)] = body
            defined_by.setdefault(name, header)
    return {(header, name): {defined_by[n] for n in set(IDENTIFIER.findall(body)) if n in defined_by} - {header}
            for (header, name), body in bodies.items()}


def test_header_functions_call_downward(header_uses: dict[tuple[Path, str], set[Path]]) -> None:
    table = layer_of()
    upward = [f"{rel(header)} ({LAYERS[table[header]][0]}): {name} uses {rel(b)} ({LAYERS[table[b]][0]})"
              for (header, name), callees in header_uses.items() for b in callees
              if header in table and b in table and table[b] > table[header]]
    assert not upward, "functions in headers that call upward:\n  " + "\n  ".join(sorted(upward))


def test_header_functions_are_found(header_uses: dict[tuple[Path, str], set[Path]]) -> None:
    """Guards the test above against a parse that finds nothing: the reclaim free path's stamp calls the
    segment layer's markers, the heap lock's slow path is out of line."""
    services = (ROOT / "allocator" / "segments" / "services.h").resolve()
    marks = (ROOT / "allocator" / "segments" / "segments_marks.c").resolve()
    assert marks in header_uses[(services, "ta_segments_note_free")]
    assert ((ROOT / "allocator" / "base" / "lock.h").resolve(), "ta_lock_contended") in header_uses


# ---------------------------------------------------------------------------
# The public API is the top layer
# ---------------------------------------------------------------------------

PUBLIC_FUNCTION = re.compile(r"\bTORCHALLOC_API\b[^;(]*?\b(torchalloc_\w+)\s*\(")
API = ROOT / "allocator" / "api"


def public_functions() -> list[str]:
    return sorted({name for header in (ROOT / "include").glob("*.h")
                   for name in PUBLIC_FUNCTION.findall(_strip_comments(header.read_text()))})


def test_every_public_function_is_defined_in_the_api_layer(
        symbols: tuple[dict[str, Path], dict[Path, set[str]]]) -> None:
    """The public headers' functions are allocator/api/'s: a lower layer keeps an internal ta_ function that a thin
    public one in api/ calls, so no lower file is the public face and none calls up to one."""
    defined_by = symbols[0]
    names = public_functions()
    assert len(names) >= 60, names  # the parse works: the headers declare some 90
    missing = [name for name in names if name not in defined_by]
    elsewhere = [f"{name} in {rel(defined_by[name])}" for name in names
                 if name in defined_by and defined_by[name].parent != API.resolve()]
    assert not missing, f"declared in include/, defined nowhere: {missing}"
    assert not elsewhere, "public functions defined outside allocator/api/:\n  " + "\n  ".join(elsewhere)


# The tools' headers beside the plug-in API, and how every function each declares begins (the OOM's words,
# torchalloc_oom_summary and _report, are the plug-in API's; its numbers are the tool's).
TOOL_HEADERS = {"torchalloc_sim.h": ("torchalloc_sim_",), "torchalloc_replay.h": ("torchalloc_replay",),
                "torchalloc_oom.h": ("torchalloc_oom_facts", "torchalloc_oom_verdict", "torchalloc_oom_advice",
                                     "torchalloc_last_oom")}


def declared(header: str) -> list[str]:
    return PUBLIC_FUNCTION.findall(_strip_comments((ROOT / "include" / header).read_text()))


def test_the_plug_in_header_is_the_api_alone() -> None:
    """include/torchalloc.h is what PyTorch, the bridge and a user's program call: the simulated device,
    replay and the OOM numbers are declared in headers of their own, and the bridge needs none of them."""
    assert sorted(p.name for p in (ROOT / "include").glob("*.h")) == sorted(["torchalloc.h", *TOOL_HEADERS])
    for header, prefixes in TOOL_HEADERS.items():
        names = declared(header)
        assert names and all(name.startswith(prefixes) for name in names), (header, names)
        strays = [name for name in declared("torchalloc.h") if name.startswith(prefixes)]
        assert not strays, f"include/torchalloc.h declares {strays}: they belong in include/{header}"
    bridge_sees = {Path(h).name for path in (ROOT / "bridge").glob("*") for h in INCLUDE.findall(path.read_text())}
    assert not bridge_sees & set(TOOL_HEADERS), bridge_sees
    core = re.search(r"#define TA_CORE_FUNCTIONS\(X\)(.*?)\n\n", (ROOT / "bridge" / "bridge_core.h").read_text(), re.S)
    assert core, "bridge_core.h names the core's functions in TA_CORE_FUNCTIONS"
    used = {f"torchalloc_{name}" for name in re.findall(r"X\((\w+)\)", core.group(1))}
    assert len(used) > 20 and not used - set(declared("torchalloc.h")), used - set(declared("torchalloc.h"))
