"""Write a SynthLog (synthlog.py) as a real log file (docs/LOG_FORMAT.md, version 2), so that the tools that read
files -- the streamed analysis, replay and export in pieces -- can be tested on the hand-made scenarios too."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from torchalloc.log import reader as talog

_HEADER = struct.Struct("<8sIIIIQQIiQIIQ16si")
_FIELDS = ("time_ns", "addr", "size", "block_size", "stream", "tid", "stack", "phase", "device", "flags")


def _seal(slot: np.ndarray) -> None:
    """Set byte 62 so that the slot's 64 bytes XOR to zero."""
    slot[62] = 0
    slot[62] = np.bitwise_xor.reduce(slot)


def write_log(synth: Any, path: Path, *, start_ns: int = 0) -> Path:
    """`synth` (a SynthLog) as a closed version-2 log at `path`: its strings, the frames and stacks of its
    stacks, then its rows in order, then an end record."""
    strings = dict(synth.strings)
    next_id = max([0, *strings, *synth.stacks]) + 1
    text_ids = {v: k for k, v in strings.items()}

    def string(text: str) -> int:
        nonlocal next_id
        if text not in text_ids:
            text_ids[text] = next_id
            strings[next_id] = text
            next_id += 1
        return text_ids[text]

    frames: dict[tuple[str, int, str], int] = {}
    stack_frames: dict[int, list[int]] = {}
    for sid, stack in synth.stacks.items():
        ids = []
        for f in stack:
            key = (str(f[0]), int(f[1]), str(f[2]))
            if key not in frames:
                string(key[0])
                string(key[2])
                frames[key] = next_id
                next_id += 1
            ids.append(frames[key])
        stack_frames[sid] = ids
    slots: list[np.ndarray] = []

    def slot() -> np.ndarray:
        s = np.zeros(64, dtype=np.uint8)
        slots.append(s)
        return s

    for sid, text in strings.items():
        data = text.encode()
        for chunk in range(max(1, -(-len(data) // 46))):
            s = slot()
            s[0:8] = np.frombuffer(struct.pack("<IHH", sid, len(data), chunk), np.uint8)
            part = data[46 * chunk: 46 * chunk + 46]
            s[16:16 + len(part)] = np.frombuffer(part, np.uint8)
            s[63] = talog.STRING
    for (file, line, func), fid in frames.items():
        s = slot()
        s[0:8] = np.frombuffer(struct.pack("<II", fid, line), np.uint8)
        s[16:24] = np.frombuffer(struct.pack("<II", text_ids[file], text_ids[func]), np.uint8)
        s[63] = talog.FRAME
    for sid, ids in stack_frames.items():
        for chunk in range(max(1, -(-len(ids) // 11))):
            s = slot()
            s[0:8] = np.frombuffer(struct.pack("<IHH", sid, len(ids), chunk), np.uint8)
            part = ids[11 * chunk: 11 * chunk + 11]
            s[16:16 + 4 * len(part)] = np.frombuffer(struct.pack(f"<{len(part)}I", *part), np.uint8)
            s[63] = talog.STACK
    rows = list(synth.rows) + [{"kind": talog.END, "device": -1, "time_ns": synth.rows[-1]["time_ns"] if synth.rows
                                else 0}]
    rec = np.zeros(len(rows), dtype=talog.RECORD_DTYPE)
    for name in _FIELDS:
        rec[name] = [r.get(name, 0) for r in rows]
    rec["time_ns"] += start_ns
    rec["kind"] = [r["kind"] for r in rows]
    rec["pool"] = [2 if r["kind"] in (talog.ALLOC, talog.FREE, talog.SEGMENT_ALLOC, talog.SEGMENT_FREE) else 0
                   for r in rows]
    meta_slots = np.stack(slots) if slots else np.zeros((0, 64), np.uint8)
    body = np.concatenate((meta_slots, rec.view(np.uint8).reshape(-1, 64)))
    body.view(talog.RECORD_DTYPE)["seq"][:, 0] = np.arange(len(body), dtype=np.uint64)
    for k in range(len(body)):
        _seal(body[k])
    end = 128 + 64 * len(body)
    header = bytearray(_HEADER.pack(talog.MAGIC, 2, 128, 64, 0x01020304, 10**18, start_ns, 4242, -1, 0, 1, 0, end,
                                    b"torchalloc", 0).ljust(128, b"\0"))
    header[60] = 0
    header[60] = np.bitwise_xor.reduce(np.frombuffer(bytes(header), np.uint8))
    Path(path).write_bytes(bytes(header) + body.tobytes())
    return Path(path)
