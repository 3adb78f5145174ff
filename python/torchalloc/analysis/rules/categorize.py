"""What each block was for: parameters, gradients, optimizer state, activations, workspaces...

Holds `Category`, in the terms of the usual estimate params + optimizer
state + max(grads + optimizer intermediates, activations), and the rules
below that give a block one. blocks.py applies them
(`BlockRules.categories`), to each block at its alloc: what they need of
its future (whether it is ever freed, freed during backward, freed within
the phase occurrence that made it; whether its thread's allocation before
or after it has the same stack) the first pass has found already
(passes/first.py's `BIT_*`).

The evidence, strongest first: torch frames in the allocation stack
(``torch.nn`` initialisation, ``torch.optim``), the role of the phase that
made the block (roles.py), whether it was made or freed during backward,
whether it outlived the phase occurrence that made it, and sizes (cuBLAS
workspaces). Without stacks, what was allocated before the first
forward/backward/optimizer phase stands for the parameters; without phases
either, only backward (from stacks) and lifetimes are left to go by.
"""
from __future__ import annotations

import enum
import os
import re




class Category(str, enum.Enum):
    """What a block was for, in the terms of the usual memory estimate."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer state"
    OPTIMIZER_INTERMEDIATES = "optimizer intermediates"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    BACKWARD_TEMPORARIES = "backward temporaries"
    WORKSPACE = "library workspace"
    BEFORE_LOG = "allocated before the log began"
    OTHER_PERSISTENT = "other persistent (inputs, caches...)"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


CATEGORIES: tuple[Category, ...] = tuple(Category)
CATEGORY_CODE = {c: i for i, c in enumerate(CATEGORIES)}  # Category -> its code: a block's category is kept as one


# cuBLAS workspaces torch allocates through the current allocator, per
# (handle, stream), at the first matmul of each thread, never freed:
# 4096 KiB x 8 on sm_90/sm_100, else 4096 KiB x 2 + 16 KiB x 8.
# CUBLAS_WORKSPACE_CONFIG changes them. (Smaller round sizes such as 1 or
# 4 MiB are left out on purpose: too many tensors have them.)
WORKSPACE_SIZES = frozenset({4096 * 1024 * 8, 4096 * 1024 * 2 + 16 * 1024 * 8})


def _workspace_sizes() -> frozenset[int]:
    """The known workspace sizes plus the one $CUBLAS_WORKSPACE_CONFIG (":KIB:COUNT...") gives."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    nums = [int(n) for n in re.findall(r"\d+", config)]
    extra = sum(nums[i] * 1024 * nums[i + 1] for i in range(0, len(nums) - 1, 2))
    return WORKSPACE_SIZES | ({extra} if extra else set())


