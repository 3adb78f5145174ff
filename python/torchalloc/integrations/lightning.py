"""PyTorch Lightning: TorchallocCallback.

    from torchalloc.integrations.lightning import TorchallocCallback

    callback = TorchallocCallback(policy="caching", log="runs/mem.talog")   # first: installs torchalloc
    trainer = L.Trainer(accelerator="gpu", devices=1, callbacks=[callback])
    trainer.fit(model, data)
    # runs/mem.report.txt and runs/mem.report.html are written when fit ends

Creating the callback installs torchalloc, so create it before anything
uses CUDA; Lightning itself starts CUDA only inside fit(), so before the
Trainer is early enough. If something came first, the error names the
line that initialised CUDA.

Phases, from Lightning's hooks in the order Lightning calls them within a
training step (automatic optimisation runs training_step, zero_grad and
backward inside the optimizer's closure, then the update):

    on_train_batch_start      -> "forward"    (training_step, loss included)
    on_before_zero_grad       -> "zero_grad"
    on_before_backward        -> "backward"
    on_after_backward         -> (backward ends)
    on_before_optimizer_step  -> "optimizer"  (gradient clipping, then the update)
    on_train_batch_end        -> (the step ends)

plus "validation" (the sanity check included), "test" and "predict" around
those loops. Markers "epoch N" at each training epoch and "step N" (the
global step) at each batch, so `torchalloc report LOG --at "step 10"` works.
Markers and the report need a log, which is on by default.
"""
from __future__ import annotations

from typing import Any

from .. import _cuda_init
from ._session import SessionCallback

try:
    import lightning.pytorch as _pl
except ImportError:
    try:
        import pytorch_lightning as _pl  # the package's older name
    except ImportError as e:
        raise ImportError(
            "torchalloc.integrations.lightning needs PyTorch Lightning: pip install lightning"
        ) from e

_cuda_init.watch()

__all__ = ["TorchallocCallback"]


class TorchallocCallback(SessionCallback, _pl.Callback):  # type: ignore[misc,name-defined]
    """Install torchalloc, tag Lightning's training step as phases, write the report after fit.

    Arguments (policy, log, stacks, report, install, any other
    TORCHALLOC_CONF key as a keyword) as SessionCallback says; `report` is
    then the report files written when fit ends.
    """

    # --- training step ---------------------------------------------------------

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.mark(f"epoch {trainer.current_epoch}")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.session.mark(f"step {trainer.global_step}")
        self.session.part("forward")

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.session.part("zero_grad")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.session.part("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.session.end_part()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.session.part("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.session.end_part()

    # --- the other loops -------------------------------------------------------

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.enter("validation")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.leave("validation")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.enter("test")

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.leave("test")

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.enter("predict")

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.leave("predict")

    # --- the end ---------------------------------------------------------------

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish("fit ended")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish(f"fit stopped: {type(exception).__name__}")
