"""Phase roles: what a phase's name says the phase is.

Takes a phase name (the user's choice: ``torchalloc.phase("fwd")``); gives
"forward", "backward", "optimizer", "setup" or None.

Phase names are the user's. A name is taken as forward-like when it matches
``forward|fwd``, backward-like for ``backward|bwd``, optimizer-like for
``optim|adam|sgd|step|update`` and setup-like for
``init|setup|load|model|build|param|create`` (case-insensitive). Roles drive
"saved for backward" (classify), the categories (categorize) and the phase
sentences (sections/phases.py); a log without phases still gets every stack-based answer.
"""
from __future__ import annotations

import re

PHASE_IDS = 1 << 16  # phase ids: the log's phase field is a u16

# First match wins: "backward_step" is backward, not optimizer.
_ROLE_PATTERNS = (
    ("backward", re.compile(r"backward|bwd", re.I)),
    ("forward", re.compile(r"forward|fwd", re.I)),
    ("optimizer", re.compile(r"optim|adam|sgd|(?:^|[_\W])step(?:$|[_\W])|update", re.I)),
    ("setup", re.compile(r"init|setup|load|model|build|param|create", re.I)),
)


def phase_role(name: str) -> str | None:
    """"forward", "backward", "optimizer", "setup" or None, from a phase's name."""
    for role, pattern in _ROLE_PATTERNS:
        if pattern.search(name):
            return role
    return None
