"""torchalloc inside the trainers people use: one callback each.

    from torchalloc.integrations.lightning import TorchallocCallback      # pip install lightning
    from torchalloc.integrations.huggingface import TorchallocCallback   # pip install transformers

Each callback installs torchalloc when it is created (so create it before
anything touches CUDA: before the Trainer, TrainingArguments, or a
`.cuda()`), turns the trainer's own hooks into phases (forward, backward,
optimizer, zero_grad, validation) and markers ("epoch N", "step N"), and
writes the report beside the log when training ends.

This package imports neither library; each module imports its own when it
is imported and says what to install when it is missing. What both share
lives in _session.
"""
