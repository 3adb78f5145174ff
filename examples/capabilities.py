#!/usr/bin/env python3
"""What works where: PyTorch's allocator, torchalloc through the C++ bridge, and
torchalloc on the plain pluggable route, scenario by scenario.

    python3 examples/capabilities.py [--routes native,bridge,plain] [--json out.json]

Each (route, scenario) runs in a fresh process (the allocator is chosen
before CUDA starts), with a time limit; the table prints what happened, in
a few words, as README.md's table shows it. Without torch or a GPU it
prints `SKIP: <reason>`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one

from torchalloc import _gpu_child as child  # noqa: E402

TAG = "CAPABILITY "
ROUTES = ("native", "bridge", "plain")

SETUP = {
    "native": "",
    "bridge": "import torchalloc; torchalloc.install(bridge=True)\n",
    "plain": "import torchalloc; torchalloc.install(bridge=False)\n",
}

# name -> (what the user does, code that prints its outcome through say())
SCENARIOS: dict[str, tuple[str, str]] = {
    "oom": ("allocate past the device", """
        total = torch.cuda.get_device_properties(0).total_memory
        try:
            x = torch.empty(2 * total, dtype=torch.uint8, device="cuda")
            say(f"no error, data_ptr() = {x.data_ptr()}")
        except torch.OutOfMemoryError:
            y = torch.ones(1 << 20, device="cuda").sum().item()  # and the script goes on
            say("torch.OutOfMemoryError, the script goes on" if y == 1 << 20 else "OutOfMemoryError, then wrong results")
    """),
    "fragmentation": ("6 MiB blocks under fraction 0.05, free every other, ask for 64 MiB", """
        torch.cuda.set_per_process_memory_fraction(0.05)
        blocks = []
        try:
            while len(blocks) < 100000:
                blocks.append(torch.empty(6 << 20, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
        del blocks[::2]
        t0 = time.perf_counter()
        try:
            torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            say("no error")
        except torch.OutOfMemoryError:
            say(f"torch.OutOfMemoryError after {time.perf_counter() - t0:.2f} s")
    """),
    "graph": ("torch.cuda.graph(g) capture of an nn.Linear forward", """
        lin = torch.nn.Linear(512, 512).cuda()
        x = torch.randn(64, 512, device="cuda")
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            lin(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = lin(x)
        g.replay()
        say("works" if torch.allclose(y, lin(x)) else "replays wrong results")
    """),
    "compile": ('torch.compile(model, mode="reduce-overhead")', """
        m = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        f = torch.compile(m, mode="reduce-overhead")
        x, y = torch.randn(32, 128, device="cuda"), torch.randn(32, 128, device="cuda")
        losses = []
        for _ in range(6):
            loss = torch.nn.functional.mse_loss(f(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            losses.append(loss.item())
        say("works, trains" if losses[-1] < losses[0] else f"runs, loss did not fall: {losses}")
    """),
    "cudnn": ("torch.backends.cudnn.benchmark = True and a conv net", """
        torch.backends.cudnn.benchmark = True
        c = torch.nn.Conv2d(3, 16, 3).cuda()
        c(torch.randn(8, 3, 64, 64, device="cuda")).sum().backward()
        say("works")
    """),
    "stats": ("torch.cuda.memory_allocated(), memory_stats(), max_memory_reserved(), reset_peak_memory_stats()", """
        x = torch.empty(1 << 20, device="cuda")
        a = torch.cuda.memory_allocated(); torch.cuda.memory_stats(); torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        say("works" if a >= 4 << 20 else f"wrong: memory_allocated() = {a}")
    """),
    "snapshot": ("torch.cuda.memory._record_memory_history() and _snapshot() for memory_viz", """
        from torch.cuda import _memory_viz
        torch.cuda.memory._record_memory_history()
        x = torch.empty(1 << 20, device="cuda")
        snap = torch.cuda.memory._snapshot()
        _memory_viz.trace_plot(snap); _memory_viz.segment_plot(snap)
        framed = sum(1 for s in snap["segments"] for b in s["blocks"] if b.get("frames"))
        say(f"works ({framed} blocks with frames)")
    """),
    "mempool": ("torch.cuda.MemPool() with use_mem_pool", """
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            x = torch.ones(1 << 20, device="cuda")
        say("works" if x.sum().item() == 1 << 20 else "wrong results")
    """),
}


def child_main(route: str, scenario: str) -> int:
    code = SETUP[route] + "import torch, time\n" + textwrap.dedent(SCENARIOS[scenario][1])
    def say(text: str) -> None:
        print(TAG + json.dumps(text), flush=True)
    try:
        exec(compile(code, f"<{scenario}>", "exec"), {"say": say, "__name__": "__capability__"})
    except Exception as e:  # the outcome to report, in its own words
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        say(f"{type(e).__name__}: {first[:160]}")
    return 0


def run(route: str, scenario: str, lib: Path, timeout: float) -> str:
    env = dict(os.environ, TORCHALLOC_LIB=str(lib))
    env.pop("TORCHALLOC_CONF", None)
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--child", route, scenario], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"does not return within {timeout:.0f} s"
    lines = [json.loads(line[len(TAG):]) for line in done.stdout.splitlines() if line.startswith(TAG)]
    if lines:
        return lines[-1]
    fatal = [line for line in done.stderr.splitlines() if "torchalloc: fatal" in line]
    if fatal:
        return f"process stopped ({time.perf_counter() - start:.1f} s) with: {fatal[0][:150]}"
    return f"process died (exit {done.returncode}): {child.tail(done.stderr, 3)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routes", default=",".join(ROUTES))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--lib", default=str(example_start.default_library()))
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--json", type=Path)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(*args.child)
    reason = child.skip_reason()
    if reason:
        example_start.cannot_run(reason)
    lib = Path(args.lib).resolve()
    if child.library_missing(lib):
        return 1
    routes = [r for r in args.routes.split(",") if r]
    table: dict[str, dict[str, str]] = {}
    for scenario in [s for s in args.scenarios.split(",") if s]:
        table[scenario] = {}
        for route in routes:
            outcome = run(route, scenario, lib, args.timeout)
            table[scenario][route] = outcome
            print(f"{scenario:<14} {route:<7} {outcome}", flush=True)
    print("\n| what a user does | " + " | ".join(routes) + " |")
    print("|---" * (len(routes) + 1) + "|")
    for scenario, row in table.items():
        print(f"| {SCENARIOS[scenario][0]} | " + " | ".join(row[r] for r in routes) + " |")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
