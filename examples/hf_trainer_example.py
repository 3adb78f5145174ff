#!/usr/bin/env python3
"""Hugging Face Trainer with torchalloc: a tiny GPT-2 (random weights, no download), one callback, a report.

    python3 examples/hf_trainer_example.py [--log runs/hf.talog] [--policy caching] [--steps 12]

Builds a 4-layer GPT-2 from a config, trains it as a causal language model
on random tokens with the Trainer, evaluating every few steps. The callback
installs torchalloc (so it is created before TrainingArguments, which picks
the device and thereby starts CUDA), tags forward / backward / optimizer /
zero_grad and evaluation, marks epochs and steps, and writes
LOG_STEM.report.txt and LOG_STEM.report.html when training ends.

Prints one line `RESULT {json}` for the GPU test. Without transformers,
torch or a GPU it prints `SKIP: <reason>` and exits 77.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", default="torchalloc_logs/hf.talog", help="event log path")
    parser.add_argument("--policy", default="caching", help="caching, exact or phase_arena")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default=None, help="the Trainer's output_dir (default: beside the log)")
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
    try:
        import torch
        from torchalloc.integrations.huggingface import TorchallocCallback
    except ImportError as e:
        example_start.cannot_run(str(e))
    if not torch.cuda.is_available():
        example_start.cannot_run("no CUDA GPU")

    # First, before TrainingArguments (which starts CUDA): the callback installs torchalloc.
    callback = TorchallocCallback(policy=args.policy, log=args.log)

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class RandomTokens(torch.utils.data.Dataset):
        def __init__(self, n: int, length: int, vocab: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, vocab, (n, length), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    config = GPT2Config(n_layer=4, n_head=8, n_embd=512, n_positions=256, vocab_size=8192)
    model = GPT2LMHeadModel(config)
    out_dir = args.out or str(Path(args.log).parent / "hf_trainer_out")
    training = TrainingArguments(
        output_dir=out_dir, max_steps=args.steps, per_device_train_batch_size=8, per_device_eval_batch_size=8,
        learning_rate=3e-4, eval_strategy="steps", eval_steps=max(args.steps // 2, 1), logging_strategy="no",
        save_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=training, train_dataset=RandomTokens(128, 128, config.vocab_size),
                      eval_dataset=RandomTokens(32, 128, config.vocab_size), callbacks=[callback])
    trainer.train()

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
        "global_step": trainer.state.global_step,
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
