#!/usr/bin/env python3
"""Replay speed: events per second per policy (`torchalloc replay`'s C loop).

    python3 bench/bench_replay.py [--events 5000000] [--repeat 3] [--lib build/libtorchalloc.so]

Synthesises a training-like trace (a fixed set of long-lived parameter and
optimiser blocks, then steps that allocate activations and free them mostly
in reverse order, with sizes scaled by a per-step sequence length) of about
--events events, replays it through each policy on the simulated device with
unlimited capacity, and prints the best of --repeat runs. Also times the
bundled default trace when it is there. The target is >= 5 M events/s per
policy (RMM's replay benchmark does about 2 M/s).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from torchalloc.replay import engine as replay
from torchalloc.log import trace  # noqa: E402
from torchalloc.log.trace import ALLOC, EVENT_DTYPE, FREE  # noqa: E402

MiB = 1 << 20


def step_template(rng: np.random.Generator, n_allocs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step's (kind, slot, base size): allocations interleaved with frees, mostly LIFO."""
    kinds, slots = [], []
    live: list[int] = []
    nxt = 0
    while nxt < n_allocs or live:
        if nxt < n_allocs and (not live or rng.random() < 0.55):
            kinds.append(ALLOC)
            slots.append(nxt)
            live.append(nxt)
            nxt += 1
        else:
            i = len(live) - 1 if rng.random() < 0.8 else int(rng.integers(len(live)))
            kinds.append(FREE)
            slots.append(live.pop(i))
    # Sizes: many small (biases, norms), some medium, a few large activations.
    base = np.exp(rng.normal(np.log(256 * 1024), 2.2, n_allocs)).clip(512, 256 * MiB)
    return np.array(kinds, np.uint8), np.array(slots, np.int64), base


def synthesise(n_events: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_params = 400
    kinds, slots, base = step_template(rng, 1500)
    steps = max(1, (n_events - n_params) // len(kinds))
    scale = rng.uniform(0.25, 1.0, steps)  # sequence length / max
    ev = np.zeros(n_params + steps * len(kinds), dtype=EVENT_DTYPE)
    ev["kind"][:n_params] = ALLOC
    ev["addr"][:n_params] = np.arange(n_params, dtype=np.uint64) + 1
    ev["size"][:n_params] = np.exp(rng.normal(np.log(4 * MiB), 1.5, n_params)).clip(512, 512 * MiB).astype(np.uint64)
    body = ev[n_params:].reshape(steps, len(kinds))
    body["kind"] = kinds
    # Unique addresses per step, like a real trace's reuse of freed addresses needs no care: ids suffice.
    body["addr"] = ((np.arange(steps, dtype=np.uint64)[:, None] + 1) << np.uint64(20)) + slots.astype(np.uint64)
    sizes = (base[slots][None, :] * scale[:, None]).astype(np.uint64)
    body["size"] = np.where(kinds[None, :] == ALLOC, np.maximum(sizes, 1), 0)
    return ev


def bench(events: np.ndarray, policies: list[str], repeat: int) -> dict[str, float]:
    rates = {}
    for policy in policies:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            result, _ = replay.replay_once(events, policy)
            best = min(best, time.perf_counter() - t0)
        rates[policy] = len(events) / best
        print(f"  {policy:<12} {len(events) / best / 1e6:6.2f} M events/s  ({best * 1e3:7.1f} ms; peak reserved "
              f"{result['peak_reserved'] / MiB:,.0f} MiB, {result['device_allocs']:,} device allocations)")
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", default=",".join(replay.DEFAULT_POLICIES))
    ap.add_argument("--lib", help="libtorchalloc.so to use (default: $TORCHALLOC_LIB, then the usual places)")
    args = ap.parse_args()
    if args.lib:
        os.environ["TORCHALLOC_LIB"] = args.lib
    policies = [p for p in args.policies.split(",") if p]
    from torchalloc import _lib

    print(f"library: {_lib.library_path()}")
    t0 = time.perf_counter()
    events = synthesise(args.events)
    print(f"synthetic trace: {len(events):,} events ({time.perf_counter() - t0:.1f} s to build)")
    bench(events, policies, args.repeat)
    if replay.DEFAULT_TRACE.is_file():
        t0 = time.perf_counter()
        default = trace.load_trace(replay.DEFAULT_TRACE)
        print(f"bundled trace: {len(default):,} events ({time.perf_counter() - t0:.1f} s to load)")
        bench(default.events, policies, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
