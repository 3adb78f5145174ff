#!/usr/bin/env python3
"""Do the CUDA driver's virtual-memory calls wait for queued kernels? (H100: no.)

    python3 bench/vmm_async.py [--rounds 3]

reclaim (the default mode) unmaps and maps physical memory while kernels
queued earlier may still run (never memory they use: allocator/segments/
segments_expand.c). That only avoids a stall if cuMemCreate, cuMemMap,
cuMemSetAccess, cuMemUnmap and cuMemRelease do not wait for the device
themselves. This times each over 16 handles of 8 MiB, once with the GPU
idle and once with a 200 ms sleep kernel queued, and says whether the
kernel was still running after the last call. Needs torch and a CUDA GPU
(the driver is reached through ctypes; nothing is built).
"""
from __future__ import annotations

import argparse
import ctypes
import time

HANDLE = 8 << 20
HANDLES = 16
SLEEP_S = 0.2


class AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location_type", ctypes.c_int),
                ("location_id", ctypes.c_int), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int), ("flags", ctypes.c_int)]


def check(result: int, what: str) -> None:
    if result != 0:
        raise SystemExit(f"{what} failed: CUresult {result}")


def one_round(cu: ctypes.CDLL, torch: object, busy: bool, device: int) -> dict[str, float | bool]:
    prop = AllocationProp(type=1, location_type=1, location_id=device)  # pinned, on the device
    access = AccessDesc(location_type=1, location_id=device, flags=3)  # read and write
    base = ctypes.c_uint64()
    check(cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(HANDLE * HANDLES), ctypes.c_size_t(0),
                                 ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
    if busy:
        torch.cuda._sleep(int(2e9 * SLEEP_S))  # ~SLEEP_S of GPU cycles at ~2 GHz
    times: dict[str, float | bool] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name + "_ms"] = (now - t) * 1e3
        t = now

    handles = [ctypes.c_uint64() for _ in range(HANDLES)]
    for h in handles:
        check(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(HANDLE), ctypes.byref(prop), ctypes.c_uint64(0)),
              "cuMemCreate")
    lap("create")
    for i, h in enumerate(handles):
        check(cu.cuMemMap(ctypes.c_uint64(base.value + i * HANDLE), ctypes.c_size_t(HANDLE), ctypes.c_size_t(0), h,
                          ctypes.c_uint64(0)), "cuMemMap")
    lap("map")
    check(cu.cuMemSetAccess(ctypes.c_uint64(base.value), ctypes.c_size_t(HANDLE * HANDLES), ctypes.byref(access),
                            ctypes.c_size_t(1)), "cuMemSetAccess")
    lap("access")
    for i in range(HANDLES):
        check(cu.cuMemUnmap(ctypes.c_uint64(base.value + i * HANDLE), ctypes.c_size_t(HANDLE)), "cuMemUnmap")
    lap("unmap")
    for h in handles:
        check(cu.cuMemRelease(h), "cuMemRelease")
    lap("release")
    done = torch.cuda.Event()
    done.record()
    times["kernel_still_running"] = not done.query()
    torch.cuda.synchronize()
    lap("then_waited")
    check(cu.cuMemAddressFree(ctypes.c_uint64(base.value), ctypes.c_size_t(HANDLE * HANDLES)), "cuMemAddressFree")
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU")
        return 0
    torch.empty(1, device="cuda")  # the primary context, current on this thread
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    print(f"{torch.cuda.get_device_name()}: {HANDLES} handles of {HANDLE >> 20} MiB; 'busy': a {SLEEP_S * 1e3:.0f} ms "
          "kernel queued first")
    for _ in range(args.rounds):
        for busy in (False, True):
            r = one_round(cu, torch, busy, torch.cuda.current_device())
            cells = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
            print(f"{'busy' if busy else 'idle'}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
