"""torchalloc: a CUDA memory allocator for PyTorch that explains itself.

    import torchalloc
    torchalloc.install(policy="caching", patch_torch=True)   # before any CUDA use
    ...
    print(torchalloc.memory_summary())
    with torchalloc.phase("eval"):
        evaluate(model)

Attributes are loaded on first access, so `import torchalloc` is cheap,
never imports torch and never loads the C library: the analysis side
(log decoding, replay, reports) runs where neither torch nor a GPU exists.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"  # the one place: setup.py reads it from here

# public name -> (submodule, attribute in it)
_EXPORTS: dict[str, tuple[str, str]] = {
    # plug.py
    "install": ("plug", "install"),
    "installed": ("plug", "installed"),
    "pool": ("plug", "pool"),
    "configure": ("plug", "configure"),
    "patch_torch": ("plug", "patch_torch"),
    "unpatch_torch": ("plug", "unpatch_torch"),
    # stats.py: torch.cuda's names
    "memory_stats": ("stats", "memory_stats"),
    "memory_stats_as_nested_dict": ("stats", "memory_stats_as_nested_dict"),
    "memory_allocated": ("stats", "memory_allocated"),
    "max_memory_allocated": ("stats", "max_memory_allocated"),
    "memory_reserved": ("stats", "memory_reserved"),
    "max_memory_reserved": ("stats", "max_memory_reserved"),
    "reset_peak_memory_stats": ("stats", "reset_peak_memory_stats"),
    "reset_accumulated_memory_stats": ("stats", "reset_accumulated_memory_stats"),
    "reset_max_memory_allocated": ("stats", "reset_max_memory_allocated"),
    "memory_summary": ("stats", "memory_summary"),
    "empty_cache": ("stats", "empty_cache"),
    "misuse_counts": ("stats", "misuse_counts"),
    # phases.py / tracking.py
    "phase": ("phases", "phase"),
    "current_phase": ("phases", "current_phase"),
    "phase_names": ("phases", "phase_names"),
    "phase_stats": ("phases", "phase_stats"),
    "PhaseStats": ("phases", "PhaseStats"),
    "mark": ("phases", "mark"),
    "track": ("tracking", "track"),
    # oom.py
    "last_oom": ("oom", "last_oom"),
    "OomReport": ("oom", "OomReport"),
    "parse_advice": ("oom", "parse_advice"),
    # log/reader.py (a tool's): decode an event log
    "read_log": ("log.reader", "read_log"),
    # _lib.py
    "library_path": ("_lib", "library_path"),
    "last_error": ("_lib", "last_error"),
    "LibraryError": ("_lib", "LibraryError"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'torchalloc' has no attribute {name!r}") from None
    module = importlib.import_module(f".{module_name}", __name__)
    value = getattr(module, attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
