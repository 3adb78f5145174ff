#!/usr/bin/env python3
"""Write the fuzzers' seed corpora (committed; rerun after a format change):

    python3 tests/fuzz/make_corpus.py            # needs build/libtorchalloc.so (or $TORCHALLOC_LIB)
    python3 tests/fuzz/make_corpus.py --hostile  # only the issue-23 seeds (hostile-*, mid-run), the rest kept

tests/fuzz/corpus/api/      inputs for fuzz_api (tests/fuzz/api_driver.h says
                            what the bytes mean): scenarios written by hand
                            with the operation codes read from api_driver.h,
                            plus seeded random programs over every configuration.
tests/fuzz/corpus/api-found/
                            not written here: inputs the long fuzz_api run found
                            that reach coverage edges the seeds above do not
                            (fuzz_api -merge=1 -use_counters=0 DIR_WITH_SEEDS
                            LONG_RUN_CORPUS, the new files kept). Any byte string
                            is a valid program, so they stay valid inputs when
                            the format changes; they just stop meaning the same.
tests/fuzz/corpus/decoder/  inputs for fuzz_log_decode.py: real logs written by
                            the C library through ctypes (every record kind,
                            Python stacks, two devices, an OOM, a log cut by
                            log_max, a copy taken while the writer was still
                            writing, a gzip-compressed one, a log opened after
                            the first allocations: mid-run), and hand-made logs
                            whose checksums hold but whose records no writer
                            produces (hostile-*: python/tests/hostile_logs.py,
                            the shapes of issue 23). Kept when rewritten: logs of
                            older formats (v1-*, v2-*) and inputs the fuzzer found
                            (found-*).

Deterministic where it can be (the random programs); the logs carry times
and pids, so they differ from run to run. Together well under 1 MB.
"""
from __future__ import annotations

import ctypes
import gzip
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "python"))

API_DIR = HERE / "corpus" / "api"
DECODER_DIR = HERE / "corpus" / "decoder"
MiB = 1 << 20


# ---------------------------------------------------------------------------
# fuzz_api seeds
# ---------------------------------------------------------------------------


def op_codes() -> dict[str, int]:
    """DRV_OP_* from api_driver.h: the first byte value of each operation."""
    text = (HERE / "api_driver.h").read_text()
    return {m[1].lower(): int(m[2]) for m in re.finditer(r"#define DRV_OP_(\w+) (\d+)", text) if m[1] != "BYTES"}


OP = op_codes()


def config(policy: int = 0, devices: int = 1, capacity: int = 0, fail_at: int = 0, held: int = 0, polls: int = 0,
           logging: bool = False, stacks: bool = False) -> bytes:
    """The 8 configuration bytes (drv_start): indices into its tables."""
    return bytes([policy, devices - 1, capacity, 128 + fail_at - 1 if fail_at else 0, held, polls,
                  0 if logging else 1, int(stacks)])


def op(name: str, *args: int) -> bytes:
    body = bytes(args) + bytes(7 - len(args))
    return bytes([OP[name]]) + body


def malloc(device: int = 0, stream: int = 0, size_class: int = 0, r: int = 1000, pool: bool = False) -> bytes:
    """size_class (draw_size): 0 tiny (1 + r % 4096), 6 small, 9 large, 11 huge, 14 beyond the device."""
    return op("pool_malloc" if pool else "malloc", device, stream, size_class, *r.to_bytes(4, "little"))


def scenario_capture(policy: int) -> bytes:
    """A graph capture with routing, as torch.cuda.graph drives it: frees of
    blocks used on other streams, an OOM and an empty_cache inside it."""
    out = config(policy=policy, capacity=2, polls=2)
    out += malloc(size_class=6, r=5000) + malloc(stream=1, size_class=9, r=7) + malloc(size_class=0, r=100)
    out += op("record_stream", 0, 0, 2)                 # block 0 used on stream 2 too
    out += op("capture", 0, 0, 0, 0)                      # guarded, pool 0, stream 0
    out += malloc(size_class=9, r=123, pool=True) + malloc(size_class=0, r=77, pool=True)
    out += op("free", 0, 0, 0) + op("free", 1, 0, 0)      # deferred while routing
    out += op("empty_cache", 0) + malloc(size_class=14, r=1, pool=True)  # no sync, no release: OOM
    out += op("capture", 0)                               # ends
    out += malloc(size_class=6, r=5000) + op("empty_cache", 2)
    return out


def scenario_stale_frees() -> bytes:
    out = config()
    for _ in range(3):
        out += malloc(r=4095) + op("free", 0, 0, 0)
        out += op("misuse", 1, 0, 0, 0)                  # stale free of the freed block
        out += malloc(r=2047)                              # the address again, smaller
        out += op("misuse", 1, 0, 0, 0) + op("misuse", 4, 0, 1)  # stale other size; wrong stream
        out += op("misuse", 2, 0, 0, 0, 0, 1) + op("misuse", 3) + op("misuse", 0, 0, 0, 1)
    return out


def scenario_logging() -> bytes:
    out = config(logging=True, stacks=True, devices=2)
    out += op("log", 1) + op("phase", 0, 0) + malloc(device=1, r=300) + malloc(size_class=9, r=9)
    out += op("log", 0) + op("phase", 1, 0, 1) + op("free", 0) + op("empty_cache", 0)
    out += malloc(size_class=14, r=2) + op("log", 1) + malloc(r=10) + op("log", 1)
    return out


def scenario_small_device() -> bytes:
    out = config(policy=2, capacity=5, held=3, fail_at=3)
    out += op("fraction", 0, 3)
    for i in range(12):
        out += malloc(stream=i % 4, size_class=(0, 6, 9, 11)[i % 4], r=i * 7919)
        if i % 3 == 2:
            out += op("free", i, 0, 0)
    out += op("stats", 3, 0, 1) + op("policy", 1) + malloc(size_class=11, r=5) + op("empty_cache", 0)
    return out


def scenario_two_devices_misuse() -> bytes:
    out = config(devices=2)
    out += malloc(device=0, r=100) + malloc(device=1, stream=2, size_class=9, r=50)
    out += op("misuse", 5, 0, 0, 0, 0) + op("misuse", 6, 1) + op("misuse", 7, 0) + malloc(device=255, r=1)
    out += malloc(size_class=15, r=1) + malloc(size_class=15, r=3, pool=True)
    out += op("capture", 1, 3) + malloc(device=1, r=10) + op("empty_cache", 0) + op("capture", 1)
    return out


def random_programs(n: int, rng: random.Random) -> list[bytes]:
    out = []
    for i in range(n):
        cfg = bytes([i % 3, i // 3 % 2, i % 6, rng.choice((0, 0, 128 + rng.randrange(32))), i % 6, i % 4,
                     rng.randrange(256), i % 2])
        ops = rng.randrange(16, 500)
        out.append(cfg + bytes(rng.randrange(256) for _ in range(8 * ops)))
    return out


def write_api_corpus() -> int:
    shutil.rmtree(API_DIR, ignore_errors=True)
    API_DIR.mkdir(parents=True)
    seeds = {
        "capture-caching": scenario_capture(0),
        "capture-exact": scenario_capture(1),
        "capture-phase_arena": scenario_capture(2),
        "stale-frees": scenario_stale_frees(),
        "logging": scenario_logging(),
        "small-device": scenario_small_device(),
        "two-devices-misuse": scenario_two_devices_misuse(),
    }
    for i, data in enumerate(random_programs(36, random.Random(20261124))):
        seeds[f"random-{i:02d}"] = data
    for name, data in seeds.items():
        (API_DIR / name).write_bytes(data)
    return len(seeds)


# ---------------------------------------------------------------------------
# fuzz_log_decode seeds: logs the C library writes
# ---------------------------------------------------------------------------


def load_library() -> ctypes.CDLL:
    from torchalloc import _lib

    return _lib.lib()


def allocate_from_python(lib: ctypes.CDLL, size: int, device: int = 0, stream: int = 0) -> int:
    return lib.torchalloc_malloc(size, device, stream)  # stacks:1 records this frame


def session(lib: ctypes.CDLL, rng: random.Random, ops: int, devices: int = 1) -> None:
    """Allocations, frees, phases, markers, an empty_cache and an OOM."""
    live: list[tuple[int, int, int, int]] = []
    lib.torchalloc_phase_begin(b"forward")
    for i in range(ops):
        if i == ops // 2:
            lib.torchalloc_phase_end(b"forward")
            lib.torchalloc_phase_begin(b"backward")
            lib.torchalloc_mark(b"halfway")
            lib.torchalloc_empty_cache(-1)
        if live and rng.random() < 0.45:
            p, size, device, stream = live.pop(rng.randrange(len(live)))
            lib.torchalloc_free(p, size, device, stream)
            continue
        size = rng.choice((rng.randrange(1, 4096), rng.randrange(4096, MiB), rng.randrange(MiB, 12 * MiB)))
        device, stream = rng.randrange(devices), rng.choice((0, 0x1000))
        p = allocate_from_python(lib, size, device, stream)
        if p:
            live.append((p, size, device, stream))
    allocate_from_python(lib, 8 << 30)  # beyond the 1 GiB device: an OOM record
    lib.torchalloc_phase_end(b"backward")
    for p, size, device, stream in live:
        lib.torchalloc_free(p, size, device, stream)


def write_decoder_corpus() -> int:
    lib = load_library()
    # Logs of the current format are rewritten; the seeds of older versions (v1-*: from before checksums;
    # v2-*: from before device records) stay, so the fuzzer keeps reaching the older formats' reader, and so
    # do the inputs the fuzzer found (found-*: each once broke a tool).
    DECODER_DIR.mkdir(parents=True, exist_ok=True)
    for old in DECODER_DIR.iterdir():
        if not old.name.startswith(("v1-", "v2-", "found-")):
            old.unlink()
    rng = random.Random(7)
    base = "backend:sim,warn:0,oom_report:off,sim_capacity:1GiB"
    with tempfile.TemporaryDirectory() as tmp:
        def logged(name: str, conf: str, ops: int, devices: int = 1, copy_open: bool = False) -> Path:
            path = Path(tmp) / f"{name}.talog"
            assert lib.torchalloc_init(f"{base},{conf},log:{path}".encode()) == 0, lib.torchalloc_last_error()
            session(lib, rng, ops, devices)
            if copy_open:  # as a SIGKILL would leave it: status open, zeros after the last record
                data = path.read_bytes()
                end = data.rstrip(b"\0")
                (DECODER_DIR / name).write_bytes(end + bytes(-len(end) % 64 + 64 * 4))
            lib.torchalloc_teardown()
            if not copy_open:
                shutil.copy(path, DECODER_DIR / name)
            return path

        closed = logged("closed-stacks", "stacks:1", 120)
        logged("two-devices", "sim_devices:2", 150, devices=2)
        logged("log-max", "log_max:8KiB", 400)
        logged("open-when-copied", "stacks:1", 80, copy_open=True)
        (DECODER_DIR / "closed-stacks.gz").write_bytes(gzip.compress(closed.read_bytes(), mtime=0))
    lib.torchalloc_teardown()
    write_issue23_seeds(lib)
    return len(list(DECODER_DIR.iterdir()))


def write_issue23_seeds(lib: ctypes.CDLL) -> int:
    """The hand-made hostile logs (valid checksums, impossible records) and a log opened mid-run: the
    inputs that once crashed or misled report, export and replay (issue 23)."""
    sys.path.insert(0, str(REPO / "python" / "tests"))
    from hostile_logs import HOSTILE

    DECODER_DIR.mkdir(parents=True, exist_ok=True)
    for name, make in HOSTILE.items():
        (DECODER_DIR / f"hostile-{name}").write_bytes(make())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mid-run.talog"
        assert lib.torchalloc_init(b"backend:sim,warn:0,oom_report:off,sim_capacity:1GiB,stacks:1") == 0
        early = [(allocate_from_python(lib, size), size) for size in (8 * MiB, MiB, 300, 4 * MiB)]
        lib.torchalloc_phase_begin(b"forward")
        assert lib.torchalloc_log_open(str(path).encode()) == 0, lib.torchalloc_last_error()
        for p, size in early[:3]:  # frees of blocks the log never saw allocated
            lib.torchalloc_free(p, size, 0, 0)
        late = allocate_from_python(lib, 2 * MiB)
        lib.torchalloc_phase_end(b"forward")
        lib.torchalloc_free(late, 2 * MiB, 0, 0)
        lib.torchalloc_log_close()
        lib.torchalloc_teardown()
        shutil.copy(path, DECODER_DIR / "mid-run")
    return len(HOSTILE) + 1


def main() -> int:
    if sys.argv[1:] == ["--hostile"]:
        print(f"{write_issue23_seeds(load_library())} issue-23 seeds in {DECODER_DIR.relative_to(REPO)}")
        return 0
    n_api = write_api_corpus()
    n_dec = write_decoder_corpus()
    size = sum(f.stat().st_size for f in (HERE / "corpus").rglob("*") if f.is_file())
    print(f"{n_api} fuzz_api seeds in {API_DIR.relative_to(REPO)}, {n_dec} decoder seeds in "
          f"{DECODER_DIR.relative_to(REPO)}: {size / 1024:.0f} KiB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
