"""Python frames as the log records them, and which of them are the user's.

Takes file names and stacks (tuples of `Frame`, innermost first); gives
whether a frame is a library's, the user part of a stack, and whether a
stack passes through torch's backward, optimizers or module set-up.

A frame is *library* when its file is in torch, functorch, triton or
torchalloc (installed, or a torch source tree), in the Python standard
library, or frozen (`is_library_frame`). The *user suffix* of a stack starts
at its innermost non-library frame (the whole stack when every frame is
library): the user's line that made a block, e.g. ``y = model(x)``, rather
than a line inside torch.nn.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple


class Frame(NamedTuple):
    """One Python frame, as the log records it."""

    filename: str
    line: int
    function: str

    def short(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.line} {self.function}"

    def long(self) -> str:
        return f"{self.filename}:{self.line} in {self.function}"


Stack = tuple[Frame, ...]

# The torchalloc package itself (this file is torchalloc/analysis/rules/frames.py), and its modules by their path
# below the package: a log recorded with torchalloc at another place (a source tree, another machine) names
# them under that place, and they are still torchalloc's, not the user's.
_PACKAGE = Path(__file__).resolve().parents[2]
_PACKAGE_DIR = str(_PACKAGE).replace("\\", "/") + "/"
_OWN_MODULES = frozenset(p.relative_to(_PACKAGE).as_posix() for p in _PACKAGE.rglob("*.py"))
_LIBRARY_PACKAGES = r"(?:torch|torchalloc|functorch|triton|torchgen)"
_INSTALLED_RE = re.compile(r"/(?:site|dist)-packages/" + _LIBRARY_PACKAGES + r"(?:/|\.py$)")
# A torch source tree (pip install -e): its well-known subpackages and modules.
_TORCH_TREE_RE = re.compile(
    r"/torch/(?:nn|autograd|optim|utils|cuda|amp|distributed|fx|_dynamo|_inductor|_functorch|_prims|_refs|"
    r"_decomp|_higher_order_ops|_library|_subclasses|testing|jit|func|_tensor\.py|functional\.py|"
    r"overrides\.py|_ops\.py|serialization\.py|random\.py|__init__\.py|_jit_internal\.py)"
)
_STDLIB_RE = re.compile(r"/lib/python3\.\d+/[^/]+(?:\.py|/)")


def is_library_frame(filename: str) -> bool:
    """Whether a frame belongs to torch & co., torchalloc, the stdlib or frozen modules (not the user's)."""
    f = filename.replace("\\", "/")
    if f.startswith("<frozen") or f.startswith(_PACKAGE_DIR):
        return True
    own = f.rfind("/torchalloc/")
    if own >= 0 and f[own + len("/torchalloc/"):] in _OWN_MODULES:
        return True
    if _INSTALLED_RE.search(f) or _TORCH_TREE_RE.search(f):
        return True
    return bool(_STDLIB_RE.search(f)) and "-packages/" not in f


def user_suffix(stack: Stack) -> Stack:
    """The stack from its innermost user frame outward (the whole stack if none is the user's)."""
    for i, frame in enumerate(stack):
        if not is_library_frame(frame.filename):
            return stack[i:]
    return stack


# Frames that say what a stack was doing, matched against "file::function".
BACKWARD_FRAME = re.compile(
    r"(?:/torch/_tensor\.py::backward|/torch/autograd/[^:]*::(?:backward|grad|_engine_run_backward))$"
)
OPTIMIZER_FRAME = re.compile(r"/torch/optim/")
NN_INIT_FRAME = re.compile(
    r"/torch/nn/(?:modules/module\.py::(?:_apply|to|cuda|_load_from_state_dict|load_state_dict|register_\w+)"
    r"|init\.py::|parameter\.py::|modules/[^:]*::(?:__init__|reset_parameters))"
)


def has_frame(stack: Stack, pattern: re.Pattern[str]) -> bool:
    """Whether any frame of `stack`, as "file::function", matches `pattern`."""
    return any(pattern.search(f"{f.filename.replace(chr(92), '/')}::{f.function}") for f in stack)
