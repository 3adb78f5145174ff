"""The log decoder (torchalloc.log): real logs written by the C library on the
sim backend (skipped without the library), and synthetic ones built here from
docs/LOG_FORMAT.md for the damage cases. No torch needed."""
from __future__ import annotations

import ctypes
import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from torchalloc.log import reader as talog
from torchalloc.log.reader import LogDamageWarning, LogFormatError, read_log

HERE = Path(__file__).resolve()


# ---------------------------------------------------------------------------
# Logs from the C library
# ---------------------------------------------------------------------------


@pytest.fixture
def clib(library_path: Path):
    lib = ctypes.CDLL(str(library_path))  # CDLL drops the GIL in calls: like torch's own calls
    lib.torchalloc_init.argtypes = [ctypes.c_char_p]
    lib.torchalloc_malloc.restype = ctypes.c_void_p
    lib.torchalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.torchalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.torchalloc_empty_cache.restype = ctypes.c_int64
    lib.torchalloc_empty_cache.argtypes = [ctypes.c_int]
    lib.torchalloc_mark.argtypes = [ctypes.c_char_p]
    lib.torchalloc_phase_begin.argtypes = [ctypes.c_char_p]
    lib.torchalloc_phase_end.argtypes = [ctypes.c_char_p]
    lib.torchalloc_log_path.restype = ctypes.c_char_p
    lib.torchalloc_last_error.restype = ctypes.c_char_p
    yield lib
    lib.torchalloc_teardown()


def init(lib, conf: str) -> None:
    assert lib.torchalloc_init(conf.encode()) == 0, lib.torchalloc_last_error()


def allocate_here(lib, size: int):  # the frame the alloc record must name
    return lib.torchalloc_malloc(size, 0, None)


def free_here(lib, ptr, size: int) -> None:
    lib.torchalloc_free(ptr, size, 0, None)


def test_every_kind_decodes_with_fields_and_stacks(clib, tmp_path: Path) -> None:
    path = tmp_path / "run-%p.talog"
    init(clib, f"backend:sim,warn:0,sim_capacity:64MiB,log:{path},stacks:1,stack_depth:4")
    real = Path(clib.torchalloc_log_path().decode())
    assert real.name == f"run-{os.getpid()}.talog"
    forward = clib.torchalloc_phase_begin(b"forward")
    ptr = allocate_here(clib, 1000)
    assert clib.torchalloc_mark("step 1 ✓".encode()) == 0
    free_here(clib, ptr, 1000)
    assert clib.torchalloc_phase_end(b"forward") == 0
    assert clib.torchalloc_empty_cache(0) == 2 << 20
    assert clib.torchalloc_malloc(1 << 30, 0, None) is None  # OOM on a 64 MiB device
    clib.torchalloc_teardown()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = read_log(real)
    assert log.complete and not log.truncated and log.warnings == []
    assert log.header.pid == os.getpid() and log.header.status_name == "closed"
    names = talog.kind_names(log.records["kind"]).tolist()
    assert names == ["phase_begin", "device", "segment_alloc", "alloc", "marker", "free", "phase_end",
                     "segment_free", "trim", "trim", "oom", "oom_device", "end"]  # a trim record follows the
    # segment_free records it caused; the device's memory is said before its first segment
    memory = log.of_kind("device")[0]
    assert (memory["addr"], memory["size"], memory["device"]) == (64 << 20, 0, 0)  # total, no fraction
    oom, device = log.of_kind("oom")[0], log.of_kind("oom_device")[0]
    assert (oom["size"], oom["addr"]) == (1 << 30, 64 << 20)  # requested; the device's free bytes
    assert (device["addr"], device["size"], device["block_size"]) == (64 << 20, 0, 0)  # total, no fraction, allocated
    assert device["flags"] == 2  # the verdict: capacity (1 GiB on a 64 MiB device)
    assert np.array_equal(np.diff(log.records["seq"].astype(np.int64)) > 0, np.ones(len(names) - 1, bool))

    alloc, free = log.of_kind("alloc")[0], log.of_kind("free")[0]
    assert alloc["addr"] == ptr == free["addr"]
    assert (alloc["size"], alloc["block_size"], alloc["device"], alloc["phase"]) == (1000, 1024, 0, forward)
    assert talog.POLICY_NAMES[int(alloc["policy"])] == "caching" and alloc["pool"] == 1
    assert alloc["tid"] == threading.get_native_id()
    assert log.phase_names[forward] == "forward"
    assert log.label(log.of_kind("marker")[0]) == "step 1 ✓"

    where = log.stack(alloc["stack"])
    assert 1 <= len(where) <= 4
    assert where[0] == talog.Frame(str(HERE), where[0].line, "allocate_here")  # innermost first
    assert where[1].function == "test_every_kind_decodes_with_fields_and_stacks"
    assert log.stack(free["stack"])[0].function == "free_here"
    assert log.stack(log.of_kind("oom")[0]["stack"])[0].function.startswith("test_every_kind")
    assert log.of_kind("oom")[0]["size"] == 1 << 30

    # every distinct string once
    texts = list(log.strings.values())
    assert len(texts) == len(set(texts)) and str(HERE) in texts


def test_strings_longer_than_one_slot_decode_exactly(clib, tmp_path: Path) -> None:
    # A string spans several 47-byte chunks; the last byte of each chunk sits
    # at slot offset 62, which the decoder once dropped (every 47th char: NUL).
    path = tmp_path / "long.talog"
    init(clib, f"backend:sim,warn:0,log:{path}")
    label = "".join(chr(ord("a") + i % 26) for i in range(200))
    phase = "p" * 63  # the longest phase name
    assert clib.torchalloc_phase_begin(phase.encode()) > 0
    assert clib.torchalloc_mark(label.encode()) == 0
    assert clib.torchalloc_phase_end(phase.encode()) == 0
    clib.torchalloc_teardown()
    log = read_log(path)
    assert log.label(log.of_kind("marker")[0]) == label
    assert phase in log.phase_names.values()


def test_compressed_logs_decode_like_the_original(clib, tmp_path: Path) -> None:
    import gzip
    import lzma

    path = tmp_path / "plain.talog"
    init(clib, f"backend:sim,warn:0,log:{path}")
    ptr = allocate_here(clib, 4096)
    free_here(clib, ptr, 4096)
    clib.torchalloc_teardown()
    plain = read_log(path)
    for suffix, pack in ((".xz", lzma.compress), (".gz", gzip.compress)):
        packed = tmp_path / f"plain.talog{suffix}"
        packed.write_bytes(pack(path.read_bytes()))
        log = read_log(packed)
        assert np.array_equal(log.records, plain.records) and log.complete
    broken = tmp_path / "broken.talog.xz"
    broken.write_bytes(lzma.compress(path.read_bytes())[:40])
    with pytest.raises(talog.LogFormatError, match="truncated or corrupt compressed"):
        read_log(broken)


def test_python_threads_get_their_own_stacks(clib, tmp_path: Path) -> None:
    init(clib, f"backend:sim,warn:0,log:{tmp_path / 't.talog'},stacks:1")
    clib.torchalloc_phase_begin(b"threads")

    def worker_body() -> None:
        for _ in range(50):
            free_here(clib, allocate_here(clib, 4096), 4096)

    threads = [threading.Thread(target=worker_body) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clib.torchalloc_teardown()
    log = read_log(tmp_path / "t.talog")
    allocs = log.of_kind("alloc")
    assert len(allocs) == 200 and len(np.unique(allocs["tid"])) >= 2
    assert {log.phase_names[p] for p in allocs["phase"].tolist()} == {"threads"}
    assert {tuple(f.function for f in log.stack(s)[:2]) for s in allocs["stack"].tolist()} == {
        ("allocate_here", "worker_body")
    }
    # identical stacks are interned: far fewer stack ids than records
    assert len(np.unique(allocs["stack"])) <= 4


def test_sigkilled_writer_decodes_up_to_the_last_record(library_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "killed.talog"
    script = textwrap.dedent(f"""
        import ctypes
        lib = ctypes.CDLL({str(library_path)!r})
        lib.torchalloc_malloc.restype = ctypes.c_void_p
        lib.torchalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.torchalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        assert lib.torchalloc_init(b"backend:sim,warn:0,log:{path},stacks:1") == 0
        print("ready", flush=True)
        while True:
            lib.torchalloc_free(lib.torchalloc_malloc(512, 0, None), 512, 0, None)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    child.send_signal(signal.SIGKILL)
    child.wait()
    log = read_log(path)  # a torn last record, if any, is noted; nothing raises
    assert log.header.status == 0 and not log.complete and log.writer == talog.WRITER_KILLED
    kinds = log.records["kind"]
    assert len(kinds) > 100
    assert abs(int((kinds == 1).sum()) - int((kinds == 2).sum())) <= 1
    assert (np.diff(log.records["seq"].astype(np.int64)) > 0).all()
    assert all("incomplete record" in w or "ends inside a record" in w for w in log.damage), log.damage


def test_csv_and_jsonl(clib, tmp_path: Path) -> None:
    init(clib, f"backend:sim,warn:0,log:{tmp_path / 'c.talog'},stacks:1")
    clib.torchalloc_phase_begin(b"p,with \"quotes\"")
    free_here(clib, allocate_here(clib, 100), 100)
    clib.torchalloc_mark(b"m")
    clib.torchalloc_teardown()
    log = read_log(tmp_path / "c.talog")
    talog.to_csv(log, tmp_path / "c.csv")
    import csv

    rows = list(csv.DictReader(open(tmp_path / "c.csv", newline="")))
    assert [r["kind"] for r in rows] == talog.kind_names(log.records["kind"]).tolist()
    alloc = next(r for r in rows if r["kind"] == "alloc")
    assert alloc["phase_name"] == 'p,with "quotes"' and alloc["policy"] == "caching"
    assert alloc["location"].endswith(":allocate_here") and int(alloc["size"]) == 100
    assert next(r for r in rows if r["kind"] == "marker")["label"] == "m"
    buf = io.StringIO()
    talog.to_jsonl(log, buf)
    objs = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert len(objs) == len(log.records)
    assert next(o for o in objs if o["kind"] == "free")["frames"][0][2] == "free_here"


# ---------------------------------------------------------------------------
# Synthetic logs: damage and format errors
# ---------------------------------------------------------------------------


def synth(n_pairs: int = 100, *, status: int = 1) -> bytes:
    """A closed log: the string "fwd", a phase_begin, alloc/free pairs, end."""
    n = 3 + 2 * n_pairs
    r = np.zeros(n, dtype=talog.RECORD_DTYPE)
    r["seq"] = np.arange(n)
    r["time_ns"] = 1000 + np.arange(n)
    r["tid"] = 7
    r["device"] = 0
    body = r.view(np.uint8).reshape(n, 64)
    body[0, 0:4] = np.frombuffer(struct.pack("<I", 1), np.uint8)   # string id 1
    body[0, 4:6] = np.frombuffer(struct.pack("<H", 3), np.uint8)   # len 3
    body[0, 16:19] = np.frombuffer(b"fwd", np.uint8)
    r["kind"][0] = talog.STRING
    r["kind"][1], r["stack"][1], r["phase"][1], r["device"][1] = 7, 1, 1, -1
    pairs = np.arange(n_pairs)
    r["kind"][2:-1:2], r["kind"][3:-1:2] = 1, 2
    for k in (2, 3):
        r["addr"][k:-1:2] = 0x10000 + pairs * 512
        r["size"][k:-1:2] = 500
        r["block_size"][k:-1:2] = 512
        r["phase"][k:-1:2] = 1
        r["pool"][k:-1:2] = 1
    r["kind"][-1], r["device"][-1] = 14, -1
    end = 128 + 64 * n
    header = struct.pack("<8sIIIIQQIiQIIQ16s", talog.MAGIC, 1, 128, 64, 0x01020304, 10**18, 10**9, 4242, -1, 0,
                         status, 0, end if status else 0, b"torchalloc").ljust(128, b"\0")
    return header + r.tobytes()


def test_synthetic_log_decodes_cleanly() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = read_log(synth(10))
    assert len(log) == 2 + 20 and log.complete and log.strings == {1: "fwd"} and log.phase_names[1] == "fwd"
    assert (log.of_kind("alloc")["addr"] == log.of_kind("free")["addr"]).all()


def test_cut_at_random_offsets_keeps_every_record_before_the_cut() -> None:
    full = synth(200)
    whole = read_log(full).records
    rng = random.Random(1234)
    for cut in [128, 129, 191, 192, 193, len(full) - 1] + [rng.randrange(128, len(full)) for _ in range(60)]:
        log = read_log(full[:cut])
        complete_slots = (cut - 128) // 64
        expected = whole[whole["seq"] < complete_slots]
        assert np.array_equal(log.records, expected), cut
        text = " ".join(log.damage)
        assert f"byte offset {cut}" in text or f"byte offset {128 + 64 * complete_slots}" in text, text
        assert not log.complete or cut == len(full)


def test_killed_writer_with_torn_last_record() -> None:
    data = bytearray(synth(50, status=0))
    last = len(data) - 64
    data[last + 63] = 0                       # the end record never got its kind
    data += bytes(64 * 1000)                  # the unused rest of the chunk
    log = read_log(bytes(data))
    assert any(f"incomplete record at byte offset {last}" in d for d in log.damage), log.damage
    assert len(log) == 1 + 100 and not log.complete


def test_zero_tail_of_a_killed_writer_is_not_damage() -> None:
    data = synth(50, status=0)[:-64] + bytes(64 * 1000)   # killed before the end record: all zeros after
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = read_log(data)
    assert len(log) == 101 and not log.complete and log.warnings == []


def test_hole_left_by_a_concurrent_writer_is_skipped() -> None:
    data = bytearray(synth(50, status=0))
    hole = 128 + 64 * 10
    data[hole:hole + 64] = bytes(64)          # reserved, never written: its thread was killed first
    log = read_log(bytes(data))
    assert any(f"incomplete record at byte offset {hole}" in d for d in log.damage), log.damage
    assert len(log) == 101 and 10 not in log.records["seq"].tolist()


def test_corrupted_record_stops_the_decode_there() -> None:
    data = bytearray(synth(50))
    bad = 128 + 64 * 30
    data[bad + 8:bad + 16] = struct.pack("<Q", 999999)    # a sequence number that cannot be there
    log = read_log(bytes(data))
    assert any(f"damaged record at byte offset {bad}" in d for d in log.damage), log.damage
    assert log.records["seq"].max() == 29 and not log.complete
    data = bytearray(synth(50))
    data[bad + 63] = 200                                  # an unknown kind
    assert any(f"damaged record at byte offset {bad} (kind 200" in d for d in read_log(bytes(data)).damage)


def test_damage_is_the_tools_note_and_a_warning_only_when_asked() -> None:
    data = synth(50)[:-10]                                # cut inside the end record
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # the default raises no Python warning
        log = read_log(data)
    assert log.damage and log.warnings is log.damage      # the old name is the same list
    assert any("ends inside a record" in d for d in log.damage) and log.damage[0].startswith("<bytes>: ")
    with pytest.warns(LogDamageWarning) as caught:
        read_log(data, warn=True)
    assert [str(w.message) for w in caught] == log.damage


def test_not_a_log_is_a_clear_error(tmp_path: Path) -> None:
    for data in (b"", b"hello world" * 20, b"\x89PNG\r\n\x1a\n" + bytes(200), bytes(300)):
        with pytest.raises(LogFormatError, match="not a torchalloc log|empty file .*: neither a torchalloc log"):
            read_log(data)
    (tmp_path / "x.txt").write_text("id,size\n1,2\n")
    with pytest.raises(LogFormatError, match=r"x\.txt: not a torchalloc log"):
        read_log(tmp_path / "x.txt")
    with pytest.raises(LogFormatError, match="header is cut short"):
        read_log(synth(1)[:100])


def test_unknown_version_is_a_clear_error() -> None:
    data = bytearray(synth(1))
    data[8:12] = struct.pack("<I", 4)
    with pytest.raises(LogFormatError, match="version 4; this decoder reads versions 1, 2, 3"):
        read_log(bytes(data))
    data = bytearray(synth(1))
    data[20:24] = struct.pack(">I", 0x01020304)
    with pytest.raises(LogFormatError, match="byte-order"):
        read_log(bytes(data))


def test_truncated_by_the_cap() -> None:
    data = bytearray(synth(20, status=2))
    last = len(data) - 64
    data[last + 63] = 10                      # truncated instead of end
    data[last + 61] = 2
    log = read_log(bytes(data))
    assert log.truncated and not log.complete and log.header.status_name == "log_max reached"
