"""track(): which phase is current at each point of a training step.

Needs torch but no GPU: phases live in the C library (sim backend here), so
recording torchalloc.current_phase() from inside the model, autograd and the
optimizer shows exactly what track() tags.
"""
from __future__ import annotations

import ctypes
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import torchalloc  # noqa: E402

seen: list[tuple[str, str]] = []


def record(where: str) -> None:
    seen.append((where, torchalloc.current_phase()))


class Probe(torch.autograd.Function):
    """Identity that records the phase of its forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        record("module forward")
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        record("autograd backward")  # runs on autograd's thread (or the caller's, on CPU)
        return grad


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.linear(Probe.apply(x))


class RecordingSGD(torch.optim.SGD):
    def step(self, closure: Any = None) -> Any:
        record("optimizer step")  # torch runs the step hooks around this
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        record("zero_grad")
        super().zero_grad(set_to_none)


def make() -> tuple[Model, RecordingSGD]:
    model = Model()
    return model, RecordingSGD(model.parameters(), lr=0.1)


def step(model: Model, opt: RecordingSGD) -> None:
    x = torch.randn(2, 4, requires_grad=True)
    loss = model(x).sum()
    record("loss")
    loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.fixture(autouse=True)
def clear() -> None:
    seen.clear()


def test_each_part_of_a_step_gets_its_phase(sim: ctypes.CDLL) -> None:
    model, opt = make()
    with torchalloc.phase("epoch"):
        handle = torchalloc.track(model, opt)
        step(model, opt)
        handle.remove()
    assert seen == [
        ("module forward", "forward"),
        ("loss", "epoch"),
        ("autograd backward", "backward"),
        ("optimizer step", "optimizer"),
        ("zero_grad", "zero_grad"),
    ]
    assert torchalloc.current_phase() == "default"


def test_remove_restores_everything(sim: ctypes.CDLL) -> None:
    model, opt = make()
    original_backward = torch.autograd.backward
    handle = torchalloc.track(model, opt, prefix="m.")
    assert torch.autograd.backward is not original_backward
    step(model, opt)
    assert [p for _, p in seen] == ["m.forward", "default", "m.backward", "m.optimizer", "m.zero_grad"]
    handle.remove()
    handle.remove()  # idempotent
    assert torch.autograd.backward is original_backward
    assert "zero_grad" not in vars(opt) and "zero_grad" not in vars(model)
    seen.clear()
    step(model, opt)
    assert all(p == "default" for _, p in seen)


def test_lr_scheduler_still_works_after_track(sim: ctypes.CDLL) -> None:
    model, opt = make()
    with torchalloc.track(model, opt):
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        step(model, opt)
        scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)


def test_forward_phase_ends_when_forward_raises(sim: ctypes.CDLL) -> None:
    model, opt = make()
    with torchalloc.track(model, opt):
        with pytest.raises(RuntimeError):
            model(torch.randn(2, 5))  # wrong shape
        assert torchalloc.current_phase() == "default"


def test_no_grad_forward_and_autograd_grad(sim: ctypes.CDLL) -> None:
    model, opt = make()
    with torchalloc.track(model, opt):
        with torch.no_grad():
            model(torch.randn(2, 4))
        x = torch.randn(2, 4, requires_grad=True)
        torch.autograd.grad(model(x).sum(), x)
    assert [p for _, p in seen] == ["forward", "forward", "backward"]


def test_eval_mode_forward_gets_its_own_phase_and_zero_grad_can_be_left_alone(sim: ctypes.CDLL) -> None:
    model, opt = make()
    with torchalloc.track(model, None, zero_grad=False, eval_phase="evaluation"):
        assert "zero_grad" not in vars(model)
        step(model, opt)
        model.eval()
        model(torch.randn(2, 4))
        model.train()
        model(torch.randn(2, 4))
    assert [p for _, p in seen] == ["forward", "default", "backward", "default", "default", "evaluation", "forward"]
