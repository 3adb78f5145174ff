"""A CUDA tensor sent to another process (torch.multiprocessing, spawn), for test_ipc_gpu.py.

    python ipc_child.py SENDER RECEIVER

Each side is "torchalloc" (install(), the bridge, the default: mapped
memory), "torchalloc-off" (install(expandable="off"): ordinary segments),
"native" or "native-expandable" (PyTorch's allocator, without or with
expandable_segments:True). A sender "torchalloc-run" is "torchalloc" with
1 GiB kept first and a 128 MiB tensor sent, so that the block lies on runs
of the warm-up (the default's `run`), which PyTorch's format cannot carry:
the sender remaps them a granule a handle before it sends, and says how
many handles that made. The sender fills a tensor and puts it on a queue;
the receiver opens it, reads it and adds 1 in place (shared memory: the
sender sees it). Then the sender drops its tensor and empties its cache and
fills new tensors of the same size with -1: none may land on the memory the
receiver still holds, which must still read what it read plus 1. When the
receiver has let go, torch.cuda.ipc_collect() frees the block in the sender.
Prints one RESULT line of JSON (gpu_child.py's convention).
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
from typing import Any

N = 3 << 20  # float32s: 12 MiB, a large-pool block
RUN_N = 32 << 20  # float32s: 128 MiB, grown past 1 GiB in the first ramp: on runs ("torchalloc-run")
RUN_BASE = 1 << 30  # bytes kept before it: a run is at most 1/64 of the reserve, so none below 1 GiB
WAIT = 90  # seconds for the other side at each step


def setup(kind: str) -> None:
    """Choose this process's allocator, before CUDA starts."""
    if kind.startswith("torchalloc"):
        import torchalloc

        torchalloc.install(bridge=True, **({"expandable": "off"} if kind.endswith("-off") else {}))


def handles_made() -> int:
    """torchalloc's count of physical handles made so far on device 0."""
    from torchalloc import _lib

    return int(_lib.get_stats(0).num_handles_created)


def receiver(kind: str, data: Any, to_sender: Any, from_sender: Any) -> None:
    faulthandler.dump_traceback_later(3 * WAIT, exit=True)
    try:
        setup(kind)
        import torch

        x = data.get(timeout=WAIT)
        first = x.sum(dtype=torch.float64).item()  # exact: small integers
        x.add_(1.0)
        torch.cuda.synchronize()
        to_sender.put(("opened", first, x.device.index))
        from_sender.get(timeout=WAIT)  # the sender has dropped its tensor and reused its memory
        again = x.sum(dtype=torch.float64).item()
        del x
        torch.cuda.synchronize()
        to_sender.put(("closed", again, ""))
    except Exception as e:  # the sender reports it
        to_sender.put(("error", 0.0, f"{type(e).__name__}: {e}"))
    from_sender.get(timeout=WAIT)  # stay alive until the sender is done


def main() -> int:
    sender, receiving = sys.argv[1], sys.argv[2]
    faulthandler.dump_traceback_later(4 * WAIT, exit=True)
    if sender == "native-expandable" or receiving == "native-expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # the receiver inherits it
    setup(sender)
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    data, to_sender, from_sender = ctx.Queue(), ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=receiver, args=(receiving, data, to_sender, from_sender))
    proc.start()
    on_runs = sender.endswith("-run")
    n = RUN_N if on_runs else N
    base = torch.empty(RUN_BASE if on_runs else 0, dtype=torch.uint8, device="cuda")
    pad = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")  # the sent block is not at a segment's start
    x = torch.arange(n, dtype=torch.float32, device="cuda") % 7
    expected = x.sum(dtype=torch.float64).item()
    addr = x.data_ptr()
    made = handles_made() if sender.startswith("torchalloc") else 0
    data.put(x)
    tag, first, detail = to_sender.get(timeout=WAIT)
    result: dict[str, Any] = {"sender": sender, "receiver": receiving, "n": n, "expected": expected, "tag": tag,
                              "first": first, "detail": detail,
                              "handles_made_by_send": handles_made() - made if sender.startswith("torchalloc") else 0}
    if tag == "opened":
        torch.cuda.synchronize()
        result["sender_sees"] = x.sum(dtype=torch.float64).item()
        del x
        torch.cuda.empty_cache()
        fills = [torch.full((n,), -1.0, device="cuda") for _ in range(3)]
        torch.cuda.synchronize()
        result["reused_while_open"] = any(f.data_ptr() <= addr < f.data_ptr() + 4 * n for f in fills)
        del fills
        from_sender.put("check")
        tag, again, detail = to_sender.get(timeout=WAIT)
        result.update(tag=tag, again=again, detail=detail)
        held = torch.cuda.memory_allocated()
        torch.cuda.ipc_collect()  # frees what was sent once every receiver closed it
        result["freed_after_close"] = held - torch.cuda.memory_allocated()
    from_sender.put("bye")
    proc.join(WAIT)
    result["receiver_exit"] = proc.exitcode
    del pad, base
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
