"""track(model)'s module records: which module is current through a training step.

Needs torch but no GPU: the records are written by hooks whatever the
tensors' device (CPU here, the sim backend's log), so the sequence of
MODULE records in the log shows exactly what track() makes current.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import torchalloc  # noqa: E402
from torchalloc import _lib  # noqa: E402
from torchalloc.log import read_log  # noqa: E402


class Scale(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(width))

    def forward(self, x: Any) -> Any:
        return x * self.w


def _modules_in_log(path: Path) -> tuple[list[str], dict[int, str]]:
    log = read_log(path)
    names = {int(r["size"]): log.label(r) for r in log.of_kind("module_name")}
    return [names.get(int(r["size"]), "-") if int(r["size"]) else "-" for r in log.of_kind("module")], names


def test_forward_and_backward_make_the_running_module_current(sim: ctypes.CDLL, tmp_path: Path) -> None:
    if not _lib.has("torchalloc_module_set"):
        pytest.skip("this libtorchalloc has no module records")
    _lib.teardown()
    path = tmp_path / "track.talog"
    _lib.init(f"backend:sim,sim_capacity:64MiB,warn:0,log:{path}")
    try:
        model = torch.nn.Sequential(Scale(8), Scale(8), Scale(8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torchalloc.track(model, opt):
            loss = model(torch.randn(4, 8)).sum()
            loss.backward()
            opt.step()
    finally:
        _lib.teardown()
    sequence, names = _modules_in_log(path)
    assert sorted(names.values()) == ["model", "model.0", "model.1", "model.2"]
    forward = ["model", "model.0", "model", "model.1", "model", "model.2", "model", "-"]
    backward = ["model.2", "model.1", "model.0", "-"]  # the innermost module claims its output's node
    assert sequence[:len(forward) + len(backward)] == forward + backward, sequence
    assert sequence[-1] == "-"  # remove() leaves no module current


def test_modules_false_writes_no_module_records(sim: ctypes.CDLL, tmp_path: Path) -> None:
    if not _lib.has("torchalloc_module_set"):
        pytest.skip("this libtorchalloc has no module records")
    _lib.teardown()
    path = tmp_path / "plain.talog"
    _lib.init(f"backend:sim,sim_capacity:64MiB,warn:0,log:{path}")
    try:
        model = torch.nn.Sequential(Scale(8))
        with torchalloc.track(model, modules=False):
            model(torch.randn(2, 8)).sum().backward()
    finally:
        _lib.teardown()
    assert _modules_in_log(path) == ([], {})


def test_an_inplace_module_still_trains(sim: ctypes.CDLL) -> None:
    """Node hooks leave the graph alone: ReLU(inplace=True) after a Linear works (full backward hooks fail here)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 1))
    with torchalloc.track(model):
        model(torch.randn(3, 4)).sum().backward()
    assert model[0].weight.grad is not None
