"""Jobs of several processes under torchalloc, on real GPUs: examples/ddp_example.py, which runs torchrun
once with PyTorch's allocator and once with torchalloc in every rank, and compares each rank's losses (or
checksums) bit for bit and peak allocated exactly.

- Two ranks sharing one GPU over gloo: DDP and FSDP.
- One rank per GPU over NCCL: DDP, FSDP (fully_shard), NCCL point-to-point (batch_isend_irecv in a ring)
  and all_to_all_single with uneven, changing splits (the mixture-of-experts exchange), DDP under every
  policy and with ordinary segments, DDP on the plain route; a fault: the last rank asks for more than its GPU has, and every run, the job report and that
  rank's OOM report must say which rank failed.
- Four ranks on four GPUs: FSDP, where four GPUs are there.

Each torchrun has its own timeout; a rank still running then prints every thread's stack (faulthandler)
and torchrun's process group is killed, so a hang fails with what each rank was doing.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_child import child_env

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():  # asks the driver; does not initialise CUDA here
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
GPUS = torch.cuda.device_count()
TORCHRUN_TIMEOUT = 200  # per torchrun (two per mode); a rank prints its stacks 20 s before


def needs_gpus(n: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(GPUS < n, reason=f"needs {n} GPUs, found {GPUS}")


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(Path(os.environ["TORCHALLOC_LIB"]))  # conftest.py's choice, as the other GPU tests use
    cmd = [sys.executable, str(REPO / "examples" / "ddp_example.py"), *args, "--timeout", str(TORCHRUN_TIMEOUT),
           "--hang-after", str(TORCHRUN_TIMEOUT - 20)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=2 * TORCHRUN_TIMEOUT + 120,
                          check=False)


def check_ok(done: subprocess.CompletedProcess[str], mode: str) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"OK {mode}:" in done.stdout, done.stdout


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_on_one_gpu_over_gloo(library_path: Path, tmp_path: Path, mode: str) -> None:
    done = run_example("--nproc", "2", "--mode", mode, "--backend", "gloo", "--same-device", "--lib",
                       str(library_path), "--out", str(tmp_path))
    check_ok(done, mode)
    assert "2 rank logs" in done.stdout, done.stdout
    assert sorted(p.name for p in (tmp_path / mode).glob("run.*.talog")) == ["run.0.talog", "run.1.talog"]


@needs_gpus(2)
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "p2p", "alltoall", "oom"])
def test_two_ranks_on_two_gpus_over_nccl(library_path: Path, tmp_path: Path, mode: str) -> None:
    done = run_example("--nproc", "2", "--mode", mode, "--backend", "nccl", "--lib", str(library_path),
                       "--out", str(tmp_path))
    check_ok(done, mode)
    if mode == "oom":
        assert "rank 1 ran out of memory" in done.stdout, done.stdout


@needs_gpus(2)
@pytest.mark.parametrize("policy,expandable", [("exact", "reclaim"), ("phase_arena", "reclaim"), ("caching", "off")])
def test_ddp_over_nccl_under_every_policy(library_path: Path, tmp_path: Path, policy: str, expandable: str) -> None:
    done = run_example("--nproc", "2", "--mode", "ddp", "--backend", "nccl", "--policy", policy, "--expandable",
                       expandable, "--lib", str(library_path), "--out", str(tmp_path))
    check_ok(done, "ddp")


@needs_gpus(2)
def test_ddp_over_nccl_on_the_plain_route(library_path: Path, tmp_path: Path) -> None:
    done = run_example("--nproc", "2", "--mode", "ddp", "--backend", "nccl", "--route", "plain", "--lib",
                       str(library_path), "--out", str(tmp_path))
    check_ok(done, "ddp")
    assert "plain" in done.stdout  # the comparison table's route column


@needs_gpus(4)
def test_four_ranks_on_four_gpus_fsdp(library_path: Path, tmp_path: Path) -> None:
    done = run_example("--nproc", "4", "--mode", "fsdp", "--backend", "nccl", "--lib", str(library_path),
                       "--out", str(tmp_path))
    check_ok(done, "fsdp")
    assert "4 rank logs" in done.stdout, done.stdout
