"""bench/plan_check.py's children, on the GPU: a workload's run (bench/suite/child.py's, with llama_prompt
registered beside the suite's workloads) and MemTracker's estimate under FakeTensorMode.

bench/plan_check.py runs itself with --child (and --memtracker) for each; PyTorch picks its allocator once per
process, so every run is a process of its own. torch, transformers and torchvision are imported here only.
"""
from __future__ import annotations

import argparse
import time
from unittest import mock
from typing import Any

from torchalloc import _gpu_child as gpu_child

MEMTRACKER_TAG = "PLAN_CHECK_MEMTRACKER "
GENERATE_BATCH, GENERATE_NEW = 4, 32  # llama_prompt: sequences and new tokens per generate()


def register_llama_prompt() -> None:
    """llama_prompt, the workload whose knob is the prompt's length (its `batch` argument): generate() of
    GENERATE_NEW tokens after a prompt of that length, GENERATE_BATCH sequences, the same every step."""
    from suite import workloads

    def build(torch: Any, device: Any, length: int, seed: int, steps: int) -> Any:
        model = workloads._llama(torch, device, layers=4).eval()
        gen = torch.Generator(device=device).manual_seed(seed)

        def draw(_warmup: bool) -> Any:
            return torch.randint(1, workloads.LLAMA["vocab_size"], (GENERATE_BATCH, length), generator=gen,
                                 device=device)

        def run(ids: Any) -> Any:
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=GENERATE_NEW,
                                 min_new_tokens=GENERATE_NEW, do_sample=False, use_cache=True, pad_token_id=0)
            return out[:, ids.shape[1]:].sum().double()

        return workloads.Built(model, None, draw, run)

    workloads.WORKLOADS["llama_prompt"] = workloads.Spec(
        "llama_prompt", f"generate() on the Llama config (4 layers), {GENERATE_BATCH} sequences, the prompt's "
        f"length the knob, {GENERATE_NEW} new tokens", 256, 2, 10, 300, build)


def fake_inputs(torch: Any, name: str, device: Any, knob: int) -> Any:
    """A step's inputs made without a generator (fake tensors ignore the values, not the shapes)."""
    from suite import workloads

    if name == "gpt2":
        return torch.randint(0, 50257, (knob, workloads.GPT2_LENGTH), device=device)
    if name == "resnet50":
        return torch.randn(knob, 3, 224, 224, device=device), torch.randint(0, 1000, (knob,), device=device)
    if name == "detection":
        side = sum(workloads.DETECTION_SIDES) // 64 * 32  # the middle of the drawn range
        boxes = torch.tensor([[16.0, 16.0, side / 2, side / 2]], device=device)
        target = {"boxes": boxes, "labels": torch.ones(1, dtype=torch.int64, device=device),
                  "masks": torch.ones(1, side, side, dtype=torch.uint8, device=device)}
        return [torch.rand(3, side, side, device=device) for _ in range(knob)], [dict(target) for _ in range(knob)]
    return torch.randint(1, workloads.LLAMA["vocab_size"], (GENERATE_BATCH, knob), device=device)


def _stay(module: Any, *args: Any, **kwargs: Any) -> Any:
    """Module.to while a model is built under FakeTensorMode: it is on its device already."""
    return module


def memtracker_main(args: argparse.Namespace) -> int:
    """MemTracker under FakeTensorMode: the model built on fake tensors, two steps tracked (the first makes the
    optimizer's state), the peak of the second; the seconds from building to the estimate."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from suite.workloads import WORKLOADS

    register_llama_prompt()
    started = time.perf_counter()
    # --device cpu: the same estimate on fake CPU tensors, to check this path on a machine without a GPU
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device(args.device)
    result: dict[str, Any] = {"workload": args.workload, "knob": args.run_batch}
    # Built on the fake device itself, with Module.to a no-op while it is built: a fake parameter is moved by
    # swapping it for a new one, which fails ("_apply(): Couldn't swap Conv2d.weight" on the H200, 2026-11-28,
    # made on the CPU or under torch.device(device); the same on the CPU with --device cpu), and made under
    # torch.device(device) it is where .to() would put it.
    with FakeTensorMode(), torch.device(device), mock.patch.object(torch.nn.Module, "to", _stay):
        built = WORKLOADS[args.workload].build(torch, device, args.run_batch, args.seed, args.steps)
        tracker = MemTracker()
        tracker.track_external(*[x for x in (built.model, built.opt) if x is not None])
        with tracker:  # one context around both steps, as TorchTitan's estimator does
            for k in range(2):
                inputs = fake_inputs(torch, args.workload, device, args.run_batch)
                if built.opt is None:
                    with torch.no_grad():
                        built.loss(inputs)
                else:
                    built.loss(inputs).backward()
                    built.opt.step()
                    built.opt.zero_grad(set_to_none=True)
                if k == 0:
                    tracker.reset_mod_stats()  # the first step makes the optimizer's state
        peak = tracker.get_tracker_snapshot("peak")[device]["Total"]
    result.update(estimate=int(peak), seconds=round(time.perf_counter() - started, 2), torch=torch.__version__)
    if device.type == "cuda":
        result.update(gpu=torch.cuda.get_device_name(device),
                      device_total=torch.cuda.get_device_properties(device).total_memory)
    gpu_child.print_result(MEMTRACKER_TAG, result)
    return 0


def child_main(args: argparse.Namespace) -> int:
    from suite.child import child_main as suite_child

    register_llama_prompt()
    return suite_child(args)
