#!/usr/bin/env python3
"""Write small_snapshot.pickle: a hand-built PyTorch memory snapshot for the replay tests.

It mimics what torch.cuda.memory._dump_snapshot() pickles (plain dicts,
lists, tuples, ints and strings; no torch needed), including a history that
begins mid-run, as a full ring buffer does:

- before the history: segment S0 (2 MiB, small pool) holds P (512 KiB, still
  live at the end) and segment S1 (20 MiB) holds Q (4 MiB, freed during the
  history). PyTorch thus held 22 MiB reserved when the history began.
- the history: A 8 MiB, B 8 MiB, free Q, C 2 MiB, free A, D 9 MiB, free B,
  free C, free D, empty_cache releases S1, S2 (24 MiB) is reserved for
  E 24 MiB, and a stray second free of A.

Replayed with the prelude (P and Q reconstructed at the start), the events
are: Q, P, A, B, -Q, C, -A, D, -B, -C, -D, E, -A. The answers the tests
check are worked out in python/tests/test_replay.py.

    python3 python/tests/data/make_small_snapshot.py   # rewrites the file beside it
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

MiB = 1 << 20
KiB = 1 << 10
S0 = 0x7F0000000000
S1 = 0x7F0000200000
S2 = S1 + 20 * MiB
P, Q = S0, S1
A, B, C, D, E = S1 + 4 * MiB, S1 + 12 * MiB, S1, S1 + 2 * MiB, S2
STREAM = 0

_time = [1_700_000_000_000_000]


def frames(name: str) -> list[dict[str, Any]]:
    return [
        {"filename": "train.py", "line": 42, "name": name},
        {"filename": "torch/nn/modules/module.py", "line": 1736, "name": "_call_impl"},
    ]


def entry(action: str, addr: int, size: int, name: str = "forward") -> dict[str, Any]:
    _time[0] += 37
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": STREAM,
        "time_us": _time[0],
        "frames": frames(name),
        "compile_context": "N/A",
        "user_metadata": "",
    }


def free(addr: int, size: int) -> list[dict[str, Any]]:
    return [entry("free_requested", addr, size, "backward"), entry("free_completed", addr, size, "backward")]


def build() -> dict[str, Any]:
    trace = [
        entry("alloc", A, 8 * MiB),
        entry("alloc", B, 8 * MiB),
        *free(Q, 4 * MiB),
        entry("alloc", C, 2 * MiB),
        *free(A, 8 * MiB),
        entry("alloc", D, 9 * MiB),
        entry("free_completed", B, 8 * MiB),
        entry("free_completed", C, 2 * MiB),
        entry("free_completed", D, 9 * MiB),
        entry("segment_free", S1, 20 * MiB, "empty_cache"),
        entry("segment_alloc", S2, 24 * MiB),
        entry("alloc", E, 24 * MiB),
        entry("free_completed", A, 8 * MiB),  # a stray free: A is not live
    ]
    segments = [
        {
            "device": 0,
            "address": S0,
            "total_size": 2 * MiB,
            "allocated_size": 512 * KiB,
            "active_size": 512 * KiB,
            "requested_size": 512 * KiB,
            "stream": STREAM,
            "segment_type": "small",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": frames("forward"),
            "blocks": [
                {"address": P, "size": 512 * KiB, "requested_size": 512 * KiB, "state": "active_allocated",
                 "frames": frames("forward")},
                {"address": P + 512 * KiB, "size": 1536 * KiB, "requested_size": 0, "state": "inactive",
                 "frames": []},
            ],
        },
        {
            "device": 0,
            "address": S2,
            "total_size": 24 * MiB,
            "allocated_size": 24 * MiB,
            "active_size": 24 * MiB,
            "requested_size": 24 * MiB,
            "stream": STREAM,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": frames("forward"),
            "blocks": [
                {"address": E, "size": 24 * MiB, "requested_size": 24 * MiB, "state": "active_allocated",
                 "frames": frames("forward")},
            ],
        },
    ]
    return {
        "segments": segments,
        "device_traces": [trace, []],  # a second device that did nothing
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_malloc": False,
            "pinned_use_host_register": False,
            "roundup_power2_divisions": {"1": 0},
        },
        "external_annotations": [],
    }


def main() -> None:
    out = Path(__file__).resolve().parent / "small_snapshot.pickle"
    out.write_bytes(pickle.dumps(build(), protocol=4))
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
