#!/usr/bin/env python3
"""torchalloc under DistributedDataParallel and FSDP (fully_shard): every rank, bit for bit against native.

Two GPUs, NCCL (the real thing):

    python3 examples/ddp_example.py --nproc 2 --mode ddp,fsdp --backend nccl --out ddp-out

One GPU, two processes sharing it over gloo (NCCL refuses two ranks on one device):

    python3 examples/ddp_example.py --nproc 2 --mode ddp,fsdp --backend gloo --same-device --out ddp-out

Each run above launches torchrun twice per mode -- once with PyTorch's allocator, once with torchalloc
installed in every rank -- as

    torchrun --standalone --nproc_per_node 2 examples/ddp_example.py --worker --mode ddp --backend nccl \\
        --allocator torchalloc --out ddp-out/ddp

and then compares, per rank: the losses (bit for bit: an allocator must not change a number), peak
allocated (must be equal) and peak reserved (reported side by side). torchalloc runs as install() leaves it
(expandable:reclaim where the driver has virtual memory; --expandable picks another mode), and PyTorch's
allocator with expandable_segments:True unless --expandable off: expandable segments split a block
exactly where ordinary ones keep up to 1 MiB more, so peak allocated is compared like with like. With
torchalloc every rank writes its own log, ddp-out/MODE/run.%r.talog (%r: the rank torchrun exports), and
the end prints the job's report: `torchalloc report 'ddp-out/ddp/run.*.talog'`.

The model is a small MLP (FSDP shards each Linear, then the whole), AdamW, deterministic, on random data
drawn per rank from a seeded generator. Without torch, a CUDA GPU, torch.distributed, or enough GPUs for
the chosen layout it prints `SKIP: <reason>` and exits 0. Build the library first:
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF && cmake --build build -j
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))  # run from a checkout without installing

from torchalloc import _gpu_child as child  # noqa: E402
from torchalloc.units import fmt_bytes  # noqa: E402

DEFAULT_LIB = REPO / "build" / "libtorchalloc.so"
MODES = ("ddp", "fsdp")
SEED = 1234


# ---------------------------------------------------------------------------
# Worker: one rank, started by torchrun
# ---------------------------------------------------------------------------


def float_bits(x: float) -> str:
    return struct.pack("<f", x).hex()


def set_determinism(torch: Any) -> None:
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy TF32 flags still work; only their deprecation is silenced
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def make_model(torch: Any, device: Any) -> Any:
    torch.manual_seed(SEED)  # every rank starts from the same weights, as DDP requires
    nn = torch.nn
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 256)).to(device)


def wrap(torch: Any, model: Any, mode: str, device: Any, backend: str) -> Any:
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if backend == "nccl" else None)
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def worker_main(args: argparse.Namespace) -> int:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    import torch
    import torch.distributed as dist

    route = "native"
    if args.allocator == "torchalloc":
        os.environ["TORCHALLOC_LIB"] = str(Path(args.lib).resolve())
        import torchalloc  # before CUDA starts: PyTorch picks its allocator once

        inst = torchalloc.install(policy=args.policy, expandable=args.expandable,
                                  log=str(Path(args.out) / "run.%r.talog"), stacks=True,
                                  bridge={"auto": None, "bridge": True, "plain": False}[args.route])
        route = inst.route
    device = torch.device("cuda", 0 if args.same_device else local_rank)
    torch.cuda.set_device(device)
    set_determinism(torch)
    if args.backend == "nccl":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    model = wrap(torch, make_model(torch, device), args.mode, device, args.backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(SEED + 1 + rank)  # each rank its own data, as a sampler gives
    losses = []
    for step in range(args.steps):
        x = torch.randn(64, 512, generator=gen).to(device)
        y = torch.randn(64, 256, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if args.allocator == "torchalloc":
            torchalloc.mark(f"step {step}")
    torch.cuda.synchronize(device)
    if args.allocator == "torchalloc":
        peak_reserved, peak_allocated = child.peaks(device.index)
    else:
        peak_reserved = torch.cuda.max_memory_reserved(device)
        peak_allocated = torch.cuda.max_memory_allocated(device)
    result = {"rank": rank, "world": world, "device": device.index, "allocator": args.allocator, "route": route,
              "losses": losses, "loss_bits": [float_bits(v) for v in losses],
              "peak_allocated": peak_allocated, "peak_reserved": peak_reserved}
    (Path(args.out) / f"result.{args.allocator}.{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------
# Driver: torchrun per allocator, then the comparison
# ---------------------------------------------------------------------------


def skip_reason(args: argparse.Namespace) -> str | None:
    why = child.skip_reason()
    if why:
        return why
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available in this build of torch"
    if args.backend == "nccl" and not dist.is_nccl_available():
        return "this torch has no NCCL backend (use --backend gloo)"
    found = torch.cuda.device_count()
    if not args.same_device and found < args.nproc:
        return (f"{args.nproc} ranks on their own GPUs need {args.nproc} GPUs, found {found} "
                "(--backend gloo --same-device runs them on one)")
    return None


def launch(args: argparse.Namespace, mode: str, allocator: str, out: Path) -> str | None:
    """One torchrun; None when every rank finished, else the reason with the output's tail."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
           __file__, "--worker", "--mode", mode, "--backend", args.backend, "--allocator", allocator,
           "--out", str(out), "--steps", str(args.steps), "--lib", str(args.lib), "--policy", args.policy,
           "--route", args.route, "--expandable", args.expandable] + (["--same-device"] if args.same_device else [])
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    env.pop("TORCHALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if allocator == "native" and args.expandable != "off":  # the same kind of segments as torchalloc's
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    print("$ " + " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        return f"torchrun exited {done.returncode}:\n{child.tail(done.stdout + done.stderr, 40)}"
    return None


def compare(args: argparse.Namespace, mode: str, out: Path) -> bool:
    rows, ok = [], True
    for rank in range(args.nproc):
        native = json.loads((out / f"result.native.{rank}.json").read_text())
        ours = json.loads((out / f"result.torchalloc.{rank}.json").read_text())
        same_losses = native["loss_bits"] == ours["loss_bits"]
        same_peak = native["peak_allocated"] == ours["peak_allocated"]
        ok = ok and same_losses and same_peak
        rows.append((rank, ours["device"], "yes" if same_losses else "NO", f"{ours['losses'][-1]:.6f}",
                     fmt_bytes(native["peak_allocated"]), fmt_bytes(ours["peak_allocated"]),
                     "yes" if same_peak else "NO", fmt_bytes(native["peak_reserved"]),
                     fmt_bytes(ours["peak_reserved"]), ours["route"]))
    head = ("rank", "device", "losses bit-equal", "last loss", "peak alloc native", "torchalloc", "equal",
            "peak reserved native", "torchalloc", "route")
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    return ok


def job_report(out: Path) -> None:
    logs = sorted(out.glob("run.*.talog"))
    print(f"{len(logs)} rank logs: torchalloc report '{out}/run.*.talog'")
    try:
        from torchalloc.analysis.job import analyze_job
    except ImportError as e:  # numpy missing: the tools are optional in a training environment
        print(f"(the job report needs the tools: {e})")
        return
    if logs:
        print(analyze_job([str(p) for p in logs]).why_highest())


def driver_main(args: argparse.Namespace) -> int:
    why = skip_reason(args)
    if why:
        print(f"SKIP: {why}")
        return 0
    if child.library_missing(Path(args.lib)):
        return 1
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    status = 0
    for mode in modes:
        out = Path(args.out) / mode
        for old in out.glob("*"):
            old.unlink()
        layout = "one GPU shared" if args.same_device else f"{args.nproc} GPUs"
        native_kind = "ordinary segments" if args.expandable == "off" else "expandable_segments:True"
        print(f"== {mode}: {args.nproc} ranks, {args.backend}, {layout}, torchalloc policy {args.policy} "
              f"expandable:{args.expandable}, native with {native_kind}")
        failed = launch(args, mode, "native", out) or launch(args, mode, "torchalloc", out)
        if failed:
            print(f"FAILED {mode}: {failed}")
            status = 1
            continue
        if compare(args, mode, out):
            print(f"OK {mode}: every rank's losses bit-for-bit equal to native's, peak allocated equal")
        else:
            print(f"FAILED {mode}: a rank's losses or peak allocated differ from native's")
            status = 1
        job_report(out)
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--mode", default="ddp,fsdp", help="ddp, fsdp, or both (default ddp,fsdp)")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--same-device", action="store_true", help="every rank on cuda:0 (one GPU; use gloo)")
    ap.add_argument("--policy", default="caching")
    ap.add_argument("--route", choices=("auto", "bridge", "plain"), default="auto")
    ap.add_argument("--expandable", choices=("off", "on", "compact", "reclaim"), default="reclaim",
                    help="torchalloc's segments (default: reclaim, install()'s); native runs with "
                    "expandable_segments:True unless off")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lib", default=str(DEFAULT_LIB))
    ap.add_argument("--out", default="ddp-out")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", choices=("native", "torchalloc"), default="torchalloc", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker_main(args)
    return driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
