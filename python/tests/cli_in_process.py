"""The torchalloc CLI run in this process, with its output captured: for the tests that check what a verb
prints and returns without paying for a subprocess each time."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout


def cli(*args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `torchalloc ARGS...`; a SystemExit (argparse-style failures of a
    subcommand) becomes its status."""
    from torchalloc.cli import dispatch

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status = dispatch.main(list(args))
        except SystemExit as e:
            status = int(e.code or 0)
    return status, out.getvalue(), err.getvalue()
