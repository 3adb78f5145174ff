#!/usr/bin/env python3
"""A fragmentation out-of-memory, diagnosed and fixed.

    python3 examples/fragmentation_demo.py [--cap-mib 150] [--lib build/libtorchalloc.so] [--json out.json]

The workload is training-shaped: each step's activations grow with a
sequence-length curriculum (2 MiB -> 9.5 MiB tensors, with noise), and in
the middle of every forward a rolling cache keeps a 1.5 MiB entry (the last
40 stay). Live memory never exceeds ~100 MiB. Under a memory fraction of
--cap-mib (150 MiB by default):

1. PyTorch's allocator runs out of memory: the cache entries, allocated
   between activations, pin 20 MiB segments whose holes the next, larger
   activations cannot use;
2. torchalloc's `caching` policy with ordinary segments (expandable:off:
   PyTorch's behaviour) runs out at the same step, and its report says
   *fragmentation*, names the line that allocates the cache entries as the
   blocks that pin the segments, and gives advice computed from the numbers
   at the failure, one line each with what it rests on: expandable:reclaim
   (the bytes in whole free granules against the request), phase_arena
   (the cache entries' phase pins the activations' segments); `torchalloc
   report` on its log replays the run up to the failure under every policy
   and variant and marks each line confirmed or not;
3. the first line of that advice, followed in a fresh process, completes
   the workload under the same cap; so does `phase_arena` (the activations
   and the cache in arenas of their own);
4. torchalloc as installed with nothing set (caching, expandable:reclaim
   where the driver has virtual memory management: the setting the advice
   names, made the default) completes it too: the
   free granules between the cache entries are mapped again where the
   next activation needs them.

Each run is its own process (the allocator is chosen before CUDA starts).
Without torch or a GPU it prints `SKIP: <reason>`. The same workload drives
the simulated device in python/tests/test_oom_diagnosis.py.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
import example_start  # noqa: E402  (beside this file: which torchalloc, and SKIP)
example_start.choose_torchalloc()  # the source tree's when it has a built library, else the installed one

MiB = 1 << 20
TAG = "FRAGMENTATION_DEMO "
STEPS, ACTIVATIONS, CACHE_ENTRY, CACHE_KEPT = 120, 4, 1.5, 40


def workload(seed: int = 0) -> Iterator[tuple[str, int, int, str]]:
    """The allocation sequence: ("alloc", key, bytes, phase) and ("free", key, 0, phase), step by step."""
    rnd = random.Random(seed)
    key = 0
    cache: list[int] = []
    for step in range(STEPS):
        length = 2 + 7.5 * step / STEPS + rnd.uniform(-0.3, 0.3)  # the curriculum's sequence length, in MiB
        activations = []
        for j in range(ACTIVATIONS):
            key += 1
            activations.append(key)
            yield ("alloc", key, int(length * MiB), "forward")
            if j % 2 == 1:  # mid-forward, twice: the rolling cache keeps an entry
                key += 1
                cache.append(key)
                yield ("alloc", key, int(CACHE_ENTRY * MiB), "cache")
        for k in activations:
            yield ("free", k, 0, "forward")
        while len(cache) > CACHE_KEPT:
            yield ("free", cache.pop(0), 0, "cache")


def live_peak() -> int:
    live: dict[int, int] = {}
    peak = 0
    for op, key, size, _ in workload():
        if op == "alloc":
            live[key] = size
        else:
            live.pop(key)
        peak = max(peak, sum(live.values()))
    return peak


# ---------------------------------------------------------------------------
# Child: one allocator
# ---------------------------------------------------------------------------


def child(allocator: str, cap: int, log: str | None) -> dict[str, Any]:
    """One run; `allocator` is "native" or a policy with settings: "caching", "caching,expandable:1"."""
    import torch

    phase = None
    if allocator != "native":
        import torchalloc

        if allocator == "default":
            torchalloc.install(log=log, stacks=True, bridge=True)
        else:  # a policy with settings; ordinary segments unless they say otherwise (PyTorch's behaviour)
            policy, *settings = allocator.split(",")
            conf = {"expandable": "off", **dict(item.split(":", 1) for item in settings)}
            torchalloc.install(policy=policy, log=log, stacks=True, bridge=True, **conf)
        phase = torchalloc.phase
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)
    tensors: dict[int, Any] = {}
    try:
        for op, key, size, name in workload():
            if op == "free":
                del tensors[key]
                continue
            with phase(name) if phase is not None else contextlib.nullcontext():
                if name == "cache":
                    tensors[key] = torch.empty(size, dtype=torch.uint8, device="cuda")  # a rolling-cache entry
                else:
                    tensors[key] = torch.empty(size, dtype=torch.uint8, device="cuda")  # an activation
        return {"completed": True, "peak_reserved": torch.cuda.max_memory_reserved(),
                "peak_allocated": torch.cuda.max_memory_allocated()}
    except torch.OutOfMemoryError as e:
        out: dict[str, Any] = {"completed": False, "error": str(e), "live_at_failure": torch.cuda.memory_allocated(),
                               "reserved_at_failure": torch.cuda.memory_reserved()}
        if allocator != "native":
            import torchalloc

            oom = torchalloc.last_oom()
            out["verdict"] = oom.verdict if oom else None
            out["report"] = oom.report if oom else ""
            out["advice"] = [str(a) for a in torchalloc.parse_advice(str(e))]  # as the exception says it
            out["advised"] = next((a.conf for a in torchalloc.parse_advice(str(e)) if a.setting), {})
        return out


# ---------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------


def run(allocator: str, cap: int, log: str | None, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", allocator, "--cap-mib", str(cap // MiB)]
    if log:
        cmd += ["--log", log]
    env = dict(os.environ)
    env.pop("TORCHALLOC_CONF", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    return {"completed": False, "error": f"child exited {done.returncode}: {done.stderr[-2000:]}"}


def report_of(log: str) -> dict[str, Any]:
    from torchalloc.report.text import report

    data = report(log)
    return data["ooms"][-1] if data["ooms"] else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cap-mib", type=int, default=150)
    p.add_argument("--log", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path)
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args(argv)
    cap = args.cap_mib * MiB
    if args.child:
        print(TAG + json.dumps(child(args.child, cap, args.log)), flush=True)
        return 0
    from torchalloc import _gpu_child

    reason = _gpu_child.skip_reason()
    if reason:
        example_start.cannot_run(reason)
    print(f"workload: live peak {live_peak() / MiB:.0f} MiB, memory fraction capped at {cap / MiB:.0f} MiB\n")
    log = f"/tmp/fragmentation_demo_{os.getpid()}.talog"
    results = {
        "native": run("native", cap, None, args.timeout),
        "caching": run("caching", cap, log, args.timeout),
        "phase_arena": run("phase_arena", cap, None, args.timeout),
        "default": run("default", cap, None, args.timeout),
    }
    native, caching, arena, default = results["native"], results["caching"], results["phase_arena"], results["default"]
    print("== PyTorch's allocator:", "completed" if native["completed"] else "out of memory")
    if not native["completed"]:
        print(native["error"].strip()[:1500])
        print(f"(live tensors at the failure: {native['live_at_failure'] / MiB:.1f} MiB)")
    print("\n== torchalloc caching:", "completed" if caching["completed"] else f"out of memory, verdict {caching.get('verdict')}")
    advised: dict[str, Any] = {"completed": False}
    if not caching["completed"]:
        print(caching.get("report", caching["error"]))
        print("The advice, as the torch.OutOfMemoryError message gives it:")
        for line in caching.get("advice", []):
            print("  " + line)
        diagnosis = report_of(log)
        results["caching_log_report"] = diagnosis
        print("`torchalloc report` on its log:", diagnosis.get("explanation", ""))
        print("and its check of each advice line, by replaying the run up to the failure:")
        for a in diagnosis.get("advice", []):
            print(f"  {a['number']}. {a['text'][:90]}...\n     -> {a['check']}")
        setting = caching.get("advised") or {}
        if setting:
            name = ",".join(["caching"] + [f"{k}:{v}" for k, v in setting.items()])
            advised = results["advised"] = run(name, cap, None, args.timeout)
            print(f"\n== the first advice line followed ({name}):",
                  "completed" if advised["completed"] else "out of memory")
            if advised["completed"]:
                print(f"peak reserved {advised['peak_reserved'] / MiB:.0f} MiB, "
                      f"peak allocated {advised['peak_allocated'] / MiB:.0f} MiB")
    print("\n== torchalloc phase_arena:", "completed" if arena["completed"] else "out of memory")
    if arena["completed"]:
        print(f"peak reserved {arena['peak_reserved'] / MiB:.0f} MiB, peak allocated {arena['peak_allocated'] / MiB:.0f} MiB")
    print("\n== torchalloc, installed with nothing set:", "completed" if default["completed"] else "out of memory")
    if default["completed"]:
        print(f"peak reserved {default['peak_reserved'] / MiB:.0f} MiB, peak allocated "
              f"{default['peak_allocated'] / MiB:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    ok = (not native["completed"] and not caching["completed"] and caching.get("verdict") == "fragmentation"
          and advised["completed"] and arena["completed"] and default["completed"])
    print("\nOK" if ok else "\nUNEXPECTED: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
