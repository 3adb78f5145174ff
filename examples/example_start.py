"""What every example does first: choose the torchalloc it imports, and say so when it cannot run here.

Run from a clone, an example imports the source tree's python/torchalloc when
the tree has a built library (where torchalloc._lib looks in a checkout:
build/ or build-py/, or next to the package; or $TORCHALLOC_LIB names one),
else the installed package: after `pip install .` the examples run without
cmake having been run by hand. With neither, the source tree's, whose error
says how to build the library.

An example that cannot run here (no torch, no CUDA GPU) prints
"SKIP: <reason>" and exits CANNOT_RUN: not 0, so that a script or CI that
runs it does not take it for a run that passed; 77 is what automake and
meson read as "skipped".
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "python"
LIB_NAME = "libtorchalloc.so"  # torchalloc._lib.LIB_NAME: the package cannot be imported before the choice
CANNOT_RUN = 77


def source_tree_has_a_library() -> bool:
    """Whether the source tree's package would find a library (the places torchalloc._lib looks in a checkout)."""
    if os.environ.get("TORCHALLOC_LIB"):
        return True
    places = (REPO / "build", REPO / "build-py", SOURCE / "torchalloc")
    return any((place / LIB_NAME).is_file() for place in places)


def choose_torchalloc() -> str:
    """Put the source tree first on sys.path unless only the installed package has a library. Returns which."""
    installed = importlib.util.find_spec("torchalloc") is not None
    if installed and not source_tree_has_a_library():
        return "installed"
    if str(SOURCE) not in sys.path:
        sys.path.insert(0, str(SOURCE))
    return "source"


def cannot_run(reason: str) -> NoReturn:
    """Say why this example cannot run on this machine, and exit non-zero (CANNOT_RUN)."""
    print(f"SKIP: {reason}", flush=True)
    sys.exit(CANNOT_RUN)


def default_library() -> Path:
    """The library the chosen torchalloc loads (for scripts that hand --lib to child processes), or where to build
    one when there is none: the path then does not exist and the script's check says how to build it."""
    from torchalloc import _lib

    try:
        return _lib.find_library()
    except _lib.LibraryError:
        return REPO / "build" / LIB_NAME
