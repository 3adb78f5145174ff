"""The package's layers, read from its source with `ast`.

- runtime: what a training process loads (install, stats, phases,
  tracking). It imports no numpy and none of the tools.
- shared: pure-Python facts and formatters both sides use. They import no
  numpy and nothing but each other.
- tool: everything that reads or drives a run from outside it (the log
  decoder, analysis, traces, replay, reports, export, compare, the CLI,
  the GPU scripts' helper). They may import anything.

Every module must be placed in LAYERS: a new one fails
test_every_module_has_a_layer until it is. The analysis stages, and the
trace sources, may import only their own stage or earlier ones.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]
PACKAGE_DIR = PYTHON_DIR / "torchalloc"

RUNTIME, SHARED, TOOL = "runtime", "shared", "tool"

LAYERS: dict[str, str] = {
    "torchalloc": RUNTIME,  # __init__: lazy attributes, imports nothing at import time
    "torchalloc._lib": RUNTIME,
    "torchalloc._device": RUNTIME,
    "torchalloc._cuda_init": RUNTIME,
    "torchalloc.plug": RUNTIME,
    "torchalloc.stats": RUNTIME,
    "torchalloc.phases": RUNTIME,
    "torchalloc.tracking": RUNTIME,
    "torchalloc.bridge": RUNTIME,
    "torchalloc.oom": RUNTIME,  # builds and loads the C++ bridge; torch only inside functions
    "torchalloc._records": SHARED,
    "torchalloc.units": SHARED,
    "torchalloc._compressed": SHARED,
    "torchalloc.printable": SHARED,  # control characters escaped in every text the tools print
    "torchalloc.log": TOOL,
    "torchalloc.log_checks": TOOL,  # records no writer produces, dropped (report, export) or refused (replay)
    "torchalloc.trace": TOOL,
    "torchalloc.trace_events": TOOL,
    "torchalloc.trace_snapshot": TOOL,
    "torchalloc.trace_log": TOOL,
    "torchalloc.replay": TOOL,
    "torchalloc.report": TOOL,
    "torchalloc.report_html": TOOL,
    "torchalloc.report_svg": TOOL,
    "torchalloc.report_data": TOOL,
    "torchalloc.report_png": TOOL,
    "torchalloc.job": TOOL,  # several logs (one per rank) analysed together
    "torchalloc.report_job": TOOL,
    "torchalloc.report_job_html": TOOL,
    "torchalloc.replay_job": TOOL,
    "torchalloc.export": TOOL,
    "torchalloc.oom_alternatives": TOOL,
    "torchalloc.compare": TOOL,
    "torchalloc.cli": TOOL,
    "torchalloc.tool_args": TOOL,
    "torchalloc._gpu_child": TOOL,  # imported by examples/ and bench/ scripts, never by the package
    "torchalloc.integrations": TOOL,  # trainer callbacks: run in training, but write the report at its end
    "torchalloc.integrations._session": TOOL,
    "torchalloc.integrations.lightning": TOOL,
    "torchalloc.integrations.huggingface": TOOL,
    "torchalloc.analysis": TOOL,
    "torchalloc.analysis.frames": TOOL,
    "torchalloc.analysis.roles": TOOL,
    "torchalloc.analysis.sites": TOOL,
    "torchalloc.analysis.events": TOOL,
    "torchalloc.analysis.blocks": TOOL,
    "torchalloc.analysis.classify": TOOL,
    "torchalloc.analysis.categorize": TOOL,
    "torchalloc.analysis.timeline": TOOL,
    "torchalloc.analysis.derived": TOOL,
    "torchalloc.analysis.anatomy": TOOL,
    "torchalloc.analysis.lifetimes": TOOL,
    "torchalloc.analysis.phase_summary": TOOL,
    "torchalloc.analysis.estimate": TOOL,
    "torchalloc.analysis.ooms": TOOL,
    "torchalloc.analysis.wording": TOOL,
    "torchalloc.analysis.result": TOOL,
}

# The analysis in the order the data flows; a stage imports only its own stage or earlier ones.
ANALYSIS_STAGES: list[tuple[str, ...]] = [
    ("frames", "roles"),  # what the names in a log mean
    ("sites",),
    ("events",),  # the decoded log as an EventTable
    ("blocks",),  # blocks and phase occurrences
    ("classify",),  # reasons
    ("categorize",),  # categories
    ("timeline",),
    ("derived",),  # the stages above, run for one device
    ("anatomy", "lifetimes", "phase_summary", "estimate", "ooms"),  # result rows
    ("wording",),
    ("result",),  # Analysis, analyze
    ("__init__",),  # re-exports
]
# The trace sources share trace_events; trace.py picks between them.
TRACE_STAGES: list[tuple[str, ...]] = [("trace_events",), ("trace_snapshot", "trace_log"), ("trace",)]

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
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
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
    assert {"numpy", "torchalloc.log", "torchalloc._records", "torchalloc.analysis.frames"} <= imports_of(
        "torchalloc.analysis.events")
    assert "torchalloc._lib" in imports_of("torchalloc.stats")  # from . import _lib
    assert "torch" in imports_of("torchalloc.plug")  # inside a function
    assert lazy_exports()["install"] == "torchalloc.plug"


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(set(MODULES) - set(LAYERS))
    assert not unplaced, f"place these modules in LAYERS of {Path(__file__).name} (runtime, shared or tool): {unplaced}"
    gone = sorted(set(LAYERS) - set(MODULES))
    assert not gone, f"LAYERS names modules that no longer exist: {gone}"
    staged = set(_stages("torchalloc.analysis.", ANALYSIS_STAGES))
    in_analysis = {m for m in MODULES if m == "torchalloc.analysis" or m.startswith("torchalloc.analysis.")}
    assert staged == in_analysis, (
        f"give every analysis module one stage in ANALYSIS_STAGES: {sorted(in_analysis ^ staged)}"
    )


def test_runtime_imports_neither_tools_nor_numpy() -> None:
    for name, layer in LAYERS.items():
        if layer != RUNTIME:
            continue
        bad = sorted(m for m in imports_of(name) if m == "numpy" or LAYERS.get(m) == TOOL)
        assert not bad, f"{name} is runtime (loaded in every training process) but imports {bad}"


def test_runtime_lazy_exports_stay_off_the_tools() -> None:
    tools = sorted(attr for attr, module in lazy_exports().items() if LAYERS[module] == TOOL)
    assert set(tools) == LAZY_TOOL_EXPORTS, (
        f"torchalloc.{{{', '.join(tools)}}} load tool modules: list each deliberate one in LAZY_TOOL_EXPORTS"
    )


def test_shared_modules_import_only_shared_ones() -> None:
    for name, layer in LAYERS.items():
        if layer != SHARED:
            continue
        bad = sorted(m for m in imports_of(name) if m == "numpy" or LAYERS.get(m) in (RUNTIME, TOOL))
        assert not bad, f"{name} is shared by runtime and tools, so plain Python, but imports {bad}"


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


def test_trace_sources_import_only_earlier_stages() -> None:
    stage_of = _stages("torchalloc.", TRACE_STAGES)
    unplaced = sorted(m for m in MODULES if m.startswith("torchalloc.trace") and m not in stage_of)
    assert not unplaced, f"give these a place in TRACE_STAGES: {unplaced}"
    _assert_flows_forward(stage_of)


def test_importing_the_runtime_leaves_numpy_and_the_tools_unloaded() -> None:
    tools = sorted(name for name, layer in LAYERS.items() if layer == TOOL)
    code = (
        "import sys\n"
        "import torchalloc, torchalloc.plug, torchalloc.stats, torchalloc.phases, torchalloc.tracking\n"
        "torchalloc.install; torchalloc.memory_stats; torchalloc.phase; torchalloc.track\n"
        f"tools = {tools!r}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'numpy' or m in tools)\n"
        "assert not loaded, f'the runtime loaded {loaded}'\n"
        "import torchalloc.log\n"  # the check can fail: a tool does load numpy
        "assert 'numpy' in sys.modules\n"
    )
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=PYTHON_DIR)
    assert done.returncode == 0, done.stderr
