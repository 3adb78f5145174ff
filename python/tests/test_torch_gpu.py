"""torchalloc inside PyTorch on a real GPU.

Skipped without torch or without a CUDA GPU. install() must run before CUDA
is initialised, so every test runs its scenario in a fresh Python process
(the library path travels in $TORCHALLOC_LIB, set by conftest.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_child import run_child

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():  # asks the driver; does not initialise CUDA here
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


def test_patch_torch_makes_torchs_stats_work_on_the_plain_route(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        from torchalloc import plug
        torchalloc.install(policy="caching", patch_torch=True, bridge=False)  # the plain route needs the patch
        x = torch.empty(1000, device="cuda")          # 4000 bytes: a 4096-byte block
        forms = [torch.cuda.memory_allocated(), torch.cuda.memory_allocated(0),
                 torch.cuda.memory_allocated("cuda:0"), torch.cuda.memory_allocated(torch.device("cuda")),
                 torch.cuda.memory.memory_allocated(), torchalloc.memory_allocated()]
        stats = torch.cuda.memory_stats()
        peak = torch.cuda.max_memory_allocated()
        del x
        torch.cuda.reset_peak_memory_stats()
        after_reset = torch.cuda.max_memory_allocated()
        ours = torch.cuda.memory_summary()
        # torch's own memory_summary, reading our stats through the patched torch._C entry:
        torchs = next(f for ns, n, f in plug._originals
                      if ns is torch.cuda.memory and n == "memory_summary")()
        emit(forms=forms, allocs=stats["allocation.all.current"], keys=sorted(stats), peak=peak,
             after_reset=after_reset, ours=ours, torchs=torchs,
             same=torchalloc.install(policy="caching") is torchalloc.installed())
        """,
        library_path,
    )
    assert r["forms"] == [4096] * 6
    assert r["allocs"] == 1 and r["peak"] == 4096 and r["after_reset"] == 0
    assert r["same"]
    ours, torchs = r["ours"].splitlines(), r["torchs"].splitlines()
    assert "torchalloc" in ours[1] and "PyTorch" in torchs[1]
    assert ours[:1] + ours[2:] == torchs[:1] + torchs[2:], "memory_summary layout differs from torch's"

    native = run_child(
        """
        import torch
        x = torch.empty(1000, device="cuda")
        emit(keys=sorted(torch.cuda.memory_stats()), allocated=torch.cuda.memory_allocated())
        """,
        library_path,
    )
    assert r["keys"] == native["keys"], "memory_stats() keys differ from torch's"
    assert native["allocated"] == 4096


def test_install_after_cuda_init_explains(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torch.zeros(1, device="cuda")
        try:
            torchalloc.install()
            emit(raised=None)
        except RuntimeError as e:
            emit(raised=str(e))
        """,
        library_path,
    )
    assert r["raised"] and "before" in r["raised"] and "torchalloc.pool()" in r["raised"]


def test_pool_routes_allocations_after_cuda_init(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torch.zeros(1, device="cuda")                 # CUDA is up: install() is no longer possible
        before = torchalloc.memory_allocated()
        with torchalloc.pool():
            x = torch.ones(1 << 20, device="cuda")    # 4 MiB: the native allocator asks us for a segment
        inside = torchalloc.memory_allocated()
        total = x.sum().item()
        emit(before=before, inside=inside, total=total)
        """,
        library_path,
    )
    assert r["before"] == 0
    assert r["inside"] >= 4 << 20  # torchalloc counts the segments the native allocator took
    assert r["total"] == float(1 << 20)


def test_empty_cache_trims_our_reserved(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torchalloc.install()
        x = torch.empty(50 << 20, dtype=torch.uint8, device="cuda")
        del x
        cached = torchalloc.memory_reserved()
        torch.cuda.empty_cache()
        emit(cached=cached, after=torchalloc.memory_reserved(), allocated=torchalloc.memory_allocated())
        """,
        library_path,
    )
    assert r["allocated"] == 0
    assert r["cached"] >= 50 << 20 and r["after"] == 0


def test_memory_fraction_limits_our_reservations(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torchalloc.install(patch_torch=True)
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.1)
        fraction = torch.cuda.get_per_process_memory_fraction()  # raises under a plain pluggable allocator
        small = torch.empty(total // 100, dtype=torch.uint8, device="cuda")
        small.fill_(1)
        try:
            big = torch.empty(total // 5, dtype=torch.uint8, device="cuda")
            outcome = "null" if big.data_ptr() == 0 else "allocated"
            del big
        except RuntimeError as e:
            outcome = "raised: " + str(e)
        emit(small_ok=small.data_ptr() != 0, outcome=outcome, ooms=torchalloc.memory_stats()["num_ooms"],
             reserved=torchalloc.memory_reserved(), limit=total // 10, fraction=fraction)
        """,
        library_path,
    )
    assert r["small_ok"] and r["fraction"] == 0.1
    assert r["outcome"] != "allocated", "the big allocation got memory beyond the fraction"
    assert r["ooms"] == 1
    assert r["reserved"] <= r["limit"]
    assert "out of memory" in r["_stderr"] or r["outcome"].startswith("raised")


def test_record_stream_defers_reuse(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torchalloc.install()
        N = 1 << 20                                   # 4 MiB of float32
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()

        def scenario(record: bool) -> dict:
            x = torch.ones(N, device="cuda")
            torch.cuda.synchronize()
            x_ptr = x.data_ptr()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                torch.cuda._sleep(2_000_000_000)      # ~1 s: x is still in use on `side` meanwhile
                out = x * 2                            # reads x after the sleep
            if record:
                x.record_stream(side)
            del x
            y = torch.empty(N, device="cuda")          # same size, on the default stream
            pending = not side.query()
            y.fill_(-7.0)                              # would corrupt `out` if y aliased x
            result = dict(pending=pending, alias=y.data_ptr() == x_ptr)
            side.synchronize()
            result["out_ok"] = bool((out == 2).all().item())
            del y, out
            torch.cuda.synchronize()
            return result

        # Warm up every kernel used below: loading a kernel lazily on first use can
        # synchronise the device, which would let the side stream finish early.
        w = torch.ones(N, device="cuda")
        with torch.cuda.stream(side):
            torch.cuda._sleep(1000)
            (w * 2 == 2).all().item()
        torch.empty(N, device="cuda").fill_(-7.0)
        torch.cuda.synchronize()
        del w

        safe = scenario(record=True)
        # After the side stream finished, x's deferred free must have completed:
        torch.cuda.synchronize()
        probe = torch.empty(1, device="cuda")
        live_after = torchalloc.memory_allocated()
        del probe
        hazard = scenario(record=False)               # control: without record_stream, reuse is immediate
        emit(safe=safe, hazard=hazard, live_after=live_after)
        """,
        library_path,
    )
    safe, hazard = r["safe"], r["hazard"]
    assert safe["pending"], "the side stream finished before the check: the test proved nothing"
    assert not safe["alias"], "y reused x's memory while the side stream still used it"
    assert safe["out_ok"], "the side stream's result was corrupted"
    assert r["live_after"] == 512, "x's deferred free never completed"
    assert hazard["pending"] and hazard["alias"], "control scenario: expected immediate reuse without record_stream"


def test_track_tags_a_training_step(library_path: Path) -> None:
    r = run_child(
        """
        import torch, torchalloc
        torchalloc.install()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).cuda()
        opt = torch.optim.Adam(model.parameters())
        handle = torchalloc.track(model, opt)
        x = torch.randn(64, 256, device="cuda")
        for _ in range(2):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        handle.remove()
        stats = {name: vars(s) for name, s in torchalloc.phase_stats().items()}
        emit(stats=stats, current=torchalloc.current_phase())
        """,
        library_path,
    )
    s = r["stats"]
    assert r["current"] == "default"
    for name in ("forward", "backward", "optimizer", "zero_grad"):
        assert s[name]["occurrences"] == 2, (name, s[name])
    assert s["forward"]["allocated_bytes"] > 0 and s["backward"]["allocated_bytes"] > 0
    assert s["optimizer"]["allocated_bytes"] > 0  # Adam's state on the first step
    assert s["zero_grad"]["freed_bytes"] > 0  # set_to_none frees the gradients
