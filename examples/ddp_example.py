#!/usr/bin/env python3
"""torchalloc under DistributedDataParallel, FSDP and NCCL's collectives: every rank, bit for bit against native.

Two GPUs, NCCL (the real thing):

    python3 examples/ddp_example.py --nproc 2 --mode ddp,fsdp --backend nccl --out ddp-out

One GPU, two processes sharing it over gloo (NCCL refuses two ranks on one device):

    python3 examples/ddp_example.py --nproc 2 --mode ddp,fsdp --backend gloo --same-device --out ddp-out

Each run above launches torchrun twice per mode -- once with PyTorch's allocator, once with torchalloc
installed in every rank -- as

    torchrun --standalone --nproc_per_node 2 examples/ddp_example.py --worker --mode ddp --backend nccl \\
        --allocator torchalloc --out ddp-out/ddp

and then compares, per rank: the losses (bit for bit: an allocator must not change a number), the
allocated bytes at each step's end once the device is idle and peak allocated (equal over gloo; over NCCL
they depend on timing under either allocator -- when NCCL's stream is done with blocks freed meanwhile,
when its watchdog thread drops a finished collective's tensors -- and two runs of PyTorch's own allocator
differ, so they are shown side by side) and peak reserved (side by side). torchalloc runs as install() leaves it
(expandable:reclaim where the driver has virtual memory; --expandable picks another mode), and PyTorch's
allocator with expandable_segments:True unless --expandable off: expandable segments split a block
exactly where ordinary ones keep up to 1 MiB more, so peak allocated is compared like with like. With
torchalloc every rank writes its own log, ddp-out/MODE/run.%r.talog (%r: the rank torchrun exports), and
the end prints the job's report: `torchalloc report 'ddp-out/ddp/run.*.talog'`.

The model is a small MLP (FSDP shards each Linear, then the whole), AdamW, deterministic, on random data
drawn per rank from a seeded generator. Other modes exercise the collectives a mixture-of-experts model
uses, their sizes changing every step: `p2p` (each rank sends to the next and receives from the previous,
batch_isend_irecv), `alltoall` (all_to_all_single with uneven splits, then each rank's "expert" works on
what it received); their per-step "losses" are checksums of what was received. `oom` trains two steps and
then the last rank asks for more memory than its GPU has: the driver checks that every run saw that rank
fail, and that the job report (`torchalloc report 'run.*.talog'`) and that rank's OOM report name it.

Every worker dumps its Python stacks and exits when it has not finished after --hang-after seconds
(faulthandler), and torchrun's whole process group is killed at --timeout: a hang ends with what each
rank was doing. Without torch, a CUDA GPU, torch.distributed, or enough GPUs for the chosen layout it
prints `SKIP: <reason>` and exits 77. Build the library first:
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF && cmake --build build -j
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one

from torchalloc import _gpu_child as child  # noqa: E402
from torchalloc.units import fmt_bytes  # noqa: E402

DEFAULT_LIB = example_start.default_library()
MODES = ("ddp", "fsdp", "p2p", "alltoall", "oom")
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


def settled_allocated(torch: Any, device: Any, allocated: Any) -> int:
    """Allocated bytes (`allocated(device)`) once the device is idle and every deferred free is done. Blocks a
    side stream used (record_stream, as NCCL's does) count as allocated until an event says that stream is
    done with them, under either allocator; one small allocation makes the allocator look. Over gloo this is
    a number that does not depend on timing; over NCCL it still does: NCCL's watchdog thread drops its
    references to a collective's tensors when it notices the collective finished."""
    torch.cuda.synchronize(device)
    torch.empty(1, device=device)
    return int(allocated(device))


def train_steps(torch: Any, args: argparse.Namespace, device: Any, rank: int, steps: int, mark: Any,
                settled: list[int], allocated: Any) -> list[float]:
    """DDP or FSDP (oom: DDP) training steps; their losses. `settled` gets settled_allocated() after each."""
    model = wrap(torch, make_model(torch, device), "fsdp" if args.mode == "fsdp" else "ddp", device, args.backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(SEED + 1 + rank)  # each rank its own data, as a sampler gives
    losses = []
    for step in range(steps):
        x = torch.randn(64, 512, generator=gen).to(device)
        y = torch.randn(64, 256, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        settled.append(settled_allocated(torch, device, allocated))
        mark(f"step {step}")
    return losses


def tokens(step: int, src: int, dst: int) -> int:
    """Rows rank `src` sends rank `dst` at `step`: uneven and changing, as a router's choices are."""
    return 64 * (1 + (step * 7 + src * 3 + dst * 5) % 11)


def collective_steps(torch: Any, args: argparse.Namespace, device: Any, rank: int, world: int,
                     mark: Any, settled: list[int], allocated: Any) -> list[float]:
    """p2p: a ring of sends and receives; alltoall: the MoE exchange and an expert's matmul. Each step's
    checksum of what this rank received."""
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(SEED + 1 + rank)
    expert = torch.randn(256, 256, generator=torch.Generator().manual_seed(SEED)).to(device)
    sums = []
    for step in range(args.steps):
        if args.mode == "p2p":
            nxt, prev = (rank + 1) % world, (rank - 1) % world
            out = torch.randn(tokens(step, rank, nxt), 256, generator=gen).to(device)
            got = torch.empty(tokens(step, prev, rank), 256, device=device)
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prev)]):
                req.wait()
        else:
            send = [tokens(step, rank, j) for j in range(world)]
            recv = [tokens(step, j, rank) for j in range(world)]
            out = torch.randn(sum(send), 256, generator=gen).to(device)
            got = torch.empty(sum(recv), 256, device=device)
            dist.all_to_all_single(got, out, output_split_sizes=recv, input_split_sizes=send)
            got = torch.relu(got @ expert)  # the expert's work on the tokens routed to it
        sums.append(got.double().sum().item())
        settled.append(settled_allocated(torch, device, allocated))
        mark(f"step {step}")
    return sums


def ask_too_much(torch: Any, device: Any) -> str:
    """The failing request of `oom`: more than the whole GPU. The exception's first line."""
    total = torch.cuda.get_device_properties(device).total_memory
    try:
        torch.empty(total + (1 << 30), dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError as e:
        return str(e).splitlines()[0]
    return ""


def worker_main(args: argparse.Namespace) -> int:
    faulthandler.dump_traceback_later(args.hang_after, exit=True)  # a hang prints every thread's stack, then ends
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

    def mark(label: str) -> None:
        if args.allocator == "torchalloc":
            torchalloc.mark(label)

    oom_message = ""
    settled: list[int] = []
    # torch.cuda.memory_allocated raises on the plain route (a plain pluggable allocator has no stats): ask ours.
    allocated = torchalloc.memory_allocated if args.allocator == "torchalloc" else torch.cuda.memory_allocated
    if args.mode in ("p2p", "alltoall"):
        losses = collective_steps(torch, args, device, rank, world, mark, settled, allocated)
    else:
        steps = 2 if args.mode == "oom" else args.steps
        losses = train_steps(torch, args, device, rank, steps, mark, settled, allocated)
        if args.mode == "oom" and rank == world - 1:
            oom_message = ask_too_much(torch, device)
    torch.cuda.synchronize(device)
    if args.allocator == "torchalloc":
        peak_reserved, peak_allocated = child.peaks(device.index)
    else:
        peak_reserved = torch.cuda.max_memory_reserved(device)
        peak_allocated = torch.cuda.max_memory_allocated(device)
    result = {"rank": rank, "world": world, "device": device.index, "allocator": args.allocator, "route": route,
              "losses": losses, "loss_bits": [float_bits(v) for v in losses],
              "peak_allocated": peak_allocated, "peak_reserved": peak_reserved, "oom": oom_message,
              "settled": settled}
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
    """One torchrun; None when every rank finished, else the reason with the output's tail. At --timeout
    the whole process group goes (torchrun and every rank), so nothing is left holding a GPU."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
           __file__, "--worker", "--mode", mode, "--backend", args.backend, "--allocator", allocator,
           "--out", str(out), "--steps", str(args.steps), "--lib", str(args.lib), "--policy", args.policy,
           "--route", args.route, "--expandable", args.expandable, "--hang-after", str(args.hang_after)]
    cmd += ["--same-device"] if args.same_device else []
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    env.pop("TORCHALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if allocator == "native" and args.expandable != "off":  # the same kind of segments as torchalloc's
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    print("$ " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return f"torchrun timed out after {args.timeout:.0f} s and was killed:\n{child.tail(output, 60)}"
    if proc.returncode != 0:
        return f"torchrun exited {proc.returncode}:\n{child.tail(output, 60)}"
    return None


def compare(args: argparse.Namespace, mode: str, out: Path) -> bool:  # noqa: C901 (one table, one check per row)
    rows, ok = [], True
    for rank in range(args.nproc):
        native = json.loads((out / f"result.native.{rank}.json").read_text())
        ours = json.loads((out / f"result.torchalloc.{rank}.json").read_text())
        same_losses = native["loss_bits"] == ours["loss_bits"]
        same_settled = native["settled"] == ours["settled"]
        same_peak = native["peak_allocated"] == ours["peak_allocated"]
        # Over NCCL the allocated bytes depend on timing under either allocator: a block NCCL's stream used
        # counts until an event says that stream is done with it, and NCCL's watchdog thread drops its own
        # references when it notices a collective finished. Two runs of PyTorch's allocator differ there
        # (docs/MULTI_GPU.md), so they are shown side by side; over gloo they must be equal.
        timing = args.backend == "nccl"
        ok = ok and same_losses and (timing or (same_settled and same_peak))
        if not same_settled:
            print(f"rank {rank}: allocated at the steps' ends {'(timing) ' if timing else ''}native "
                  f"{native['settled']}, torchalloc {ours['settled']}")
        if mode == "oom":  # the last rank, and only it, must have failed under both allocators
            failed = [bool(native["oom"]), bool(ours["oom"])]
            if failed != [rank == args.nproc - 1] * 2:
                print(f"rank {rank}: out of memory under native / torchalloc: {failed}")
                ok = False
            elif ours["oom"]:
                print(f"rank {rank} ran out of memory as asked; torchalloc said: {ours['oom'][:300]}")
        rows.append((rank, ours["device"], "yes" if same_losses else "NO", f"{ours['losses'][-1]:.6f}",
                     "yes" if same_settled else "timing" if timing else "NO", fmt_bytes(native["peak_allocated"]),
                     fmt_bytes(ours["peak_allocated"]), "yes" if same_peak else "timing" if timing else "NO",
                     fmt_bytes(native["peak_reserved"]),
                     fmt_bytes(ours["peak_reserved"]), ours["route"]))
    head = ("rank", "device", "losses bit-equal", "last loss", "allocated at step ends equal", "peak alloc native",
            "torchalloc", "equal", "peak reserved native", "torchalloc", "route")
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    return ok


def job_report(out: Path, mode: str, nproc: int) -> bool:
    """Print the job report's verdict; for `oom`, check that it and the failing rank's OOM report name that
    rank. False when a check fails."""
    logs = sorted(out.glob("run.*.talog"))
    print(f"{len(logs)} rank logs: torchalloc report '{out}/run.*.talog'")
    try:
        from torchalloc.analysis.job import analyze_job
    except ImportError as e:  # numpy missing: the tools are optional in a training environment
        print(f"(the job report needs the tools: {e})")
        return True
    if not logs:
        return True
    job = analyze_job([str(p) for p in logs])
    print(job.why_highest())
    if mode != "oom":
        return True
    failing = nproc - 1
    said = job.oom_sentence()
    print(said)
    reports = sorted(out.glob(f"run.{failing}.talog.oom-cuda*.txt"))
    head = reports[0].read_text().splitlines()[:3] if reports else []
    print(f"rank {failing}'s OOM report {reports[0] if reports else '(none)'}: {' / '.join(head)[:400]}")
    ok = f"rank {failing} ran out of memory" in said and any(f"rank {failing} of {nproc}" in line for line in head)
    if not ok:
        print(f"FAILED oom: the job report or rank {failing}'s OOM report does not name rank {failing}")
    return ok


def driver_main(args: argparse.Namespace) -> int:
    why = skip_reason(args)
    if why:
        example_start.cannot_run(why)
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
        what = "checksums of what it received" if mode in ("p2p", "alltoall") else "losses"
        if compare(args, mode, out) and job_report(out, mode, args.nproc):
            memory = ("allocated bytes at every step's end and peak allocated equal" if args.backend == "gloo" else
                      "allocated bytes side by side (over NCCL they depend on timing under either allocator)")
            print(f"OK {mode}: every rank's {what} bit-for-bit equal to native's, {memory}")
        else:
            print(f"FAILED {mode}: a rank's {what} or peak allocated differ from native's, or a check above failed")
            status = 1
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--mode", default="ddp,fsdp", help=f"comma-separated, of {', '.join(MODES)} (default ddp,fsdp)")
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
    ap.add_argument("--timeout", type=float, default=300, help="seconds per torchrun, then its process group is killed")
    ap.add_argument("--hang-after", type=float, default=240,
                    help="seconds after which a rank prints every thread's stack and exits (default 240)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", choices=("native", "torchalloc"), default="torchalloc", help=argparse.SUPPRESS)
    args = ap.parse_args()
    bad = [m for m in args.mode.split(",") if m.strip() and m.strip() not in MODES]
    if bad:
        ap.error(f"unknown mode {bad[0]!r} (expected {', '.join(MODES)})")
    if args.worker:
        return worker_main(args)
    return driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
