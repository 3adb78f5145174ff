#!/usr/bin/env python3
"""Record the bundled demo trace: a short real training run with stacks, phases and markers (issue 25).

    python3 examples/record_demo_trace.py [--steps 6] [--out python/torchalloc/data/demo_trace.talog.xz]

A small Llama-style decoder (transformers' LlamaForCausalLM from a config,
random weights; a torch.nn GPT-style decoder when transformers is missing)
trained with AdamW for a few steps under torchalloc (policy caching,
stacks:1), `torchalloc.track(model, opt)` tagging the phases and
`torchalloc.mark("step N")` each step. Around the steps it walks the
classic cases the report explains, each under its own marker:

- "rebinding": `x = x + 1` in a loop (each old x freed when the name is
  assigned again);
- "function temporary": a tensor that lives in a function's local variable
  and dies when the function returns;
- "checkpoint": activation checkpointing (torch.utils.checkpoint), keeping
  only each checkpointed block's output for backward;
- "stray reference": an activation kept alive by a list the user forgot
  (freed only when the list is cleared);
- step 1's optimizer phase creates AdamW's state (exp_avg, exp_avg_sq).

The log is xz-compressed to --out with a note beside it (demo_trace.md:
machine, torch, command). `torchalloc report` with no argument reports it.
Without a GPU (or torch) it prints SKIP and exits 77.
"""
from __future__ import annotations

import argparse
import datetime
import lzma
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "python" / "torchalloc" / "data" / "demo_trace.talog.xz"
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one

CONFIG = dict(layers=4, hidden=512, heads=8, intermediate=1376, vocab=8192, batch=8, seq=512, seed=0)


def build_model(torch: Any, cfg: dict[str, Any]) -> tuple[Any, str]:
    """LlamaForCausalLM from a config (random weights), or a torch.nn stand-in; and which one it is."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        layer = torch.nn.TransformerEncoderLayer(cfg["hidden"], cfg["heads"], cfg["intermediate"], batch_first=True,
                                                 norm_first=True)

        class GPT(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = torch.nn.Embedding(cfg["vocab"], cfg["hidden"])
                self.layers = torch.nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
                self.head = torch.nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)

            def forward(self, idx: Any) -> Any:
                mask = torch.nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
                return self.head(self.layers(self.embed(idx), mask=mask, is_causal=True))

        return GPT(), "torch.nn GPT-style decoder (transformers is not installed)"
    conf = LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["intermediate"],
                       num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                       max_position_embeddings=cfg["seq"])
    return LlamaForCausalLM(conf), "transformers LlamaForCausalLM"


def logits_of(model: Any, idx: Any) -> Any:
    out = model(idx)
    return out.logits if hasattr(out, "logits") else out


def rebinding(torch: Any) -> None:
    x = torch.ones(1024, 1024, device="cuda")  # 4 MiB
    for _ in range(4):
        x = x + 1  # the old x is freed when the name is assigned again


def function_temporary(torch: Any) -> Any:
    def normalized(v: Any) -> Any:
        centered = v - v.mean()  # a local: freed when normalized() returns
        return centered / (centered.std() + 1e-6)

    return normalized(torch.randn(2048, 2048, device="cuda"))


def checkpointed_step(torch: Any, model: Any, idx: Any, F: Any, vocab: int) -> None:
    """Forward and backward with activation checkpointing on each decoder layer: only the outputs are kept."""
    from torch.utils.checkpoint import checkpoint

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:  # the torch.nn stand-in
        layers = model.layers.layers
    originals = [layer.forward for layer in layers]
    try:
        for layer, fwd in zip(layers, originals):
            layer.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(fwd)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(logits_of(model, idx[:, :-1]).float().reshape(-1, vocab), idx[:, 1:].reshape(-1))
        loss.backward()
    finally:
        for layer, fwd in zip(layers, originals):
            layer.forward = fwd


def train(torch: Any, torchalloc: Any, steps: int) -> dict[str, Any]:
    cfg = dict(CONFIG)
    F = torch.nn.functional
    torch.manual_seed(cfg["seed"])
    model, kind = build_model(torch, cfg)
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    handle = torchalloc.track(model, opt)
    stray: list[Any] = []
    t0 = time.perf_counter()
    torchalloc.mark("rebinding")
    rebinding(torch)
    torchalloc.mark("function temporary")
    kept = function_temporary(torch)
    del kept
    for step in range(1, steps + 1):
        torchalloc.mark(f"step {step}")  # step 1's optimizer phase creates AdamW's state
        idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), device="cuda")
        if step == 3:
            torchalloc.mark("checkpoint")
            checkpointed_step(torch, model, idx, F, cfg["vocab"])
        else:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = logits_of(model, idx[:, :-1])
                if step == 2:
                    torchalloc.mark("stray reference")
                    stray.append(logits)  # forgotten: keeps step 2's logits alive until cleared
                loss = F.cross_entropy(logits.float().reshape(-1, cfg["vocab"]), idx[:, 1:].reshape(-1))
            del logits
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 4:
            torchalloc.mark("stray reference cleared")
            stray.clear()
    torch.cuda.synchronize()
    handle.remove()
    return {"seconds": time.perf_counter() - t0, "params": sum(p.numel() for p in model.parameters()),
            "model": kind, "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(), "cfg": cfg}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.steps < 4:
        ap.error("--steps must be at least 4 (steps 2-4 hold the stray reference and the checkpointed step)")
    from torchalloc._gpu_child import skip_reason

    reason = skip_reason()
    if reason:
        example_start.cannot_run(reason)
    import torch
    import torchalloc
    from torchalloc import _lib

    raw = Path(tempfile.mkdtemp()) / "demo.talog"
    torchalloc.install(policy="caching", log=raw, stacks=True, patch_torch=True)
    run = train(torch, torchalloc, args.steps)
    _lib.lib().torchalloc_log_close()
    data = raw.read_bytes()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    mib = 1 << 20
    cfg = run["cfg"]
    command = "python3 examples/record_demo_trace.py" + (f" --steps {args.steps}" if args.steps != 6 else "")
    note = "\n".join([
        "# The demo trace",
        "",
        f"`{args.out.name}` is a torchalloc block log (docs/LOG_FORMAT.md) with stacks (stacks:1), phases "
        "(`torchalloc.track(model, opt)`) and markers (`torchalloc.mark`), xz-compressed, recorded by "
        f"`{command}` on a GPU. `torchalloc report` with no argument reports it. Markers: rebinding, function "
        "temporary, step 1..N, stray reference, checkpoint, stray reference cleared.",
        "",
        "| | |",
        "|---|---|",
        f"| recorded | {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC |",
        f"| command | `{command}` |",
        f"| torch | {torch.__version__} (CUDA {torch.version.cuda}) |",
        f"| GPU | {torch.cuda.get_device_name(0)} |",
        f"| Python | {platform.python_version()} |",
        f"| model | {run['model']}: {cfg['layers']} layers, hidden {cfg['hidden']}, {cfg['heads']} heads, "
        f"intermediate {cfg['intermediate']}, vocab {cfg['vocab']}; {run['params'] / 1e6:.1f} M parameters, "
        "random weights |",
        f"| training | AdamW (lr 3e-4, weight decay 0.1), bf16 autocast, batch {cfg['batch']} x {cfg['seq']} tokens, "
        f"{args.steps} steps (step 3 with activation checkpointing), {run['seconds']:.1f} s |",
        f"| log | {len(data) / mib:.1f} MiB raw, {args.out.stat().st_size / mib:.2f} MiB compressed |",
        f"| torchalloc peaks | allocated {run['max_allocated'] / mib:.1f} MiB, reserved {run['max_reserved'] / mib:.1f} MiB |",
        "",
    ])
    md = args.out.with_name(args.out.name.split(".")[0] + ".md")
    md.write_text(note)
    print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
