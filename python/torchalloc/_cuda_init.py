"""Who initialised CUDA: remembered so that a late install() can say so.

torchalloc must become PyTorch's allocator before CUDA is initialised, and
the usual failure is that something else got there first: a `.cuda()` in
the user's script, `transformers.TrainingArguments` choosing its device,
a library touching the GPU at import. "CUDA is already initialised" alone
leaves the user searching, so watch() wraps torch.cuda._lazy_init, the
function every lazy CUDA start in PyTorch goes through (Python code calls
it as a module global and the C++ side looks it up by name, so replacing
the module attribute sees both), and records the Python stack of the first
call. The trainer integrations call watch() when they are imported, which
is before the user's script builds anything.
"""
from __future__ import annotations

import os
import sys
import traceback
from typing import Any

_first_init: list[str] | None = None  # frames of the first lazy CUDA init seen, outermost first
_WRAPPED = "__torchalloc_watch__"


def _frames_outside_torch() -> list[str]:
    """The current stack, outermost first, without the frames of torch and of this module."""
    torch_dir = os.path.dirname(sys.modules["torch"].__file__ or "")
    here = os.path.abspath(__file__)
    frames = []
    for f in traceback.extract_stack()[:-2]:
        path = os.path.abspath(f.filename)
        if path == here or (torch_dir and path.startswith(torch_dir + os.sep)):
            continue
        frames.append(f"{f.filename}:{f.lineno} in {f.name}")
    return frames


def watch() -> None:
    """Start remembering where CUDA gets initialised (idempotent; nothing to do once it is)."""
    import torch.cuda

    cuda: Any = torch.cuda
    if cuda.is_initialized() or getattr(cuda._lazy_init, _WRAPPED, False):
        return
    original = cuda._lazy_init

    def _lazy_init() -> None:
        global _first_init
        if _first_init is None and not cuda.is_initialized():
            try:
                _first_init = _frames_outside_torch()
            except Exception:  # never let bookkeeping break CUDA start-up
                _first_init = []
        original()

    setattr(_lazy_init, _WRAPPED, True)
    cuda._lazy_init = _lazy_init


def first_init_site(frames: int = 4) -> str | None:
    """Where CUDA was first initialised since watch(), as the innermost `frames` frames
    outside torch (innermost last), or None when not seen."""
    if not _first_init:
        return None
    return "\n".join("    " + f for f in _first_init[-frames:])
