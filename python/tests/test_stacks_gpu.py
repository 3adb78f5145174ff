"""Python source lines in the block log, on a real GPU (issue: block log).

For ``def f(x): x = x + 1; return x.sum()`` the ``x + 1`` block is freed when
f returns, by CPython clearing f's locals: the free must be attributed to the
caller's line (f's frame is already gone), and its allocation to the line
inside f. Skipped without torch or a CUDA GPU; runs in a fresh process
because install() must precede CUDA initialisation.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from torchalloc.log.reader import KIND_IDS, read_log

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

from gpu_child import run_logged_script  # noqa: E402


SCRIPT = textwrap.dedent(
    """\
    import sys
    import torch, torchalloc
    torchalloc.install(policy="caching", log=sys.argv[1], stacks=True)

    def f(x):
        x = x + 1
        return x.sum()

    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    torchalloc.mark("call")
    y = f(x)
    torchalloc.mark("returned")
    torch.cuda.synchronize()
    print("ok", float(y))
    """
)

def line_of(text: str) -> int:
    """1-based line of `text` in SCRIPT (counted, not hand-written)."""
    return SCRIPT.splitlines().index(text) + 1


ALLOC_LINE = line_of("    x = x + 1")
CALL_LINE = line_of("y = f(x)")


def test_free_of_a_local_is_attributed_to_the_callers_line(library_path: Path, tmp_path: Path) -> None:
    log_path = run_logged_script(SCRIPT, library_path, tmp_path)

    log = read_log(log_path)
    markers = log.of_kind("marker")
    labels = [log.label(m) for m in markers]
    assert labels[:2] == ["call", "returned"], labels
    lo, hi = int(markers[0]["seq"]), int(markers[1]["seq"])
    window = log.records[(log.records["seq"] > lo) & (log.records["seq"] < hi)]
    allocs = window[window["kind"] == KIND_IDS["alloc"]]
    frees = window[window["kind"] == KIND_IDS["free"]]

    # The x + 1 block: 4 MiB allocated inside the window and freed inside it.
    big = [a for a in allocs if int(a["size"]) == 4 << 20]
    assert big, "no 4 MiB allocation between the markers"
    block = big[0]
    freed = [r for r in frees if int(r["addr"]) == int(block["addr"])]
    assert freed, "the x + 1 block was not freed before f's caller went on"

    def where(stack_id: int) -> tuple[str, int, str]:
        frames = log.stack(stack_id)
        assert frames, f"stack {stack_id} is empty: stacks:1 did not capture Python frames"
        inner = frames[0]
        return Path(inner.filename).name, inner.line, inner.function

    assert where(int(block["stack"])) == ("script.py", ALLOC_LINE, "f")
    assert where(int(freed[0]["stack"])) == ("script.py", CALL_LINE, "<module>")
