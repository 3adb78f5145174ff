"""The `torchalloc` command line: dispatch.py dispatches, one module per subcommand."""
from __future__ import annotations

from .dispatch import main

__all__ = ["main"]
