"""Build logs by hand, event by event, for tests of the analysis (no C library, no torch): as a file
(`SynthLog.file`, written by synthfile.py) and analysed (`SynthLog.analyze`)."""
from __future__ import annotations

import atexit
import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from torchalloc import analysis as A
from torchalloc._records import DEVICE

MiB = 1 << 20
USER = "/home/u/train.py"
LINEAR = "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py"
MODULE = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"
TENSOR = "/venv/lib/python3.12/site-packages/torch/_tensor.py"
AUTOGRAD = "/venv/lib/python3.12/site-packages/torch/autograd/__init__.py"
ADAM = "/venv/lib/python3.12/site-packages/torch/optim/adam.py"


_FILES: list[Path] = []  # the folder the logs written by SynthLog.file go to, made on first use
_NUMBERS = itertools.count()


def _folder() -> Path:
    if not _FILES:
        _FILES.append(Path(tempfile.mkdtemp(prefix="synthlog-")))
        atexit.register(shutil.rmtree, _FILES[0], True)
    return _FILES[0]


class SynthLog:
    """Records alloc/free/segment/phase/marker events in order, as the C log would."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.strings: dict[int, str] = {}
        self.stacks: dict[int, list[tuple[str, int, str]]] = {}
        self._stack_ids: dict[tuple, int] = {}
        self._next_id = 1
        self.phase_ids: dict[str, int] = {"default": 0}
        self.epochs: dict[int, int] = {}
        self.open: list[int] = []
        self.live: dict[int, tuple[int, int]] = {}  # addr -> (size, block_size)
        self.time = 0

    # ids ---------------------------------------------------------------
    def _string(self, text: str) -> int:
        for k, v in self.strings.items():
            if v == text:
                return k
        sid = self._next_id
        self._next_id += 1
        self.strings[sid] = text
        return sid

    def stack(self, *frames: tuple[str, int, str]) -> int:
        """A stack id for frames given innermost first."""
        key = tuple(frames)
        if not key:
            return 0
        if key not in self._stack_ids:
            self._stack_ids[key] = self._next_id
            self.stacks[self._next_id] = list(frames)
            self._next_id += 1
        return self._stack_ids[key]

    # records -------------------------------------------------------------
    @property
    def phase(self) -> int:
        return self.open[-1] if self.open else 0

    def _row(self, **kw: Any) -> None:
        self.time += kw.pop("dt", 1000)
        kw.setdefault("device", 0)
        kw.setdefault("phase", self.phase)
        kw.setdefault("tid", 1)
        kw["time_ns"] = self.time
        kw["seq"] = len(self.rows)
        self.rows.append(kw)

    def alloc(self, addr: int, size: int, stack: int = 0, tid: int = 1, block_size: int | None = None, **kw: Any) -> None:
        bs = block_size if block_size is not None else -(-size // 512) * 512
        self.live[addr] = (size, bs)
        self._row(kind=A.ALLOC, addr=addr, size=size, block_size=bs, stack=stack, tid=tid, **kw)

    def free(self, addr: int, stack: int = 0, tid: int = 1, **kw: Any) -> None:
        size, bs = self.live.pop(addr)
        self._row(kind=A.FREE, addr=addr, size=size, block_size=bs, stack=stack, tid=tid, **kw)

    def segment(self, addr: int, size: int) -> None:
        self._row(kind=A.SEGMENT_ALLOC, addr=addr, size=size, block_size=size, pool=2)

    def segment_free(self, addr: int, size: int) -> None:
        self._row(kind=A.SEGMENT_FREE, addr=addr, size=size, block_size=size, pool=2)

    def device_memory(self, total: int, limit: int = 0) -> None:
        """The device record: the GPU has `total` bytes, `limit` of them allowed (a memory fraction; 0: none)."""
        self._row(kind=DEVICE, addr=total, size=limit)

    def oom(self, size: int, reserved: int, stack: int = 0) -> None:
        self._row(kind=A.OOM, size=size, block_size=reserved, stack=stack)

    def begin(self, name: str) -> None:
        pid = self.phase_ids.setdefault(name, len(self.phase_ids))
        self.epochs[pid] = self.epochs.get(pid, 0) + 1
        self.open.append(pid)
        self._row(kind=A.PHASE_BEGIN, size=self.epochs[pid], stack=self._string(name), device=-1, phase=pid)

    def end(self) -> None:
        pid = self.open.pop()
        name = next(n for n, i in self.phase_ids.items() if i == pid)
        self._row(kind=A.PHASE_END, size=self.epochs[pid], stack=self._string(name), device=-1, phase=pid)

    def mark(self, label: str) -> None:
        self._row(kind=A.MARKER, stack=self._string(label), device=-1)

    def file(self, start_ns: int = 0) -> Path:
        """The events as a log file (synthfile.py: opened at `start_ns`, closed by an end record at its last
        event's time), in a folder removed when the tests end."""
        from synthfile import write_log

        return write_log(self, _folder() / f"synth{next(_NUMBERS)}.talog", start_ns=start_ns)

    def analyze(self, **kw: Any) -> A.Analysis:
        return A.analyze(self.file(), **kw)
