"""The package's layers, read from its source with `ast`.

The place of a module decides its layer:

- runtime: the top-level modules in RUNTIME, what a training process loads
  (install, stats, phases, tracking, the bridge, OOM reports). They import
  no numpy and none of the tools.
- shared: the top-level modules in SHARED, pure-Python facts and formatters
  both sides use. They import no numpy and nothing but each other.
- tools: every subpackage, in TOOL_PACKAGES' order: log (reading logs and
  snapshots), replay, analysis, plan (what fits at another batch size),
  report (rendering), integrations (trainer callbacks), cli (the commands).
  A tool imports runtime and shared modules, its own package and earlier
  ones, never a later one: so no engine imports a command, and cli imports
  everything. plan takes the analysis through its package's names alone.

A new top-level module fails test_every_module_has_a_layer until it is put
in RUNTIME or SHARED (or moved into a tool package); a new module in a
package needs no edit here. No two package modules import each other in a
circle, lazily or not. Within log/ and analysis/, a module imports only its
own stage or earlier ones.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from graph_circle import first_circle

PYTHON_DIR = Path(__file__).resolve().parents[1]
PACKAGE_DIR = PYTHON_DIR / "torchalloc"

RUNTIME, SHARED, TOOL = "runtime", "shared", "tool"

RUNTIME_MODULES = {"torchalloc", "_lib", "_device", "_cuda_init", "plug", "stats", "phases", "tracking", "bridge",
                   "oom"}
SHARED_MODULES = {"_records", "units", "_compressed", "printable", "text_fit"}  # printable: control characters escaped in every text the tools print; text_fit: tables within $COLUMNS
# Top-level, but a tool: imported by the examples' and benchmarks' child processes, never by the package.
TOP_LEVEL_TOOLS = {"_gpu_child"}
TOOL_PACKAGES = ["log", "replay", "analysis", "plan", "report", "integrations", "cli"]

# The analysis in the order the data flows; a stage imports only its own stage or earlier ones. The rules come first
# and read no log; the passes name no section; each section stands alone (test_sections_stand_alone).
ANALYSIS_STAGES: list[tuple[str, ...]] = [
    ("rules", "rules.frames", "rules.roles"),  # what the names in a log mean
    ("rules.sites", "rules.classify", "rules.categorize"),  # allocation sites; the reasons, the categories, their rules
    ("rules.blocks",),  # those rules block by block, and the facts of a block's future they read
    ("passes", "passes.pieces", "passes.ranges", "passes.details", "passes.follow"),  # a log's events piece by
    # piece, blocks paired across pieces; which range held an address when; a block's details; the followers' hooks
    ("passes.first_state",),  # what the first pass carries from piece to piece
    ("passes.first",),  # the first pass
    ("passes.moments",),  # the moments whose live blocks the second pass keeps
    ("passes.second",),  # the second pass, feeding the sections' followers
    ("anatomy", "timeline"),  # what was live at a moment, grouped; allocated and reserved over time
    ("notes",),
    ("sections.views",),  # what a section shows, as plain data
    ("sections.section",),  # what a section declares: its entry, and its part of the pass
    ("sections.reserve.terms", "sections.ooms.diagnosis"),  # a section's parts that its module builds on
    ("sections.reserve.rows",),
    ("sections.markers", "sections.leaks", "sections.lifetimes", "sections.phases", "sections.estimate",
     "sections.reserve", "sections.modules", "sections.ooms"),  # one module (or package) per section
    ("sections",),  # SECTIONS: the sections in order, the one place to register one
    ("summary",),  # what the report says first, from the sections' rows
    ("front",),  # analyze, Analysis
    ("__init__",),  # re-exports
    ("job",),  # several logs (one per rank) analysed together
]
# The readers in the order the data flows: a log's format, its file, the one decoder of its slots, the two drivers
# of that decoder (read_log: a whole file as one piece; chunks: a file in pieces), the trace built from the pieces
# (trace_stream) beside the snapshot's (trace_snapshot, sharing trace_events), trace.py picking between them.
LOG_STAGES: list[tuple[str, ...]] = [
    ("format", "strings", "ranks", "trace_events"),  # the log's layout, header and checksum; string slots; traces
    ("files", "decode"),  # a log's file; its slots decoded piece by piece (all read_log needs)
    ("checks",),  # records no writer produces: what chunks and top screen out of the decoded records
    ("reader", "chunks", "trace_snapshot"),  # read_log and ChunkedLog drive the decoder; a PyTorch snapshot
    ("trace_stream",),  # a log as a trace, through log_events
    ("trace",),
    ("__init__",),
]

# torchalloc.<name> lazily maps these attributes to tool modules: `import torchalloc` never loads
# them, asking for the attribute does (the user asked for the tool).
LAZY_TOOL_EXPORTS = {"read_log"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PYTHON_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


MODULES = package_modules()


def layer_of(name: str) -> str | None:
    """runtime, shared or tool for a package module; None for a top-level module nobody placed."""
    parts = name.split(".")
    if parts[0] != "torchalloc":
        return None  # numpy, the standard library
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in RUNTIME_MODULES):
        return RUNTIME
    if len(parts) == 2 and parts[1] in SHARED_MODULES:
        return SHARED
    if len(parts) == 2 and parts[1] in TOP_LEVEL_TOOLS:
        return TOOL
    return TOOL if parts[1] in TOOL_PACKAGES else None


def tool_package(name: str) -> int:
    """The index of a tool module's package in TOOL_PACKAGES (-1: not in a tool package)."""
    parts = name.split(".")
    return TOOL_PACKAGES.index(parts[1]) if len(parts) > 1 and parts[1] in TOOL_PACKAGES else -1


def _from_target(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The full name of the module a `from ... import` in module `name` reads from."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str) -> set[str]:
    """Every module `name` imports anywhere in its source (lazy imports in functions too): package
    modules by their full name, anything else by its top-level name ("numpy")."""
    path = MODULES[name]
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name if alias.name in MODULES else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(name, is_package, node)
            if target in MODULES:
                found.add(target)
                # `from . import x` names a module when x is one
                named = (f"{target}.{alias.name}" for alias in node.names)
                found.update(m for m in named if m in MODULES)
            else:
                found.add(target.split(".")[0])
    return found


def lazy_exports() -> dict[str, str]:
    """torchalloc/__init__.py's _EXPORTS: attribute -> the module it is loaded from."""
    tree = ast.parse((PACKAGE_DIR / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_EXPORTS":
            exports = ast.literal_eval(node.value)
            return {attr: f"torchalloc.{module}" for attr, (module, _) in exports.items()}
    raise AssertionError("torchalloc/__init__.py has no _EXPORTS table")


def test_the_import_reader_sees_imports() -> None:
    """The checks below are only as good as imports_of: it must see relative, aliased and lazy imports."""
    assert {"numpy", "torchalloc.log.chunks", "torchalloc._records", "torchalloc.analysis.rules.frames"} <= imports_of(
        "torchalloc.analysis.passes.first")
    assert "torchalloc.replay.ranks" in imports_of("torchalloc.cli.replay")  # lazy, in a function
    assert "torchalloc._lib" in imports_of("torchalloc.stats")  # from . import _lib
    assert "torch" in imports_of("torchalloc.plug")  # inside a function
    assert lazy_exports()["install"] == "torchalloc.plug"


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, (f"put these top-level modules in RUNTIME_MODULES or SHARED_MODULES of "
                          f"{Path(__file__).name}, or move them into a tool package: {unplaced}")
    named = {f"torchalloc.{m}" for m in RUNTIME_MODULES | SHARED_MODULES | TOP_LEVEL_TOOLS} - {"torchalloc.torchalloc"}
    gone = sorted(named - set(MODULES))
    assert not gone, f"{Path(__file__).name} names modules that no longer exist: {gone}"
    packages = {m.split(".")[1] for m in MODULES if m.count(".") >= 1 and (PACKAGE_DIR / m.split(".")[1]).is_dir()}
    assert packages == set(TOOL_PACKAGES), f"place every subpackage in TOOL_PACKAGES: {sorted(packages ^ set(TOOL_PACKAGES))}"
    for prefix, stages in (("torchalloc.analysis.", ANALYSIS_STAGES), ("torchalloc.log.", LOG_STAGES)):
        staged = set(_stages(prefix, stages))
        inside = {m for m in MODULES if m == prefix[:-1] or m.startswith(prefix)}
        assert staged == inside, f"give every module of {prefix[:-1]} one stage: {sorted(inside ^ staged)}"


def test_runtime_imports_neither_tools_nor_numpy() -> None:
    for name in MODULES:
        if layer_of(name) != RUNTIME:
            continue
        bad = sorted(m for m in imports_of(name) if m == "numpy" or layer_of(m) == TOOL)
        assert not bad, f"{name} is runtime (loaded in every training process) but imports {bad}"


def test_runtime_lazy_exports_stay_off_the_tools() -> None:
    tools = sorted(attr for attr, module in lazy_exports().items() if layer_of(module) == TOOL)
    assert set(tools) == LAZY_TOOL_EXPORTS, (
        f"torchalloc.{{{', '.join(tools)}}} load tool modules: list each deliberate one in LAZY_TOOL_EXPORTS"
    )


def test_shared_modules_import_only_shared_ones() -> None:
    for name in MODULES:
        if layer_of(name) != SHARED:
            continue
        bad = sorted(m for m in imports_of(name) if m == "numpy" or layer_of(m) in (RUNTIME, TOOL))
        assert not bad, f"{name} is shared by runtime and tools, so plain Python, but imports {bad}"


def test_tool_packages_import_only_earlier_ones() -> None:
    """log < replay < analysis < plan < report < integrations < cli: an engine never imports a command."""
    upward = []
    for name in MODULES:
        mine = tool_package(name)
        if mine < 0:
            continue
        later = sorted(m for m in imports_of(name) if m in MODULES and tool_package(m) > mine)
        upward += [f"{name} ({TOOL_PACKAGES[mine]}) imports {m} ({TOOL_PACKAGES[tool_package(m)]})" for m in later]
    assert not upward, "imports that run upward between tool packages:\n  " + "\n  ".join(upward)


def test_plan_takes_the_analysis_through_its_public_names() -> None:
    """plan/ imports the analysis package itself (analysis/__init__.py's names), none of its modules: the
    analysis can move its rooms without plan knowing."""
    inside = sorted(f"{name} imports {m}" for name in MODULES if name.startswith("torchalloc.plan")
                    for m in imports_of(name) if m.startswith("torchalloc.analysis."))
    assert not inside, "plan reaches inside the analysis:\n  " + "\n  ".join(inside)


def test_no_import_circle() -> None:
    """No two modules of the package import each other, directly or round a circle (lazy imports count)."""
    # a module of a package importing the package's own __init__ is how `from . import x` reads: not an edge
    graph = {name: [m for m in imports_of(name) if m in MODULES and m != name and not name.startswith(m + ".")]
             for name in MODULES}
    circle = first_circle(graph)
    assert circle is None, "modules that import each other in a circle: " + " -> ".join(circle)


def _stages(prefix: str, stages: list[tuple[str, ...]]) -> dict[str, int]:
    """Full module name -> its stage's index; "__init__" stands for the package `prefix` itself."""
    return {prefix.removesuffix(".") if module == "__init__" else prefix + module: index
            for index, stage in enumerate(stages) for module in stage}


def _assert_flows_forward(stage_of: dict[str, int]) -> None:
    for name, index in stage_of.items():
        later = sorted(m for m in imports_of(name) if stage_of.get(m, -1) > index)
        assert not later, f"{name} (stage {index}) imports later stages {later}: the data flows the other way"


def test_analysis_stages_import_only_earlier_stages() -> None:
    _assert_flows_forward(_stages("torchalloc.analysis.", ANALYSIS_STAGES))


SECTIONS_PACKAGE = "torchalloc.analysis.sections"
# What every section builds on: its entry and part (section), the view types (views).
SECTIONS_SHARED = {f"{SECTIONS_PACKAGE}.section", f"{SECTIONS_PACKAGE}.views"}


def _section_of(name: str) -> str | None:
    """The section a module of analysis/sections/ belongs to (its module, or its package's); None for the list
    itself and the modules every section shares."""
    if not name.startswith(SECTIONS_PACKAGE + ".") or name in SECTIONS_SHARED:
        return None
    return ".".join(name.split(".")[:4])


def test_sections_stand_alone() -> None:
    """A section is one module (or package) of analysis/sections/ plus its line in SECTIONS: none imports another
    section, and the rules and the passes import none (the pass names no section)."""
    sections = {s for s in map(_section_of, MODULES) if s}
    assert {f"{SECTIONS_PACKAGE}.{k}" for k in ("markers", "leaks", "lifetimes", "phases", "estimate", "reserve",
                                                  "modules", "ooms")} <= sections, sorted(sections)
    crossing = []
    for name in MODULES:
        mine = _section_of(name)
        for m in imports_of(name):
            other = _section_of(m)
            if mine is not None and other is not None and other != mine:
                crossing.append(f"{name} imports {m}")
            if other is not None and name.startswith(("torchalloc.analysis.passes", "torchalloc.analysis.rules")):
                crossing.append(f"{name} imports {m}")
    assert not crossing, "sections reached from outside their own module:\n  " + "\n  ".join(crossing)


def test_log_readers_import_only_earlier_stages() -> None:
    _assert_flows_forward(_stages("torchalloc.log.", LOG_STAGES))


# The log decoder's modules: whoever drives the decoder (read_log, ChunkedLog, top's LiveReader) does it through
# their public names.
LOG_DECODER = {f"torchalloc.log.{m}" for m in ("format", "files", "decode", "reader", "chunks")}


def test_the_log_decoder_is_driven_through_public_names() -> None:
    private = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _from_target(name, path.name == "__init__.py", node)
            if target in LOG_DECODER and target != name:
                private += [f"{name} imports {target}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, "private names of the log decoder used from outside their module:\n  " + "\n  ".join(private)


def test_importing_the_runtime_leaves_numpy_and_the_tools_unloaded() -> None:
    tools = sorted(name for name in MODULES if layer_of(name) == TOOL)
    code = (
        "import sys\n"
        "import torchalloc, torchalloc.plug, torchalloc.stats, torchalloc.phases, torchalloc.tracking\n"
        "torchalloc.install; torchalloc.memory_stats; torchalloc.phase; torchalloc.track\n"
        f"tools = {tools!r}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'numpy' or m in tools)\n"
        "assert not loaded, f'the runtime loaded {loaded}'\n"
        "import torchalloc.log.reader\n"  # the check can fail: a tool does load numpy
        "assert 'numpy' in sys.modules\n"
    )
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=PYTHON_DIR)
    assert done.returncode == 0, done.stderr
