"""A transformer-shaped allocation pattern, for OOM tests on the simulated device.

The requests a Llama-style decoder makes while training with AdamW under
bf16 autocast, step by step, with a sequence length drawn from 256..2048
each step (what makes its caching allocator fragment): the fp32 weights
first; per step, the forward's bf16 weight casts (held until autocast
exits), each layer's saved activations and its temporaries, the logits in
bf16 and fp32; the backward freeing activations layer by layer while it
allocates the parameter gradients (zero_grad(set_to_none=True) frees them
after every step, so each backward allocates them again between freed
activations); AdamW's two states per parameter at the first step, and its
foreach temporaries.

Sizes follow the shapes (Config), not any one library's kernels, so this is
a pattern like the real one, not a recording of it. `workload()` yields
("alloc", key, bytes, phase) and ("free", key, 0, phase), as
examples/fragmentation_demo.py's workload does; `drive()` runs it through
the C entry points of a loaded library and says whether it completed. A
child process (`python3 transformer_pattern.py CONF`) runs it under CONF
(TORCHALLOC_CONF syntax): that is how the OOM advice test follows the
advice in a fresh process.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Callable, Iterator

MiB = 1 << 20
TAG = "TRANSFORMER_PATTERN "


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 8
    hidden: int = 1024
    intermediate: int = 2816
    vocab: int = 32000
    batch: int = 4
    min_len: int = 256
    max_len: int = 2048
    steps: int = 40
    seed: int = 0


def _params(c: Config) -> list[tuple[str, int]]:
    """(name, elements) of every parameter."""
    h, i = c.hidden, c.intermediate
    out = [("embed", c.vocab * h)]
    for layer in range(c.layers):
        out += [(f"l{layer}.{w}", h * h) for w in ("q", "k", "v", "o")]
        out += [(f"l{layer}.{w}", h * i) for w in ("gate", "up", "down")]
        out += [(f"l{layer}.norm1", h), (f"l{layer}.norm2", h)]
    out += [("norm", h), ("lm_head", c.vocab * h)]
    return out


def lengths(c: Config) -> list[int]:
    """The sequence length of each step: uniform in [min_len, max_len], multiples of 64."""
    rnd = random.Random(c.seed)
    return [rnd.randrange(c.min_len // 64, c.max_len // 64 + 1) * 64 for _ in range(c.steps)]


def workload(c: Config = Config()) -> Iterator[tuple[str, int, int, str]]:
    """The allocation sequence, step by step, each request with its phase (init, forward, backward, optimizer)."""
    keys = iter(range(1, 1 << 62))
    live: dict[str, int] = {}

    def alloc(name: str, nbytes: int, phase: str) -> Iterator[tuple[str, int, int, str]]:
        key = next(keys)
        live[name] = key
        yield ("alloc", key, max(512, nbytes), phase)

    def free(name: str, phase: str) -> Iterator[tuple[str, int, int, str]]:
        yield ("free", live.pop(name), 0, phase)

    params = _params(c)
    for name, n in params:
        yield from alloc(f"w:{name}", 4 * n, "init")
    h, i, v = c.hidden, c.intermediate, c.vocab
    for step, length in enumerate(lengths(c)):
        t = c.batch * length  # tokens
        # -- forward, under autocast: bf16 casts of the weights live until it exits
        f = "forward"
        yield from alloc("x", 4 * t * h, f)
        for layer in range(c.layers):
            p = f"l{layer}."
            for w, n in ((w, n) for w, n in params if w.startswith(p) and not w.endswith(("norm1", "norm2"))):
                yield from alloc(f"cast:{w}", 2 * n, f)
            for a, n in (("norm1", 2 * t * h), ("q", 2 * t * h), ("k", 2 * t * h), ("v", 2 * t * h),
                         ("attn", 2 * t * h), ("lse", 4 * t * 16), ("res1", 4 * t * h), ("norm2", 2 * t * h),
                         ("gate", 2 * t * i), ("up", 2 * t * i), ("act", 2 * t * i), ("res2", 4 * t * h)):
                yield from alloc(f"a:{p}{a}", n, f)
            yield from alloc("tmp", 4 * t * i, f)  # the MLP's fp32 product before the cast
            yield from free("tmp", f)
        yield from alloc("a:norm", 2 * t * h, f)
        yield from alloc("cast:lm_head", 2 * v * h, f)
        yield from alloc("a:logits16", 2 * t * v, f)
        yield from alloc("a:logits", 4 * t * v, f)  # the loss in fp32
        yield from free("a:logits16", f)
        for name in [k for k in live if k.startswith("cast:")]:
            yield from free(name, f)
        # -- backward: gradients of the activations come and go, parameter gradients stay until zero_grad
        b = "backward"
        yield from alloc("g:logits", 4 * t * v, b)
        yield from free("a:logits", b)
        yield from alloc("grad:lm_head", 4 * v * h, b)
        yield from alloc("g:h", 4 * t * h, b)
        yield from free("g:logits", b)
        yield from free("a:norm", b)
        yield from alloc("grad:norm", 4 * h, b)
        for layer in reversed(range(c.layers)):
            p = f"l{layer}."
            yield from alloc("g:mlp", 2 * t * i, b)
            for w in ("down", "up", "gate"):
                yield from alloc(f"grad:{p}{w}", 4 * h * i, b)
            for a in ("res2", "act", "up", "gate", "norm2"):
                yield from free(f"a:{p}{a}", b)
            yield from free("g:mlp", b)
            yield from alloc("grad:" + p + "norm2", 4 * h, b)
            yield from alloc("g:attn", 2 * t * h, b)
            for w in ("o", "v", "k", "q"):
                yield from alloc(f"grad:{p}{w}", 4 * h * h, b)
            for a in ("res1", "lse", "attn", "v", "k", "q", "norm1"):
                yield from free(f"a:{p}{a}", b)
            yield from free("g:attn", b)
            yield from alloc("grad:" + p + "norm1", 4 * h, b)
        yield from alloc("grad:embed", 4 * v * h, b)
        yield from free("g:h", b)
        yield from free("x", b)
        # -- AdamW (foreach): two fp32 states per parameter from the first step on, temporaries per step
        o = "optimizer"
        if step == 0:
            for name, n in params:
                yield from alloc(f"exp_avg:{name}", 4 * n, o)
                yield from alloc(f"exp_avg_sq:{name}", 4 * n, o)
        for name, n in params:
            yield from alloc(f"tmp:{name}", 4 * n, o)
        for name, _ in params:
            yield from free(f"tmp:{name}", o)
        for name in [k for k in live if k.startswith("grad:")]:  # zero_grad(set_to_none=True)
            yield from free(name, o)


def live_peak(c: Config = Config()) -> int:
    sizes: dict[int, int] = {}
    now = peak = 0
    for op, key, size, _ in workload(c):
        if op == "alloc":
            sizes[key] = size
            now += size
            peak = max(peak, now)
        else:
            now -= sizes.pop(key)
    return peak


def drive(lib: ctypes.CDLL, c: Config = Config(), phases: bool = True,
          at_failure: Callable[[], None] | None = None) -> tuple[bool, int]:
    """Run the pattern through lib's C API on device 0, each part of a step in its torchalloc phase (none
    with phases=False); (completed, the step it reached, from 0). `at_failure` is called at a failed
    request, while everything the pattern holds is still live (it is all freed before returning)."""
    live: dict[int, tuple[int, int]] = {}
    step = 0
    current, opened = "", ""
    try:
        for op, key, size, phase in workload(c):
            if phase != current:
                if phase == "forward" and current == "optimizer":
                    step += 1
                current = phase
                if phases:
                    if opened:
                        assert lib.torchalloc_phase_end(opened.encode()) == 0
                    assert lib.torchalloc_phase_begin(phase.encode()) >= 0
                    opened = phase
            if op == "free":
                ptr, n = live.pop(key)
                lib.torchalloc_free(ptr, n, 0, None)
                continue
            ptr = lib.torchalloc_try_malloc(size, 0, None)
            if not ptr:
                if at_failure is not None:
                    at_failure()
                return False, step
            live[key] = (ptr, size)
        return True, step
    finally:
        if opened:
            lib.torchalloc_phase_end(opened.encode())
        for ptr, n in live.values():
            lib.torchalloc_free(ptr, n, 0, None)


def main(argv: list[str]) -> int:
    """Child: `transformer_pattern.py CONF [CONFIG_JSON [no-phases]]`: run the pattern under CONF (TORCHALLOC_CONF
    syntax), print the outcome as one tagged JSON line."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from torchalloc import _lib, last_oom

    conf, config = argv[0], Config(**json.loads(argv[1])) if len(argv) > 1 else Config()
    phases = len(argv) <= 2 or argv[2] != "no-phases"
    _lib.init(conf)
    completed, step = drive(_lib.lib(), config, phases)
    oom = last_oom(0)
    print(TAG + json.dumps({"completed": completed, "step": step, "verdict": oom.verdict if oom else None,
                            "summary": oom.summary if oom else ""}), flush=True)
    _lib.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
