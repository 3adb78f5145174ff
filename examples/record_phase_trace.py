#!/usr/bin/env python3
"""Record a phase-tagged torchalloc log of a real training run, for replay.

    python3 examples/record_phase_trace.py [--steps 200] [--out python/torchalloc/data/phases_trace.talog.xz]

The same GPT-style decoder, data and AdamW loop as examples/record_trace.py,
but served by torchalloc (policy caching) with its block log on and
torchalloc.track() tagging every allocation with its phase: forward,
backward, optimizer, zero_grad, and "eval" for the no-grad evaluation pass.
The log is xz-compressed next to a note of how it was recorded. Replay it
with `torchalloc replay python/torchalloc/data/phases_trace.talog.xz`: with
phases in the trace, phase_arena gives every phase its own arena.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import lzma
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "python" / "torchalloc" / "data" / "phases_trace.talog.xz"
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one


def load_record_trace() -> Any:
    """examples/record_trace.py as a module: its model and data settings."""
    spec = importlib.util.spec_from_file_location("record_trace", REPO / "examples" / "record_trace.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(torch: Any, torchalloc: Any, rt: Any, steps: int) -> dict[str, Any]:
    cfg = dict(rt.CONFIG)
    F = torch.nn.functional
    rng = random.Random(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    model = rt.build_model(torch, cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    handle = torchalloc.track(model, opt)
    t0 = time.perf_counter()
    for step in range(steps):
        batch = rng.choice(cfg["batch_sizes"])
        lo, hi = cfg["seq_len"]
        seq = max(8, rng.randint(lo, hi) // 8 * 8)
        idx = torch.randint(0, cfg["vocab"], (batch, seq + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % cfg["eval_every"] == 0:
            handle.remove()  # or the forward hook would nest "forward" inside "eval" (innermost wins)
            model.eval()
            with torchalloc.phase("eval"), torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                idx = torch.randint(0, cfg["vocab"], (cfg["eval_batch"], cfg["max_len"]), device="cuda")
                model(idx).float().log_softmax(-1).max()
            model.train()
            handle = torchalloc.track(model, opt)
    torch.cuda.synchronize()
    handle.remove()
    return {
        "seconds": time.perf_counter() - t0,
        "params": sum(p.numel() for p in model.parameters()),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "cfg": cfg,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    from torchalloc._gpu_child import skip_reason

    reason = skip_reason()
    if reason:
        example_start.cannot_run(reason)
    import torch
    import torchalloc
    from torchalloc import _lib

    raw = Path(tempfile.mkdtemp()) / "run.talog"
    torchalloc.install(policy="caching", log=raw, patch_torch=True)
    rt = load_record_trace()
    run = train(torch, torchalloc, rt, args.steps)
    _lib.lib().torchalloc_log_close()
    data = raw.read_bytes()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    mib = 1 << 20
    cfg = run["cfg"]
    note = "\n".join([
        "# The phase-tagged trace",
        "",
        f"`{args.out.name}` is a torchalloc block log (docs/LOG_FORMAT.md), xz-compressed, recorded by "
        "`examples/record_phase_trace.py` from the training run of `examples/record_trace.py` served by torchalloc "
        "(policy caching) with `torchalloc.track(model, optimizer)` tagging phases forward / backward / optimizer / "
        "zero_grad and `torchalloc.phase(\"eval\")` around the evaluation pass. Replay it with "
        f"`torchalloc replay python/torchalloc/data/{args.out.name}`.",
        "",
        "| | |",
        "|---|---|",
        f"| recorded | {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC |",
        f"| torch | {torch.__version__} (CUDA {torch.version.cuda}) |",
        f"| GPU | {torch.cuda.get_device_name(0)} |",
        f"| Python | {platform.python_version()} |",
        f"| model | GPT-style decoder: {cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, "
        f"d_ff {cfg['d_ff']}, vocab {cfg['vocab']}; {run['params'] / 1e6:.1f} M parameters |",
        f"| training | AdamW, bf16 autocast, {args.steps} steps, {run['seconds']:.1f} s; batch from "
        f"{cfg['batch_sizes']}, length uniform in {cfg['seq_len']}; no-grad eval every {cfg['eval_every']} steps |",
        f"| log | {len(data) / mib:.1f} MiB raw, {args.out.stat().st_size / mib:.2f} MiB compressed |",
        f"| torchalloc peaks | allocated {run['max_allocated'] / mib:.1f} MiB, reserved {run['max_reserved'] / mib:.1f} MiB |",
        "",
    ])
    md = args.out.with_name(args.out.name.split(".")[0] + ".md")
    md.write_text(note)
    print(note)
    from torchalloc.log.trace import load_trace

    t = load_trace(args.out)
    print(f"replay reads {len(t)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
