"""Training runs written by hand (synthlog.py) at any batch size and sequence length, for test_plan*.py: what
`torchalloc plan` predicts from one is checked against the run written at another size.

`training(batch, seq, ...)` is the allocation pattern of a small decoder trained with AdamW, with phases
(init, forward, backward, optimizer) and a marker per step, no stacks: the analysis categorizes its blocks by
their phases and lifetimes. Every size follows the shapes:

- parameters (init, never freed) and AdamW's two states per parameter (the first optimizer step, never
  freed): constant;
- per step, the batch's token ids and, per layer, a hidden state and an MLP input saved for backward: linear
  in batch and seq; attention's scores saved for backward: linear in the batch, quadratic in seq (`scores`);
  an MLP temporary freed within the forward; the logits saved for backward;
- backward: a temporary per layer freed within it, the parameters' gradients (freed by zero_grad in the
  optimizer phase), the activations freed layer by layer;
- optimizer: a temporary per parameter freed within it.

Addresses are never reused, so every block is its own key for replay and the analysis alike.
"""
from __future__ import annotations

import itertools
from pathlib import Path

from synthlog import SynthLog

HIDDEN, HEADS, VOCAB, LAYERS = 128, 4, 1024, 3


def training(batch: int, seq: int = 128, *, steps: int = 4, scores: bool = True, kept_input: bool = False,
             cut_after: str | None = None, markers: bool = True, oom_device: int = 0, workspace: int = 0,
             device_memory: tuple[int, int] | None = None) -> SynthLog:
    """The run (module docstring). `kept_input`: the first step's token ids are kept for the whole run (a block
    the analysis cannot attribute: persistent, made in forward); `cut_after`: stop the log right after that
    phase of the first step begins ("backward": a run cut before its first full step); `oom_device`: end with
    an out-of-memory record saying the device has that many bytes; `workspace`: per layer in forward, after the
    MLP temporary, a temporary of that many bytes (a cuDNN workspace, whose size its algorithm decides);
    `device_memory`: (total, memory fraction's limit) said by a device record first, as the library does."""
    L = SynthLog()
    if device_memory:
        L.device_memory(*device_memory)
    addr = itertools.count(1 << 32, 1 << 20)
    tokens, h = batch * seq, HIDDEN
    L.begin("init")
    params = []
    for _ in range(LAYERS):
        for size in (4 * h * h * 4, 2 * h * 4 * h * 4):  # attention's and the MLP's weights, fp32
            a = next(addr)
            L.alloc(a, size)
            params.append((a, size))
    L.end()
    states: list[int] = []
    kept = None
    for step in range(steps):
        if markers:
            L.mark(f"step {step + 1}")
        L.begin("forward")
        saved = []
        a = next(addr)
        L.alloc(a, tokens * 8)  # token ids
        if kept_input and kept is None:
            kept = a
        else:
            saved.append(a)
        for _ in range(LAYERS):
            for size in (tokens * h * 2, tokens * 4 * h * 2) + ((batch * HEADS * seq * seq * 2,) if scores else ()):
                a = next(addr)
                L.alloc(a, size)
                saved.append(a)
            t = next(addr)
            L.alloc(t, tokens * 4 * h * 4)
            L.free(t)
            if workspace:
                w = next(addr)
                L.alloc(w, workspace)
                L.free(w)
        a = next(addr)
        L.alloc(a, tokens * VOCAB * 4)  # logits
        saved.append(a)
        L.end()
        if cut_after == "forward":
            return L
        L.begin("backward")
        if cut_after == "backward":
            return L
        grads = []
        for k in range(LAYERS):
            t = next(addr)
            L.alloc(t, tokens * h * 4)
            for pa, size in params[2 * (LAYERS - 1 - k): 2 * (LAYERS - k)]:
                g = next(addr)
                L.alloc(g, size)
                grads.append(g)
            L.free(t)
            for a in saved[len(saved) // LAYERS * (LAYERS - 1 - k):][:len(saved) // LAYERS]:
                if a in L.live:
                    L.free(a)
        for a in saved:
            if a in L.live:
                L.free(a)
        L.end()
        L.begin("optimizer")
        if not states:
            for _, size in params:
                for _ in range(2):
                    s = next(addr)
                    L.alloc(s, size)
                    states.append(s)
        for _, size in params:
            t = next(addr)
            L.alloc(t, size)
            L.free(t)
        for g in grads:
            L.free(g)
        L.end()
    if oom_device:
        L._row(kind=5, size=oom_device, block_size=0)  # an OOM asking the whole device, and the device
        L._row(kind=15, addr=oom_device, size=0, block_size=0)
    return L


def write(L: SynthLog, folder: Path, name: str) -> Path:
    """The run as a log file `folder/name`."""
    from synthfile import write_log

    return write_log(L, folder / name, start_ns=10**9)
