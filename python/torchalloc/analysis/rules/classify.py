"""Why each block was freed when it was: the reasons, their rules, and the stack rules for one pair of stacks.

Holds `Reason`, the rules below, and `classify_stacks` (rule 3 for one
alloc/free stack pair). The analysis applies them block by block as it
reads the log: the first pass finds backward (passes/first.py,
first_state.Backward) and notes per block what only its end tells
(`BIT_*`: freed during backward, by autograd, within its phase
occurrence); the second gives each block its allocation site and, as it
ends, its reason, free site and returning function (passes/second.py, with
blocks.BlockRules). Stacks are optional: without them the rules
fall back to phases (rule 4), and without phases as well every block still
gets a reason.

Why a block was freed (`Reason`), in this order of precedence
-------------------------------------------------------------
Let A be the user suffix (frames.py) of the allocation stack and F that of
the free stack.

1. persistent -- never freed by the end of the log, or living through the
   whole run whatever its phase: allocated before the first phase
   occurrence began and freed after the last one ended, as parameters
   freed at teardown are (a log without phases has no such boundary). Sub-labelled by its category
   (parameters, gradients, optimizer state, library workspace...). A freed block that lived through
   the whole run is called persistent only where its reason would otherwise be "other" or
   phase-based (rule 4): saved for backward, temporary, freed when its function returned and freed
   on rebinding say better why it was freed.
2. saved for backward -- allocated outside backward and freed during
   backward. "During backward" means a phase whose name says backward
   (``torchalloc.phase("backward")``, see roles.py), or (also outside such
   phases: a warm-up step) a free on a thread without Python frames
   (autograd's engine) while a Python thread is inside ``Tensor.backward``/
   ``torch.autograd.backward`` (seen as records whose stacks hold those
   frames).
3. Stack rules (both stacks recorded):

   - temporary -- F == A: freed by the same line, in the same chain of
     calls, that made it (``x + 1`` whose result is dropped; the
     intermediate of ``(x + 1) * 2``; a whole no_grad forward's activations
     seen from the ``model(x)`` line). Invisible to before/after
     measurements of that line, but part of its peak.
   - freed when its function returned -- F is a proper outer suffix of A:
     F == A[k:] for some k >= 1. CPython unlinks a returning frame before it
     clears its locals, so a local freed at return is freed with the
     *caller* as the current frame, at the line that made the call. The
     report names the returning user function (the outermost user frame in
     A[:k]) and the caller's line (F[0]).
   - freed on rebinding -- A and F share their outer frames up to one frame
     of the same function (same file and function name) at a different
     line, and that frame is F's innermost: the name holding the block was
     assigned again (or deleted) at that later line (``x = x + 1`` at top
     level frees the old ``x`` on that line). A block returned from a
     deeper call and dropped later by its caller counts here too.
   - other -- anything else (freed inside a call it was passed to, freed on
     another thread, freed from a different call path); the free site is
     shown.

4. Without stacks (logged without ``stacks:1``), rules 1 and 2 still apply;
   the rest falls back to phases: "freed within its phase" (the same
   occurrence of the phase that allocated it) or "freed in a later phase".
   Without phases too, "within its phase" means within the default phase.
   The report says that stacks were missing.

The same line run again in a loop (``for ...: x = x + 1`` where the loop
header allocates nothing) frees the previous value on the very line that
made it, and reads as temporary: stacks carry lines, not iterations.
A block whose F equals A but where another line of the same function
allocated between its alloc and its free is therefore called "freed on
rebinding" (the line ran again later), not temporary.
"""
from __future__ import annotations

import dataclasses
import enum


from .frames import Frame, Stack, is_library_frame, user_suffix


class Reason(str, enum.Enum):
    """Why a block was freed when it was (see the module docstring)."""

    TEMPORARY = "temporary"
    FUNCTION_RETURNED = "freed when its function returned"
    REBINDING = "freed on rebinding"
    SAVED_FOR_BACKWARD = "saved for backward"
    PERSISTENT = "persistent"
    SAME_PHASE = "freed within its phase"  # no stacks: fallback
    LATER_PHASE = "freed in a later phase"  # no stacks: fallback
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


REASONS: tuple[Reason, ...] = tuple(Reason)
REASON_CODE = {r: i for i, r in enumerate(REASONS)}  # Reason -> its code: the number a block's reason is kept as


# ---------------------------------------------------------------------------
# The stack rules (rule 3) for one pair of stacks
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StackVerdict:
    """The stack rule's answer for one (alloc stack, free stack) pair."""

    reason: Reason
    site: Frame | None  # where it was allocated (user frame)
    free_site: Frame | None  # where it was freed (user frame), None when no Python
    returned: str | None = None  # the function whose return freed it
    same_frame_line: bool = False  # temporary candidate: F == A


def classify_stacks(alloc: Stack, free: Stack) -> StackVerdict:
    """Apply the stack rules (module docstring, rule 3) to one alloc/free stack pair."""
    a, f = user_suffix(alloc), user_suffix(free)
    site = a[0] if a else None
    if not a or not f:
        return StackVerdict(Reason.OTHER, site, f[0] if f else None)
    if a == f:
        return StackVerdict(Reason.TEMPORARY, site, f[0], same_frame_line=True)
    if len(f) < len(a) and a[len(a) - len(f):] == f:
        inner = a[: len(a) - len(f)]
        users = [fr for fr in inner if not is_library_frame(fr.filename)]
        returned = (users[-1] if users else inner[-1]).function
        return StackVerdict(Reason.FUNCTION_RETURNED, site, f[0], returned=returned)
    common = 0
    while common < min(len(a), len(f)) and a[-1 - common] == f[-1 - common]:
        common += 1
    if common < len(a) and common < len(f):
        xa, xf = a[len(a) - common - 1], f[len(f) - common - 1]
        if (xa.filename, xa.function) == (xf.filename, xf.function) and len(f) == common + 1:
            returned = None
            if len(a) > common + 1:  # it was made deeper and returned to xa's frame
                users = [fr for fr in a[: len(a) - common - 1] if not is_library_frame(fr.filename)]
                returned = (users[-1] if users else a[len(a) - common - 2]).function
            return StackVerdict(Reason.REBINDING, site, xf, returned=returned)
    return StackVerdict(Reason.OTHER, site, f[0])


