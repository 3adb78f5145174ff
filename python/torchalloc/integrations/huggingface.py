"""Hugging Face Trainer: TorchallocCallback (a transformers.TrainerCallback).

    from torchalloc.integrations.huggingface import TorchallocCallback

    callback = TorchallocCallback(policy="caching", log="runs/mem.talog")   # first: installs torchalloc
    args = TrainingArguments(...)              # may start CUDA: create the callback before it
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    # runs/mem.report.txt and runs/mem.report.html are written when training ends

Creating the callback installs torchalloc, so create it before anything
uses CUDA: TrainingArguments picks its device when it is built, which
starts CUDA. If something came first, the error names the line.

Phases. The Trainer has no hooks around forward and backward, so those
come from torchalloc.track(model) (hooks on the model, a wrapper around
torch.autograd.backward), installed at on_train_begin; the rest from the
Trainer's hooks:

    forward (model in train mode)   -> "forward"
    forward (model in eval mode)    -> "evaluation"  (Trainer.evaluate, generation)
    loss.backward()                 -> "backward"
    on_pre_optimizer_step           -> "optimizer"   (the update)
    on_optimizer_step               -> "zero_grad"   (scheduler step and model.zero_grad)
    on_step_end / on_substep_end    -> (the step ends)

Markers "epoch N" and "step N" (the global step, once per optimizer step
even with gradient accumulation). The report is written at on_train_end.

accelerate without the Trainer: call torchalloc.install(...) before
creating the Accelerator (it picks the device, which starts CUDA), then
torchalloc.track(model, optimizer) after accelerator.prepare(...).
"""
from __future__ import annotations

from typing import Any

from .. import _cuda_init
from ..tracking import TrackHandle, track
from ._session import SessionCallback

try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError as e:
    raise ImportError("torchalloc.integrations.huggingface needs transformers: pip install transformers") from e

_cuda_init.watch()

__all__ = ["TorchallocCallback"]


class TorchallocCallback(SessionCallback, _TrainerCallback):  # type: ignore[misc]
    """Install torchalloc, tag the Trainer's steps as phases, write the report after train().

    Arguments (policy, log, stacks, report, install, any other
    TORCHALLOC_CONF key as a keyword) as SessionCallback says; `report` is
    then the report files written at the end of train().
    """

    # Per-instance state, assigned on first change (immutable defaults, so class attributes serve).
    _tracked: TrackHandle | None = None
    _marked_step = -1
    _epoch = 0

    def _untrack(self) -> None:
        if self._tracked is not None:
            self._tracked.remove()
            self._tracked = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._untrack()
        if self.session.active and model is not None:
            self._tracked = track(model, None, zero_grad=False, eval_phase="evaluation")

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.mark(f"epoch {self._epoch}")
        self._epoch += 1

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.end_part()
        if state.global_step != self._marked_step:
            self._marked_step = state.global_step
            self.session.mark(f"step {state.global_step}")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.part("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.part("zero_grad")

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.end_part()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.end_part()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._untrack()
        self.session.finish("training ended")
