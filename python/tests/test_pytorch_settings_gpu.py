"""PyTorch's allocator settings under torchalloc on a real GPU: roundup_power2_divisions, a freed block's
requested size in a snapshot, and graph_capture_record_stream_reuse inside a capture of two streams.

Skipped without torch or without a CUDA GPU; each scenario runs in a fresh process (install() must come
before CUDA starts).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_child import run_child

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():  # asks the driver; does not initialise CUDA here
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


def test_roundup_power2_divisions_from_pytorchs_settings_rounds_as_pytorch_does(library_path: Path) -> None:
    script = """
        import torch
        {install}
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
        x = torch.empty(1200 * 1024 * 1024 // 4 + 1, device="cuda")  # just over 1200 MiB
        torch.cuda.synchronize()
        blocks = [b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"] if b["state"] == "active_allocated"]
        emit(allocated=torch.cuda.memory_allocated(), blocks=blocks)
        """
    ours = run_child(script.format(install="import torchalloc; torchalloc.install()"), library_path)
    native = run_child(script.format(install=""), library_path)
    # 1200 MiB + 4 B with 4 divisions between 1024 and 2048 MiB: the next step, 1280 MiB, under both.
    assert native["allocated"] == 1280 << 20
    assert ours["allocated"] == native["allocated"]


def test_a_freed_blocks_requested_size_stays_in_the_snapshot(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torchalloc.install(expandable="off")
        keep = torch.empty(1000, device="cuda")
        gone = torch.empty(3000, device="cuda")
        del gone
        torch.cuda.synchronize()
        inactive = [b for s in torch.cuda.memory_snapshot() for b in s["blocks"] if b["state"] == "inactive"]
        emit(requested=[b.get("requested_size") for b in inactive])
        """,
        library_path,
    )
    assert 12000 in r["requested"], r


def test_record_stream_reuse_inside_a_capture_waits_for_the_join(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torchalloc.install()
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            g.capture_begin()
            sink = torch.empty(1024, device="cuda")
            data = torch.empty(1024, device="cuda")
            data.add_(1)
            ptr = data.data_ptr()
            s2.wait_stream(s1)
            with torch.cuda.stream(s2):
                copy = data * 2
                data.record_stream(s2)
            del data
            before_join = torch.empty(1024, device="cuda")
            s1.wait_stream(s2)
            sink.fill_(1)
            after_join = torch.empty(1024, device="cuda")
            g.capture_end()
        g.replay()
        torch.cuda.synchronize()
        emit(before=before_join.data_ptr() == ptr, after=after_join.data_ptr() == ptr)
        """,
        library_path,
    )
    assert r["before"] is False  # s2 may still read it: never reused before the join
    assert r["after"] is True  # the streams joined: reused inside the capture, as PyTorch does
