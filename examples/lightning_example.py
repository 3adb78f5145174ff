#!/usr/bin/env python3
"""PyTorch Lightning with torchalloc: one callback, phases from Lightning's hooks, a report after fit.

    python3 examples/lightning_example.py [--log runs/lightning.talog] [--policy caching] [--epochs 2]

Trains a small convolutional classifier on random images (no download) for
a few epochs with validation, on one GPU. The callback installs torchalloc
(so it is created first), tags every training step as forward / zero_grad /
backward / optimizer, validation as "validation", marks epochs and steps,
and writes LOG_STEM.report.txt and LOG_STEM.report.html when fit ends.

Prints one line `RESULT {json}` with what the run measured (PyTorch's own
peak, the report's peak, the phases seen) for the GPU test. Without
Lightning, torch or a GPU it prints `SKIP: <reason>` and exits 77.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", default="torchalloc_logs/lightning.talog", help="event log path")
    parser.add_argument("--policy", default="caching", help="caching, exact or phase_arena")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stacks", action="store_true", help="record allocation stacks")
    args = parser.parse_args()

    try:
        import torch
        from torchalloc.integrations.lightning import TorchallocCallback
    except ImportError as e:
        example_start.cannot_run(str(e))
    if not torch.cuda.is_available():
        example_start.cannot_run("no CUDA GPU")

    # First, before anything touches CUDA: the callback installs torchalloc.
    callback = TorchallocCallback(policy=args.policy, log=args.log, stacks=args.stacks)

    import lightning.pytorch as L
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.BatchNorm2d(128), nn.ReLU(),
                nn.Conv2d(128, 256, 3, padding=1, stride=2), nn.BatchNorm2d(256), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
            )

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(512, 3, 64, 64, generator=g), torch.randint(0, 10, (512,), generator=g)
    train = DataLoader(TensorDataset(images[:384], labels[:384]), batch_size=64)
    val = DataLoader(TensorDataset(images[384:], labels[384:]), batch_size=64)

    trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=args.epochs, callbacks=[callback],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=1)
    trainer.fit(Classifier(), train, val)

    import torchalloc

    report = callback.report
    result = {
        "route": torchalloc.installed().route,
        "log": callback.log_path,
        "report_text": report.text if report else None,
        "report_html": report.html if report else None,
        "torch_max_allocated": torch.cuda.max_memory_allocated(),
        "torch_max_reserved": torch.cuda.max_memory_reserved(),
        "phases": {name: s.allocated_bytes for name, s in torchalloc.phase_stats().items()},
        "global_step": trainer.global_step,
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
