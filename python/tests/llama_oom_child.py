#!/usr/bin/env python3
"""One training run of a small Llama-style decoder under a memory cap, for test_oom_advice_gpu.py.

    python3 python/tests/llama_oom_child.py --conf policy:caching [--cap-mib 9000] [--layers 8] [--hidden 1024]
        [--batch 4] [--min-len 256] [--max-len 2048] [--steps 40] [--seed 0] [--log FILE] [--native]

A decoder from transformers' LlamaConfig with random weights (or, without
transformers, the same shape from torch.nn.TransformerEncoder layers with a
causal mask), AdamW, bf16 autocast, a sequence length drawn from
[min-len, max-len] each step (transformer_pattern.lengths: the sim test's
draw), under torch.cuda.set_per_process_memory_fraction(cap / total).
torchalloc is installed on the bridge route with --conf (TORCHALLOC_CONF
syntax; --native leaves PyTorch's allocator). Prints one line, RESULT and
JSON: completed, the step reached, the OutOfMemoryError message when it ran
out (on the bridge: torchalloc's summary with its advice), peaks. Run it by
hand to tune the cap for a GPU: the OOM must come under caching and not
under the advised setting.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's torchalloc
sys.path.insert(0, str(HERE))
from transformer_pattern import Config, lengths  # noqa: E402

RESULT = "RESULT "
MiB = 1 << 20


def parse_conf(text: str) -> dict[str, str]:
    """"policy:caching,expandable:reclaim" -> {"policy": "caching", "expandable": "reclaim"}."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition(":")
        if not sep:
            raise SystemExit(f"--conf: '{item}' is not KEY:VALUE")
        out[key.strip()] = value.strip()
    return out


def build_model(torch: Any, a: argparse.Namespace, vocab: int) -> tuple[Any, str]:
    """(model, what it is): transformers' LlamaForCausalLM when importable, else a torch.nn decoder."""
    heads = max(1, a.hidden // 64)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        pass
    else:
        config = LlamaConfig(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                             num_hidden_layers=a.layers, num_attention_heads=heads, num_key_value_heads=heads,
                             max_position_embeddings=a.max_len)
        return LlamaForCausalLM(config), "transformers LlamaForCausalLM"

    nn = torch.nn

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, a.hidden)
            layer = nn.TransformerEncoderLayer(a.hidden, heads, a.intermediate, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.layers = nn.TransformerEncoder(layer, a.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(a.hidden)
            self.lm_head = nn.Linear(a.hidden, vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
            h = self.layers(self.embed(ids), mask=mask, is_causal=True)
            return self.lm_head(self.norm(h))

    return Decoder(), "torch.nn.TransformerEncoder decoder (transformers is not installed)"


def main(argv: list[str] | None = None) -> int:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conf", default="policy:caching", help="torchalloc settings, TORCHALLOC_CONF syntax")
    p.add_argument("--native", action="store_true", help="PyTorch's own allocator instead of torchalloc")
    p.add_argument("--cap-mib", type=int, default=9000)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--intermediate", type=int, default=d.intermediate)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--min-len", type=int, default=d.min_len)
    p.add_argument("--max-len", type=int, default=d.max_len)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--log", default=None, help="torchalloc's event log (no stacks: the replay needs none)")
    a = p.parse_args(argv)

    import torch

    installed = None
    if not a.native:
        import torchalloc

        installed = torchalloc.install(bridge=True, log=a.log, warn=0, **parse_conf(a.conf))
    torch.manual_seed(a.seed)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_mib * MiB / total))
    steps = lengths(Config(min_len=a.min_len, max_len=a.max_len, steps=a.steps, seed=a.seed))
    out: dict[str, Any] = {"completed": False, "step": 0, "steps": a.steps, "lengths": steps, "message": "",
                           "route": installed.route if installed else "native", "conf": a.conf, "cap_mib": a.cap_mib}
    try:
        model, what = build_model(torch, a, a.vocab)
        out["model"] = what
        model = model.cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for step, length in enumerate(steps):
            out["step"] = step
            ids = torch.randint(0, a.vocab, (a.batch, length), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if what.startswith("transformers"):
                    loss = model(input_ids=ids, labels=ids).loss
                else:
                    logits = model(ids)
                    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, ids
        torch.cuda.synchronize()
        out["completed"] = True
    except torch.OutOfMemoryError as e:
        out["message"] = str(e)
        if installed:
            import torchalloc

            oom = torchalloc.last_oom()
            out["verdict"] = oom.verdict if oom else None
            out["report_path"] = oom.path if oom else ""
    out["peak_reserved"] = torch.cuda.max_memory_reserved()
    out["peak_allocated"] = torch.cuda.max_memory_allocated()
    print(RESULT + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
