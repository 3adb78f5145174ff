#!/usr/bin/env python3
"""Record the trace `torchalloc replay` replays by default, from a real training run on a GPU.

    python3 examples/record_trace.py [--steps 200] [--out python/torchalloc/data/default_trace.pickle.xz]

Trains a small GPT-style decoder (token + position embeddings, pre-norm
blocks of causal self-attention and an MLP, tied LM head) with AdamW under
bf16 autocast, on random tokens with a batch size and sequence length drawn
anew every step, plus a no-grad evaluation pass every 50 steps: the
variable shapes are what make a caching allocator fragment. PyTorch's own
(native) caching allocator serves it while
torch.cuda.memory._record_memory_history() records every allocation, free
and segment event.

The snapshot is then stripped to what replay reads: device_traces entries
(action, addr, size, stream, time_us relative to the first event;
free_requested entries and stack frames dropped) and the segments summary
(address, size, stream, blocks' address/size/requested size/state),
pickled with builtin types only, xz-compressed next to a Markdown note
(default_trace.md) that says how it was recorded, with PyTorch's own
torch.cuda.max_memory_allocated()/max_memory_reserved() to check the replay's
"native" column against. Takes well under two minutes on one GPU.
"""
from __future__ import annotations

import argparse
import datetime
import lzma
import pickle
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import example_start  # beside this file: which torchalloc, and SKIP

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "python" / "torchalloc" / "data" / "default_trace.pickle.xz"

# The model and the data: small enough to run in seconds, big enough to have
# a realistic mix of tensor sizes (KiB biases to 100+ MiB logits).
CONFIG = {
    "vocab": 16384,
    "d_model": 512,
    "n_heads": 8,
    "n_layers": 6,
    "d_ff": 2048,
    "max_len": 1024,
    "batch_sizes": [4, 8, 12, 16],
    "seq_len": [64, 1024],  # uniform, rounded to a multiple of 8
    "eval_every": 50,
    "eval_batch": 24,
    "lr": 3e-4,
    "weight_decay": 0.1,
    "seed": 1234,
}
MAX_ENTRIES = 2_000_000  # ring buffer size: large enough to hold the whole run from its first allocation


def build_model(torch: Any, cfg: dict[str, Any]) -> Any:
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg["d_model"]
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, cfg["d_ff"])
            self.fc2 = nn.Linear(cfg["d_ff"], d)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            h = cfg["n_heads"]
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(cfg["vocab"], cfg["d_model"])
            self.pos = nn.Embedding(cfg["max_len"], cfg["d_model"])
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["n_layers"]))
            self.ln = nn.LayerNorm(cfg["d_model"])
            self.head = nn.Linear(cfg["d_model"], cfg["vocab"], bias=False)
            self.head.weight = self.tok.weight  # tied

        def forward(self, idx: Any) -> Any:
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


def start_recording(torch: Any) -> None:
    record = torch.cuda.memory._record_memory_history
    try:  # torch >= 2.1: no stack capture (context=None) keeps recording cheap
        record(enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES)
    except TypeError:  # torch 2.0
        record(True, trace_alloc_max_entries=MAX_ENTRIES, trace_alloc_record_context=False)


def stop_recording(torch: Any) -> None:
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except TypeError:
        torch.cuda.memory._record_memory_history(False)


def train(torch: Any, steps: int, cfg: dict[str, Any]) -> dict[str, Any]:
    F = torch.nn.functional
    rng = random.Random(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    device = torch.device("cuda")
    start_recording(torch)  # before the model exists: the trace holds every allocation of the run
    model = build_model(torch, cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    shapes: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    for step in range(steps):
        batch = rng.choice(cfg["batch_sizes"])
        lo, hi = cfg["seq_len"]
        seq = max(8, rng.randint(lo, hi) // 8 * 8)
        shapes.append((batch, seq))
        idx = torch.randint(0, cfg["vocab"], (batch, seq + 1), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % cfg["eval_every"] == 0:
            model.eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                idx = torch.randint(0, cfg["vocab"], (cfg["eval_batch"], cfg["max_len"]), device=device)
                model(idx).float().log_softmax(-1).max()
            model.train()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    snapshot = torch.cuda.memory._snapshot()
    stop_recording(torch)
    return {
        "snapshot": snapshot,
        "seconds": seconds,
        "shapes": shapes,
        "params": sum(p.numel() for p in model.parameters()),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "num_device_alloc": torch.cuda.memory_stats().get("num_device_alloc"),
    }


_TRACE_KEYS = ("action", "addr", "size", "stream")
_BLOCK_KEYS = ("address", "size", "requested_size", "state")
_SEGMENT_KEYS = ("device", "address", "total_size", "stream", "segment_type", "is_expandable")


def strip(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Only what replay reads, as builtin types (no frames)."""
    traces = []
    for entries in snapshot.get("device_traces", []):
        out = []
        t0 = entries[0].get("time_us", 0) if entries else 0
        for e in entries:
            if e.get("action") == "free_requested":
                continue
            kept = {k: int(e[k]) if k != "action" else str(e[k]) for k in _TRACE_KEYS if k in e}
            if "time_us" in e:
                kept["time_us"] = int(e["time_us"]) - int(t0)
            out.append(kept)
        traces.append(out)
    segments = []
    for s in snapshot.get("segments", []):
        seg: dict[str, Any] = {k: s[k] for k in _SEGMENT_KEYS if k in s}
        seg["blocks"] = [{k: b[k] for k in _BLOCK_KEYS if k in b} for b in s.get("blocks", [])]
        segments.append(seg)
    return {"device_traces": traces, "segments": segments}


def describe(torch: Any, run: dict[str, Any], steps: int, out: Path, n_entries: int, cfg: dict[str, Any]) -> str:
    props = torch.cuda.get_device_properties(0)
    batches = sorted({b for b, _ in run["shapes"]})
    seqs = [s for _, s in run["shapes"]]
    mib = 1 << 20
    return "\n".join(
        [
            "# The default trace of `torchalloc replay`",
            "",
            f"`{out.name}` is a PyTorch memory snapshot (the dict `torch.cuda.memory._dump_snapshot` pickles), "
            "recorded by `examples/record_trace.py` from a real training run under PyTorch's native caching "
            "allocator, stripped to what replay reads (no stack frames, no `free_requested` entries; `time_us` "
            "relative to the first event) and xz-compressed. Re-record with `python3 examples/record_trace.py` "
            "on a GPU.",
            "",
            "| | |",
            "|---|---|",
            f"| recorded | {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC |",
            f"| torch | {torch.__version__} (CUDA {torch.version.cuda}) |",
            f"| GPU | {props.name}, {props.total_memory / (1 << 30):.0f} GiB |",
            f"| Python | {platform.python_version()} |",
            f"| model | GPT-style decoder: {cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, "
            f"d_ff {cfg['d_ff']}, vocab {cfg['vocab']}, tied head; {run['params'] / 1e6:.1f} M parameters |",
            f"| training | AdamW (lr {cfg['lr']}, weight decay {cfg['weight_decay']}), bf16 autocast, {steps} steps, "
            f"{run['seconds']:.1f} s |",
            f"| data | random tokens; batch size drawn from {batches} and sequence length uniform in "
            f"{min(seqs)}-{max(seqs)} (multiples of 8) every step; a no-grad eval pass of "
            f"{cfg['eval_batch']} x {cfg['max_len']} every {cfg['eval_every']} steps |",
            f"| recording | `_record_memory_history(max_entries={MAX_ENTRIES})`, started before the model was "
            "built: the history holds the whole run |",
            f"| trace | {n_entries} entries on device 0; file {out.stat().st_size / mib:.2f} MiB |",
            f"| native peaks | `max_memory_allocated()` {run['max_allocated'] / mib:.1f} MiB, "
            f"`max_memory_reserved()` {run['max_reserved'] / mib:.1f} MiB, "
            f"{run['num_device_alloc']} cudaMalloc calls |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    example_start.choose_torchalloc()
    from torchalloc._gpu_child import skip_reason

    reason = skip_reason()
    if reason:
        example_start.cannot_run(reason)
    import torch
    cfg = dict(CONFIG)
    run = train(torch, args.steps, cfg)
    stripped = strip(run["snapshot"])
    n_entries = len(stripped["device_traces"][0]) if stripped["device_traces"] else 0
    if n_entries >= MAX_ENTRIES:
        print(f"warning: the history filled its ring buffer ({MAX_ENTRIES} entries): it begins mid-run",
              file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw = pickle.dumps(stripped, protocol=4)
    args.out.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    note = describe(torch, run, args.steps, args.out, n_entries, cfg)
    md = args.out.with_name(args.out.name.split(".")[0] + ".md")
    md.write_text(note)
    print(note)
    print(f"wrote {args.out} ({args.out.stat().st_size / (1 << 20):.2f} MiB, {len(raw) / (1 << 20):.1f} MiB raw) "
          f"and {md}")
    # Read it back the way replay does, when torchalloc is importable.
    try:
        from torchalloc.log.trace import load_trace
    except ImportError as e:
        print(f"(not checked with torchalloc.trace: {e})")
        return 0
    t = load_trace(args.out)
    mib = 1 << 20
    native = t.native_peak_reserved
    print(f"replay reads {len(t)} events; peak requested {t.peak_requested / mib:.1f} MiB; native peak reserved "
          f"{'?' if native is None else f'{native / mib:.1f}'} MiB (torch said {run['max_reserved'] / mib:.1f} MiB)")
    for note_line in t.notes:
        print(f"  note: {note_line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
