"""What each block was for: parameters, gradients, optimizer state, activations, workspaces...

Takes the event table, the blocks, the phase occurrences and the reasons
(classify.py); gives `Classified`: the reasons plus each block's `Category`,
in the terms of the usual estimate params + optimizer state +
max(grads + optimizer intermediates, activations).

The evidence, strongest first: torch frames in the allocation stack
(``torch.nn`` initialisation, ``torch.optim``), the role of the phase that
made the block (roles.py), whether it was made or freed during backward,
whether it outlived the phase occurrence that made it, and sizes (cuBLAS
workspaces). Without stacks, what was allocated before the first
forward/backward/optimizer phase stands for the parameters; without phases
either, only backward (from stacks) and lifetimes are left to go by.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import re

import numpy as np

from .blocks import NEVER, Blocks, Occurrences
from .classify import REASON_CODE, Reason, Reasons
from .events import EventTable
from .frames import NN_INIT_FRAME, OPTIMIZER_FRAME, has_frame
from .roles import phase_role


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
CATEGORY_CODE = {c: i for i, c in enumerate(CATEGORIES)}  # Category -> its code in Classified.category


@dataclasses.dataclass
class Classified(Reasons):
    """Per block: everything classify found, and the category code (index into CATEGORIES)."""

    category: np.ndarray


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


def categorize(t: EventTable, blocks: Blocks, occ: Occurrences, reasons: Reasons) -> Classified:
    """The reasons with a category per block: what it was for, from phases, stacks and sizes."""
    C = CATEGORY_CODE
    nb = len(blocks)
    alloc_bw, free_bw = reasons.alloc_in_backward, reasons.free_in_backward
    cat = np.full(nb, C[Category.OTHER], dtype=np.int8)
    roles = {p: phase_role(name) for p, name in t.phase_names.items()}
    role_of = (np.array([roles.get(int(p)) or "" for p in blocks.alloc_phase.tolist()], dtype=object) if nb
               else np.zeros(0, dtype=object))
    before = blocks.alloc_i < 0
    persistent = blocks.persistent

    def stack_flag(pattern: re.Pattern[str]) -> np.ndarray:
        uniq, inv = np.unique(blocks.alloc_stack, return_inverse=True)
        flags = np.array([has_frame(t.stack_of(s), pattern) for s in uniq.tolist()], dtype=bool)
        return flags[inv.reshape(-1)] if nb else np.zeros(0, dtype=bool)

    nn_init = stack_flag(NN_INIT_FRAME)
    optim = (role_of == "optimizer") | stack_flag(OPTIMIZER_FRAME)
    setup = role_of == "setup"
    # before anything ran: allocated before the first forward/backward/optimizer phase began
    active = np.isin(occ.phase, [p for p, r in roles.items() if r in ("forward", "backward", "optimizer")])
    first_active = occ.begin_i[active].min() if active.any() else None
    early = (blocks.alloc_i < first_active) if first_active is not None else np.zeros(nb, dtype=bool)
    ws = np.isin(blocks.block_size, list(_workspace_sizes())) | np.isin(blocks.size, list(_workspace_sizes()))
    within_occ = blocks.free_i < occ.end_of(reasons.alloc_occ, none=NEVER)

    # without stacks, what was allocated before the first forward/backward/optimizer phase
    # stands for the parameters; with stacks, torch.nn frames say so
    early_guess = early if not reasons.has_stacks else np.zeros(nb, dtype=bool)
    params = nn_init | ((setup | early_guess) & ~optim)
    # A library workspace is allocated inside an op, next to that op's own output: an
    # adjacent allocation of the same thread carries the same stack (a 32 MiB tensor made
    # on its own line does not), and its size is no parameter's (a .grad would match one).
    by_thread = np.argsort(blocks.alloc_tid, kind="stable")  # blocks are in alloc order already
    same = np.zeros(nb, dtype=bool)
    if nb > 1:
        tid_s, stack_s = blocks.alloc_tid[by_thread], blocks.alloc_stack[by_thread]
        pair = (tid_s[1:] == tid_s[:-1]) & (stack_s[1:] == stack_s[:-1])
        same[by_thread[1:][pair]] = True
        same[by_thread[:-1][pair]] = True
    param_sizes = np.unique(blocks.block_size[params & persistent])
    ws &= same & ~(alloc_bw & np.isin(blocks.block_size, param_sizes))
    # persistent blocks
    p = persistent & ~before
    cat[p] = C[Category.OTHER_PERSISTENT]
    cat[p & params] = C[Category.PARAMETERS]
    cat[p & ~params & alloc_bw] = C[Category.GRADIENTS]
    cat[p & ~params & optim] = C[Category.OPTIMIZER_STATE]
    cat[p & ~params & ~optim & ws & ~setup] = C[Category.WORKSPACE]
    # freed blocks
    f = ~persistent & ~before
    cat[f] = C[Category.TEMPORARIES]
    cat[f & alloc_bw] = C[Category.BACKWARD_TEMPORARIES]
    cat[f & alloc_bw & ~free_bw] = C[Category.GRADIENTS]  # outlived backward: .grad, freed by zero_grad
    cat[f & optim] = np.where(within_occ[f & optim], C[Category.OPTIMIZER_INTERMEDIATES], C[Category.OPTIMIZER_STATE])
    cat[f & (reasons.reason == REASON_CODE[Reason.SAVED_FOR_BACKWARD])] = C[Category.ACTIVATIONS]
    cat[f & params & ~alloc_bw & ~optim] = C[Category.PARAMETERS]
    cat[before] = C[Category.BEFORE_LOG]
    found = {field.name: getattr(reasons, field.name) for field in dataclasses.fields(reasons)}
    return Classified(**found, category=cat)
