"""Hand-made torchalloc logs with valid checksums (docs/LOG_FORMAT.md, version 2), and the hostile
shapes of issue 23: logs the C library never writes but a reader can be handed.

`LogBuilder` writes any record a reader must expect: strings (one or more
46-byte chunks), frames, stacks and event records, each slot sealed so its
64 bytes XOR to zero, and the header sealed the same way. `HOSTILE` names
each shape; tests/fuzz/make_corpus.py writes them as seeds of
tests/fuzz/fuzz_log_decode.py, and python/tests/test_hostile_logs.py runs
report, export and replay on each.
"""
from __future__ import annotations

import struct
from typing import Any, Callable

import numpy as np

from torchalloc import _records as R
from torchalloc.log.reader import HEADER_SIZE, MAGIC, RECORD_DTYPE, RECORD_SIZE

MiB, GiB = 1 << 20, 1 << 30
MAX_REQUEST = (1 << 40) - (2 << 20)  # TA_MAX_REQUEST in allocator/base/common.h
_TEXT_CHUNK = 46  # text bytes per string slot, version 2


def _xor(data: bytes | bytearray) -> int:
    x = 0
    for c in data:
        x ^= c
    return x


class LogBuilder:
    """Records appended in order; `to_bytes()` gives a closed (or open) version-2 log."""

    def __init__(self, *, start_ns: int = 10**9, pid: int = 4242, rank: int = -1) -> None:
        self.slots: list[bytes] = []
        self.time = start_ns
        self.start_ns = start_ns
        self.pid, self.rank = pid, rank
        self._next_id = 1
        self._strings: dict[str, int] = {}
        self.phase_ids: dict[str, int] = {}
        self.epochs: dict[int, int] = {}
        self.open: list[int] = []  # phases begun and not ended: records carry the innermost

    # metadata -------------------------------------------------------------
    def _id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _slot(self, body: bytes, kind: int) -> None:
        slot = bytearray(body.ljust(62, b"\0")[:62] + b"\0" + bytes([kind]))
        slot[62] = _xor(slot)
        self.slots.append(bytes(slot))

    def string(self, text: str | bytes) -> int:
        raw = text.encode() if isinstance(text, str) else text
        key = raw.decode("latin-1")
        if key in self._strings:
            return self._strings[key]
        sid = self._id()
        for chunk in range(max(1, -(-len(raw) // _TEXT_CHUNK))):
            seq = len(self.slots)
            part = raw[chunk * _TEXT_CHUNK:(chunk + 1) * _TEXT_CHUNK]
            self._slot(struct.pack("<IHHQ", sid, len(raw), chunk, seq) + part, R.STRING)
        self._strings[key] = sid
        return sid

    def stack(self, *frames: tuple[str | bytes, int, str | bytes]) -> int:
        """A stack id for frames (file, line, function), innermost first."""
        fids = []
        for filename, line, function in frames:
            file_id, func_id = self.string(filename), self.string(function)
            fid = self._id()
            self._slot(struct.pack("<IIQII", fid, line, len(self.slots), file_id, func_id), R.FRAME)
            fids.append(fid)
        sid = self._id()
        for chunk in range(max(1, -(-len(fids) // 11))):
            part = fids[chunk * 11:(chunk + 1) * 11]
            body = struct.pack("<IHHQ", sid, len(fids), chunk, len(self.slots)) + struct.pack(f"<{len(part)}I", *part)
            self._slot(body, R.STACK)
        return sid

    # event records ----------------------------------------------------------
    def record(self, kind: int, *, dt: int = 1000, **fields: Any) -> None:
        r = np.zeros(1, dtype=RECORD_DTYPE)
        self.time += dt
        r["time_ns"] = fields.pop("time_ns", self.time)
        r["seq"] = len(self.slots)
        r["tid"] = 7
        r["device"] = fields.pop("device", 0)
        r["phase"] = self.open[-1] if self.open else 0
        for name, value in fields.items():
            r[name] = value
        r["kind"] = 0
        self._slot(r.tobytes()[:62], kind)

    def alloc(self, addr: int, size: int, block: int | None = None, **kw: Any) -> None:
        block = -(-size // 512) * 512 if block is None else block
        self.record(R.ALLOC, addr=addr, size=size, block_size=block, pool=2 if block > MiB else 1, **kw)

    def free(self, addr: int, size: int, block: int | None = None, **kw: Any) -> None:
        block = -(-size // 512) * 512 if block is None else block
        self.record(R.FREE, addr=addr, size=size, block_size=block, pool=2 if block > MiB else 1, **kw)

    def segment(self, addr: int, size: int, **kw: Any) -> None:
        self.record(R.SEGMENT_ALLOC, addr=addr, size=size, block_size=size, pool=2, **kw)

    def oom(self, size: int, reserved: int = 0, **kw: Any) -> None:
        self.record(R.OOM, size=size, block_size=reserved, **kw)

    def phase_id(self, name: str | bytes) -> int:
        key = name if isinstance(name, str) else name.decode("latin-1")
        return self.phase_ids.setdefault(key, len(self.phase_ids) + 1)

    def begin(self, name: str | bytes, epoch: int | None = None) -> None:
        pid = self.phase_id(name)
        if epoch is None:
            epoch = self.epochs[pid] = self.epochs.get(pid, 0) + 1
        self.open.append(pid)
        self.record(R.PHASE_BEGIN, size=epoch, stack=self.string(name), phase=pid, device=-1)

    def end(self, name: str | bytes, epoch: int | None = None) -> None:
        pid = self.phase_id(name)
        if pid in self.open:
            self.open.remove(pid)
        self.record(R.PHASE_END, size=self.epochs.get(pid, 1) if epoch is None else epoch, stack=self.string(name),
                    phase=pid, device=-1)

    def mark(self, label: str | bytes) -> None:
        self.record(R.MARKER, stack=self.string(label), device=-1)

    # the file -----------------------------------------------------------------
    def to_bytes(self, *, closed: bool = True) -> bytes:
        slots = list(self.slots)
        if closed:
            saved = self.slots
            self.slots = slots
            self.record(R.END, device=-1)
            self.slots = saved
        end = HEADER_SIZE + RECORD_SIZE * len(slots)
        header = bytearray(struct.pack(
            "<8sIIIIQQIiQIIQ16si", MAGIC, 2, HEADER_SIZE, RECORD_SIZE, 0x01020304, 1_700_000_000 * 10**9,
            self.start_ns, self.pid, self.rank, 0, R.STATUS_CLOSED if closed else R.STATUS_OPEN, 0,
            end if closed else 0, b"torchalloc", 0).ljust(HEADER_SIZE, b"\0"))
        header[60] = _xor(header)
        return bytes(header) + b"".join(slots)


# ---------------------------------------------------------------------------
# The hostile shapes (issue 23, finding 5 and 6) and a few more of the same family
# ---------------------------------------------------------------------------


def _base(b: LogBuilder) -> None:
    """A sane start: a phase with a 4 MiB block, so there is something true to report."""
    b.segment(0x7000_0000, 20 * MiB)
    b.begin("forward")
    b.alloc(0x7000_0000, 4 * MiB)
    b.end("forward")


def two_allocs_of_2_63() -> bytes:
    b = LogBuilder()
    _base(b)
    b.alloc(0x1000_0000, 1 << 63, 1 << 63)
    b.alloc(0x2000_0000, 1 << 63, 1 << 63)
    return b.to_bytes()


def three_allocs_of_2_62() -> bytes:
    b = LogBuilder()
    _base(b)
    for k in range(3):
        b.alloc(0x1000_0000 + k * 0x1000_0000, 1 << 62, 1 << 62)
    return b.to_bytes()


def huge_segment() -> bytes:
    b = LogBuilder()
    _base(b)
    b.segment(0x9000_0000, 1 << 62)
    b.segment(0xA000_0000, 1 << 62)
    return b.to_bytes()


def oom_of_2_62() -> bytes:
    b = LogBuilder()
    _base(b)
    b.oom(1 << 62, 20 * MiB)
    return b.to_bytes()


def device_of_2_62() -> bytes:
    """A device record saying the GPU has 2^62 bytes (4 EiB): no GPU's, and no capacity to plan for."""
    b = LogBuilder()
    _base(b)
    b.record(R.DEVICE, addr=1 << 62, size=0)
    return b.to_bytes()


def repeated_phase_start() -> bytes:
    """forward occurrence 1 begun and ended, then begun again as occurrence 1."""
    b = LogBuilder()
    _base(b)
    b.begin("forward", epoch=1)
    b.alloc(0x7100_0000, MiB)
    b.end("forward", epoch=1)
    return b.to_bytes()


def phase_end_without_begin() -> bytes:
    b = LogBuilder()
    _base(b)
    b.end("backward", epoch=3)
    b.alloc(0x7100_0000, MiB)
    return b.to_bytes()


def block_record_without_device() -> bytes:
    b = LogBuilder()
    _base(b)
    b.alloc(0x7200_0000, 2 * MiB, device=-1)
    return b.to_bytes()


def control_characters() -> bytes:
    """Phase names, markers, file and function names with ESC sequences and other control characters."""
    b = LogBuilder()
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\r\x08\x0bphase\x7f\x9b"
    stack = b.stack((f"/tmp/{evil}.py", 3, f"fn{evil}"), ("/home/u/train.py", 10, "main"))
    b.segment(0x7000_0000, 20 * MiB)
    b.begin(evil)
    b.alloc(0x7000_0000, 4 * MiB, stack=stack)
    b.mark(f"mark{evil}")
    b.free(0x7000_0000, 4 * MiB, stack=stack)
    b.end(evil)
    b.begin("backward")
    b.alloc(0x7000_0000, 2 * MiB, stack=stack)
    b.oom(900 * MiB, 20 * MiB, stack=stack)
    b.end("backward")
    return b.to_bytes()


HOSTILE: dict[str, Callable[[], bytes]] = {
    "two-allocs-of-2-63": two_allocs_of_2_63,
    "three-allocs-of-2-62": three_allocs_of_2_62,
    "huge-segments": huge_segment,
    "oom-of-2-62": oom_of_2_62,
    "device-of-2-62": device_of_2_62,
    "repeated-phase-start": repeated_phase_start,
    "phase-end-without-begin": phase_end_without_begin,
    "block-record-without-device": block_record_without_device,
    "control-characters": control_characters,
}


def phase_id_out_of_range() -> bytes:
    """An allocation in phase 300 (a process has at most 256): once an OOM's replay failed on it."""
    b = LogBuilder()
    _base(b)
    b.alloc(0x7100_0000, MiB, phase=300)
    b.oom(900 * MiB, 20 * MiB)
    return b.to_bytes()


HOSTILE["phase-id-out-of-range"] = phase_id_out_of_range


def address_at_the_top() -> bytes:
    """A block at the top of the 64-bit address space, then an OOM: the OOM's replay once took 1 MiB past
    the highest address for the failed request, past 2^64."""
    b = LogBuilder()
    _base(b)
    b.alloc((1 << 64) - 4096, 512)
    b.oom(900 * MiB, 20 * MiB)
    b.record(R.OOM_DEVICE, addr=GiB, size=0, block_size=4 * MiB + 512, stream=16 * MiB, flags=2)  # capacity
    return b.to_bytes()


HOSTILE["address-at-the-top"] = address_at_the_top
