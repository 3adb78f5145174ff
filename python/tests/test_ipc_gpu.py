"""CUDA IPC under torchalloc on a real GPU: a tensor sent through torch.multiprocessing (ipc_child.py),
two processes on one GPU, torchalloc at either end or both, with mapped memory (the default) or ordinary
segments, and PyTorch's allocator at the other end. torchalloc speaks PyTorch's own wire format, so every
pairing opens the same memory; the sender keeps it while the receiver holds it (PyTorch's reference
counts), and torch.cuda.ipc_collect() frees it once the receiver let go. A block on runs of the warm-up
(the default's `run`), which PyTorch's format cannot carry, is sent too: the sender remaps its runs a granule
a handle first.

Skipped without torch or a CUDA GPU. The plain route cannot share at all (PyTorch's plain pluggable
allocator refuses CUDA IPC), so every torchalloc end here is the bridge.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_child import child_env

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

CHILD = Path(__file__).resolve().parent / "ipc_child.py"
PAIRS = [("torchalloc", "torchalloc"), ("torchalloc-off", "torchalloc"), ("torchalloc", "native"),
         ("torchalloc", "native-expandable"), ("torchalloc-off", "native"), ("native", "torchalloc"),
         ("native-expandable", "torchalloc"), ("torchalloc-run", "native"), ("torchalloc-run", "torchalloc")]


@pytest.mark.parametrize("sender,receiver", PAIRS)
def test_a_tensor_sent_to_another_process(library_path: Path, sender: str, receiver: str) -> None:
    done = subprocess.run([sys.executable, str(CHILD), sender, receiver], capture_output=True, text=True,
                          env=child_env(library_path), timeout=420, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    r = json.loads(lines[-1][7:])
    assert r["tag"] == "closed", f"the receiver failed: {r['detail']}\n{done.stderr[-3000:]}"
    n = r["n"]
    if sender.endswith("-run"):  # the sent block lay on runs, remapped a granule a handle before it went
        assert r["handles_made_by_send"] > 0, "the sent block lay on no run: nothing here tested runs"
    assert r["first"] == r["expected"], "the receiver read other memory than the sender wrote"
    assert r["sender_sees"] == r["expected"] + n, "the receiver's write did not reach the sender's memory"
    assert not r["reused_while_open"], "the sender handed out memory a receiver still held"
    assert r["again"] == r["expected"] + n, "the receiver's memory changed after the sender let go of it"
    assert r["freed_after_close"] >= 4 * n, "ipc_collect did not free the sent block once the receiver closed it"
    assert r["receiver_exit"] == 0
