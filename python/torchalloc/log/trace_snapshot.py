"""A PyTorch memory snapshot as a `Trace`: safe unpickling, the events of one device, PyTorch's reserved curve.

Takes the bytes of a snapshot (``torch.cuda.memory._dump_snapshot``, a
pickle) or the dict it holds; gives a `Trace` (trace_events.py).

The pickle is read with a restricted unpickler that admits only builtin
containers and scalars: a pickle that names any class or function (the way
a hostile pickle runs code) is refused with `TraceError` before anything
is called.

A snapshot's history is a ring buffer (``_record_memory_history(max_entries=)``):
it may begin in the middle of the run. Then some frees name addresses the
trace never allocated, and some blocks live at the end were allocated
before it began. With ``prelude=True`` (the default) both are
reconstructed as allocations at the start of the trace, from the free
records' sizes and the snapshot's ``segments`` list, so the replayed
policies carry the same live memory the real run did; they are counted
either way. PyTorch's initial reserved memory is then unknown too: it is
estimated as (reserved at the end, from ``segments``) minus (net segment
growth over the trace), and the estimate is named in `Trace.notes`.
"""
from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any, BinaryIO, NoReturn

import numpy as np

from .._compressed import CompressedError
from .trace_events import ALLOC, EVENT_DTYPE, FREE, MAX_REQUEST, Trace, TraceError, live_peaks
from ..units import fmt_bytes

# First bytes a pickle can start with: PROTO (protocol 2+), or an opcode that
# can open a protocol 0/1 pickle. Anything else is not tried as a pickle.
_PICKLE_STARTS = frozenset(b"\x80(}])cINLSVFGJKMXUTB")
_U64 = (1 << 64) - 1  # addresses and streams are unsigned 64-bit in the replay events


def looks_like_pickle(data: bytes) -> bool:
    """Whether `data` starts the way a pickle can (so it is worth unpickling, safely)."""
    return bool(data) and data[0] in _PICKLE_STARTS


def looks_like_snapshot(data: bytes) -> bool:
    """Whether `data` (at least the content's first 12 bytes) starts a pickle of a dict, as every PyTorch memory
    snapshot is: PROTO and FRAME aside, its first opcode makes a dict (EMPTY_DICT, or MARK and DICT in protocol 0).
    A text file whose first letter happens to be a pickle opcode ("Some notes", "N...") does not."""
    at = 2 if data[:1] == b"\x80" else 0
    if data[at:at + 1] == b"\x95":  # FRAME and its 8-byte length (protocol 4 and later)
        at += 9
    return data[at:at + 1] == b"}" or data[at:at + 2] == b"(d"


class MalformedPickleError(TraceError):
    """The bytes are not a pickle the unpickler can finish (truncated, or opcodes that make no sense)."""


class _RestrictedUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, str, bytes, int, float, bool and None; nothing else.

    Those need no `find_class`. Every other object a pickle can make comes
    from a class or function it names (GLOBAL, STACK_GLOBAL, INST, EXT*),
    and naming one is exactly how a hostile pickle runs code: refused here,
    before it is looked up, so REDUCE never gets a callable.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise TraceError(
            f"refusing to unpickle {module}.{name}: a memory snapshot holds only builtin containers and "
            "scalars, and loading anything else could run arbitrary code (is this file really from "
            "torch.cuda.memory._dump_snapshot?)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise TraceError("refusing a pickle with persistent ids: not a PyTorch memory snapshot")


# How _MemoCheck passes over each opcode (from pickletools' table): a positive number is the opcode's whole
# length (no argument, or one of fixed size); the rest are codes below.
_HALT, _LINE, _PUT, _LONG_BINPUT = 0, -1, -2, -3  # nothing after it runs; a newline-ended argument; two puts
_BINPUT, _MEMOIZE, _FRAME = -4, -5, -6  # the third put, the put without an index, a frame and its length
# An argument whose size comes first (pickletools' n -> the size's width, signed), coded -10 + n in _STEP.
_SIZE_FIRST = {pickletools.TAKEN_FROM_ARGUMENT1: (1, False), pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
               pickletools.TAKEN_FROM_ARGUMENT4U: (4, False), pickletools.TAKEN_FROM_ARGUMENT8U: (8, False)}
_SIZED = {-10 + n: size for n, size in _SIZE_FIRST.items()}
_SHORT = -10 + pickletools.TAKEN_FROM_ARGUMENT1
_STEP = [_HALT] * 256  # an opcode the unpickler does not know: it stops there
for _op in pickletools.opcodes:
    _arg = _op.arg
    _STEP[ord(_op.code)] = (1 if _arg is None else 1 + _arg.n if _arg.n >= 0
                            else _LINE if _arg.n == pickletools.UP_TO_NEWLINE else -10 + _arg.n)
for _code in b".ciP":  # STOP, and what the unpickler refuses (GLOBAL, INST, PERSID)
    _STEP[_code] = _HALT
_STEP[ord("p")], _STEP[ord("r")], _STEP[ord("q")] = _PUT, _LONG_BINPUT, _BINPUT
_STEP[0x94], _STEP[0x95] = _MEMOIZE, _FRAME
# The longest string, bytes or frame a snapshot's pickle can need: its text is file and function names, source
# lines and field values, none near this; the pickler's frames are about 64 KiB. A longer one is refused before
# the unpickler reserves it (one 3 GiB bytes object in 469 KB of xz took 6.35 GB).
MAX_ARGUMENT = 1 << 20
# A compressed snapshot inflates to at most this many times its size (the bundled one: 8.9 times), or
# INFLATED_FLOOR bytes, whichever is more: what a pickle makes is bounded by its bytes, and past this they are
# padding no snapshot holds (a 39 KB xz took 4.24 GB). Plain files: their bytes are on disk.
MAX_INFLATION = 1000
INFLATED_FLOOR = 64 << 20
_LONGEST_PUT = 24  # bytes of a PUT opcode and its decimal index: longer, the index is beyond any memo
_PIECE = 1 << 20  # bytes of a stream checked at a time


class _MemoCheck:
    """Walks a pickle's opcodes before it is unpickled and refuses what would cost memory beyond what the
    pickle makes: a memo index out of order, an argument (a string, bytes, a frame) longer than MAX_ARGUMENT,
    and, given `limit`, more bytes than that (a compressed file inflated past MAX_INFLATION).

    CPython's C unpickler (until its fix for gh-115952) keeps its memo in an array as long as the largest
    index stored: PROTO 2, an empty dict, LONG_BINPUT 2^30 and STOP, 9 bytes, took 16.8 GB and 46 s
    (Python 3.11). A pickler numbers what it memoizes from 0 in order (the next index is the memo's size,
    in CPython's picklers in Python and in C alike: PUT, BINPUT, LONG_BINPUT, and MEMOIZE which names
    none), so an index above the objects memoized before it is refused: the memo then holds one entry per
    object the pickle made. The bytes come in pieces (a compressed file as it is inflated); an opcode cut between two is
    finished in the next."""

    def __init__(self, what: str, limit: int | None = None) -> None:
        self.what = what
        self.limit = limit  # the most bytes accepted, or None
        self.offset = 0  # bytes of the pickle before `carry`
        self.carry = b""  # an opcode whose argument the next piece completes
        self.skip = 0  # bytes of a long argument still to pass over
        self.in_line = False  # inside a newline-ended argument that does not matter (not a PUT's)
        self.line = 0  # bytes of that argument so far
        self.memoized = 0  # objects memoized so far: the next index a pickler writes
        self.long: tuple[int, int] | None = None  # an argument over MAX_ARGUMENT being passed over: (size, at)
        self.done = False  # at STOP, or at an opcode the unpickler refuses or does not know

    def feed(self, piece: bytes) -> None:
        if self.done:
            return
        if self.limit is not None and self.offset + len(self.carry) + len(piece) > self.limit:
            raise TraceError(
                f"{self.what}: it inflates to more than {self.limit} bytes, {MAX_INFLATION} times its compressed "
                "size: beyond any snapshot (PyTorch's inflate about 10 times), and what it would make could take "
                "that much memory; refusing it"
            )
        if self.skip or self.in_line:
            if self.skip:
                k = min(self.skip, len(piece))
                self.skip -= k
                if self.long and not self.skip:
                    self._check_length(*self.long)
            else:
                j = piece.find(b"\n")
                k = len(piece) if j < 0 else j + 1
                self.in_line = j < 0
                self.line += k
                self._check_length(self.line, self.offset)
            self.offset += k
            piece = piece[k:]
            if not piece:
                return
        data = self.carry + piece
        base, i, end = self.offset, 0, len(data)
        step_of = _STEP  # a local: this loop runs once an opcode, millions of times for a large snapshot
        while i < end:
            step = step_of[data[i]]
            if step > 0:
                if i + step > end:
                    break
                i += step
            elif step == _SHORT:  # the common sized ones (SHORT_BINUNICODE, LONG1): a size of one byte first
                if i + 2 > end:
                    break
                i += 2 + data[i + 1]
            elif step in _SIZED:
                width, signed = _SIZED[step]
                if i + 1 + width > end:
                    break
                size = int.from_bytes(data[i + 1:i + 1 + width], "little", signed=signed)
                if size < 0:  # the unpickler refuses a negative size
                    self.done = True
                    return
                if size > MAX_ARGUMENT:  # refused once its bytes are there (else the pickle is truncated)
                    self.long = (size, base + i)
                i += 1 + width + size
                if self.long and i <= end:
                    self._check_length(*self.long)
            elif step == _LONG_BINPUT:
                if i + 5 > end:
                    break
                self._check(int.from_bytes(data[i + 1:i + 5], "little"), base + i)
                i += 5
            elif step == _BINPUT:
                if i + 2 > end:
                    break
                self._check(data[i + 1], base + i)
                i += 2
            elif step == _MEMOIZE:
                self.memoized += 1
                i += 1
            elif step == _FRAME:  # the unpickler reads a frame whole: its length is an argument's
                if i + 9 > end:
                    break
                self._check_length(int.from_bytes(data[i + 1:i + 9], "little"), base + i)
                i += 9
            elif step == _HALT:
                self.done = True
                return
            else:  # a newline-ended argument: a PUT's index, or one that does not matter here
                j = data.find(b"\n", i + 1)
                if j < 0 and step == _PUT and end - i <= _LONGEST_PUT:
                    break  # the index ends in the next piece
                if step == _PUT:
                    index = data[i + 1:j] if j >= 0 else b""
                    self._check(int(index) if index.isdigit() and len(index) < _LONGEST_PUT else -1, base + i)
                if j < 0:
                    self.line = end - i
                    self._check_length(self.line, base + i)
                    self.in_line, self.carry, self.offset = True, b"", base + end
                    return
                self._check_length(j - i, base + i)
                i = j + 1
        if i > end:  # inside a long argument: its rest is in the next pieces
            self.skip, self.carry, self.offset = i - end, b"", base + end
        else:
            self.carry, self.offset = data[i:], base + i

    def finish(self) -> None:
        """At the end of the bytes: a pickle that ends before its STOP is refused here, before the unpickler
        reserves what an argument cut short declares (BYTEARRAY8 of 10^18 bytes)."""
        if not self.done:
            raise MalformedPickleError(f"{self.what}: truncated pickle (ends before its STOP opcode)")

    def _check(self, index: int, at: int) -> None:
        if not 0 <= index <= self.memoized:
            stored = f"object {index}" if index >= 0 else "an object under an index that is no number"
            raise MalformedPickleError(
                f"{self.what}: malformed pickle: it stores {stored} at byte {at}: no pickler numbers objects out "
                f"of order (the next is {self.memoized}), and unpickling it would take memory for every number up "
                "to it (9 bytes of pickle once took 16.8 GB); refusing it"
            )
        self.memoized = max(self.memoized, index + 1)

    def _check_length(self, size: int, at: int) -> None:
        if size > MAX_ARGUMENT:
            raise MalformedPickleError(
                f"{self.what}: malformed pickle: a string, bytes or frame of {size} bytes at byte {at}: no memory "
                "snapshot holds one "
                f"longer than {MAX_ARGUMENT} bytes (its text is file and function names and source lines), and "
                "unpickling it would take that much memory; refusing it"
            )


def safe_unpickle(data: bytes | BinaryIO, what: str = "trace", *, limit: int | None = None) -> Any:
    """Unpickle `data` (bytes, or a seekable stream: a compressed file, inflated as it is read) admitting
    only builtin containers and scalars; TraceError otherwise. The pickle is checked first (_MemoCheck, which
    refuses more than `limit` bytes when given): a stream is read twice."""
    check = _MemoCheck(what, limit)
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            check.feed(bytes(data))
            stream: BinaryIO = io.BytesIO(data)
        else:
            while not check.done and (piece := data.read(_PIECE)):
                check.feed(piece)
            data.seek(0)
            stream = data
        check.finish()
        return _RestrictedUnpickler(stream).load()
    except TraceError:
        raise
    except CompressedError as e:  # the stream under the pickle is cut short or corrupt
        raise TraceError(f"{what}: {e}") from None
    except RecursionError:
        raise MalformedPickleError(f"{what}: malformed pickle (nested too deeply)") from None
    except MemoryError:
        raise MalformedPickleError(f"{what}: malformed pickle (asks for more memory than there is)") from None
    except EOFError:
        raise MalformedPickleError(f"{what}: truncated pickle (ends before its STOP opcode)") from None
    except Exception as e:  # UnpicklingError, ValueError, KeyError, TypeError, ... from bad opcodes
        raise MalformedPickleError(f"{what}: malformed pickle ({type(e).__name__}: {e})") from None


def inflated_limit(compressed_size: int) -> int:
    """The most bytes a compressed snapshot of `compressed_size` bytes may inflate to (MAX_INFLATION)."""
    return max(MAX_INFLATION * compressed_size, INFLATED_FLOOR)


def load_snapshot(data: bytes | BinaryIO, what: str, *, device: int | None, prelude: bool,
                  limit: int | None = None) -> Trace:
    """The trace in a snapshot's pickled bytes (or a stream of them); `what` names the source in errors and is
    the trace's path. `limit`: the most bytes accepted (a compressed file's inflated_limit)."""
    trace = from_snapshot(safe_unpickle(data, what, limit=limit), device=device, prelude=prelude, what=what)
    trace.path = what
    return trace


def _describe(value: Any) -> str:
    """A value for an error message: its type, and its repr only when that is a short scalar. A hostile
    snapshot can nest a value 200,000 levels deep, and repr() of that raises RecursionError."""
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value) if isinstance(value, (str, bytes, float, int)) else ""
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}".rstrip()


def _int_field(entry: dict[str, Any], key: str, where: str, default: int | None = None, limit: int = _U64) -> int:
    """entry[key] as an int in [-limit, limit]: addresses may be negative in hand-made snapshots and are
    masked to 64 bits; sizes are checked by the caller."""
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None:
            raise TraceError(f"{where}: no '{key}'")
        raise TraceError(f"{where}: '{key}' is {_describe(value)}, not an integer")
    if not -limit <= value <= limit:
        raise TraceError(f"{where}: '{key}' is {value}, beyond any device's address space")
    return value


def _size_field(entry: dict[str, Any], key: str, where: str) -> int:
    value = _int_field(entry, key, where)
    if not 0 <= value <= MAX_REQUEST:  # also keeps the int64 reserved curve from overflowing
        raise TraceError(f"{where}: '{key}' {value} is negative or larger than any device")
    return value


def _bad_entry(entry: dict[str, Any], keys: tuple[str, ...], where: str) -> NoReturn:
    """Raise TraceError naming the first of `keys` that is missing or not a sane integer."""
    for key in keys:
        value = entry.get(key, 0 if key == "stream" else None)
        if value is None:
            raise TraceError(f"{where}: no '{key}'")
        if type(value) is not int:
            raise TraceError(f"{where}: '{key}' is {_describe(value)}, not an integer")
        if key == "size" and not 0 <= value <= MAX_REQUEST:
            raise TraceError(f"{where}: size {value} is negative or larger than any device")
    raise TraceError(f"{where}: malformed entry")


_SEGMENT_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_ACTIVE_BLOCK_STATES = ("active_allocated", "active_awaiting_free", "active_pending_free")


def _pick_device(traces: list[Any], device: int | None, what: str) -> int:
    if device is not None:
        if not 0 <= device < len(traces):
            n = len(traces)
            raise TraceError(f"{what}: no device {device} (the snapshot has traces for {n} device{'s' if n != 1 else ''}"
                             f"{f': 0 to {n - 1}' if n > 1 else ': 0' if n else ''})")
        if not traces[device]:
            raise TraceError(f"{what}: device_traces are empty for device {device}")
        return device
    counts = [len(t) if isinstance(t, list) else 0 for t in traces]
    if not counts or max(counts) == 0:
        raise TraceError(
            f"{what}: the snapshot's device_traces are empty: record with "
            "torch.cuda.memory._record_memory_history() before the run, then _dump_snapshot()"
        )
    return int(np.argmax(counts))


def _walk_once(walked: dict[int, int], obj: Any, s: int, kind: str, what: str) -> None:
    """TraceError when `obj` (segment `s`'s dict or blocks list) was met before in the snapshot.

    A pickle may name one object many times for a few bytes each (a memo reference): one blocks list of
    4000 blocks named by 4000 segments is 16 KB of pickle and 16 million blocks to walk (issue 36: 3.8 GB,
    23 s). PyTorch writes every segment and blocks list once (only frames, which are not walked here, and
    strings are shared), so a shared one is refused rather than walked again for every reference."""
    first = walked.setdefault(id(obj), s)
    if first != s:
        shared = f"is segments[{first}] again" if kind == "segment" else f"has the blocks list of segments[{first}]"
        raise TraceError(
            f"{what}: segments[{s}] {shared} (a shared reference in the pickle): PyTorch writes each segment "
            "with its own, and walking it again for every reference would take time and memory far beyond the "
            "file's size; refusing the snapshot"
        )


def from_snapshot(snapshot: Any, *, device: int | None = None, prelude: bool = True, what: str = "snapshot") -> Trace:
    """The trace in a PyTorch memory snapshot (the dict _dump_snapshot pickles)."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        kind = type(snapshot).__name__
        raise TraceError(
            f"{what}: not a PyTorch memory snapshot (a {kind} without 'device_traces'; write one with "
            "torch.cuda.memory._record_memory_history() then torch.cuda.memory._dump_snapshot(path))"
        )
    traces = snapshot["device_traces"]
    if not isinstance(traces, list):
        raise TraceError(f"{what}: 'device_traces' is a {type(traces).__name__}, not a list")
    dev = _pick_device(traces, device, what)
    entries = traces[dev]
    if not isinstance(entries, list):
        raise TraceError(f"{what}: device_traces[{dev}] is a {type(entries).__name__}, not a list")

    kinds: list[int] = []
    addrs: list[int] = []
    sizes: list[int] = []
    streams: list[int] = []
    native_pos: list[int] = []
    native_delta: list[int] = []
    live: dict[int, int] = {}  # trace addr -> requested size
    seen: set[int] = set()
    pre: list[tuple[int, int, int]] = []  # (addr, size, stream) live before the trace began
    unknown = replaced = ooms = 0
    other_actions: dict[str, int] = {}

    for i, entry in enumerate(entries):
        if type(entry) is not dict:
            raise TraceError(f"{what}: device_traces[{dev}][{i}] is a {type(entry).__name__}, not a dict")
        get = entry.get
        action = get("action")
        if action == "alloc":
            addr, size, stream = get("addr"), get("size"), get("stream", 0)
            if type(addr) is not int or type(size) is not int or type(stream) is not int or not 0 <= size <= MAX_REQUEST:
                _bad_entry(entry, ("addr", "size", "stream"), f"{what}: device_traces[{dev}][{i}]")
            addr &= _U64
            if live.pop(addr, None) is not None:  # the free was lost: the address must be free again
                replaced += 1
            live[addr] = size
            seen.add(addr)
            kinds.append(ALLOC)
            addrs.append(addr)
            sizes.append(size)
            streams.append(stream & _U64)
        elif action == "free_completed":
            addr, stream = get("addr"), get("stream", 0)
            if type(addr) is not int or type(stream) is not int:
                _bad_entry(entry, ("addr", "stream"), f"{what}: device_traces[{dev}][{i}]")
            addr &= _U64
            if live.pop(addr, None) is None:
                unknown += 1
                free_size = get("size")
                if prelude and addr not in seen and type(free_size) is int and 0 < free_size <= MAX_REQUEST:
                    pre.append((addr, free_size, stream & _U64))
            seen.add(addr)
            kinds.append(FREE)
            addrs.append(addr)
            sizes.append(0)
            streams.append(stream & _U64)
        elif isinstance(action, str) and action in _SEGMENT_SIGN:  # a list or dict is unhashable
            size = get("size")
            if type(size) is not int or not 0 <= size <= MAX_REQUEST:
                _bad_entry(entry, ("size",), f"{what}: device_traces[{dev}][{i}]")
            native_pos.append(len(kinds))
            native_delta.append(size * _SEGMENT_SIGN[action])
        elif action == "oom":
            ooms += 1
        elif action in ("free_requested", "snapshot"):
            pass
        elif isinstance(action, str):
            other_actions[action] = other_actions.get(action, 0) + 1
        else:
            raise TraceError(f"{what}: device_traces[{dev}][{i}]: no 'action' string")

    notes: list[str] = []
    # Blocks live at the end that the trace never allocated: allocated before it began.
    end_reserved: int | None = None
    segments = snapshot.get("segments")
    if isinstance(segments, list):
        end_reserved = 0
        walked: dict[int, int] = {}  # id of each segment and blocks list walked -> its segment's index
        walked_blocks: dict[int, str] = {}  # id of each block dict walked -> where it was
        for s, seg in enumerate(segments):
            if not isinstance(seg, dict):
                raise TraceError(f"{what}: segments[{s}] is a {type(seg).__name__}, not a dict")
            _walk_once(walked, seg, s, "segment", what)
            if seg.get("device", dev) != dev:
                continue
            where = f"{what}: segments[{s}]"
            end_reserved += _size_field(seg, "total_size", where)
            offset = _int_field(seg, "address", where, 0)
            seg_stream = _int_field(seg, "stream", where, 0) & _U64
            blocks = seg.get("blocks", [])
            if not isinstance(blocks, list):
                raise TraceError(f"{where}: 'blocks' is not a list")
            if blocks:  # an empty list costs nothing however often it is named
                _walk_once(walked, blocks, s, "blocks list", what)
            for b, block in enumerate(blocks):
                bwhere = f"{where}.blocks[{b}]"
                if not isinstance(block, dict):
                    raise TraceError(f"{bwhere} is a {type(block).__name__}, not a dict")
                first = walked_blocks.setdefault(id(block), bwhere)
                if first != bwhere:  # one dict named for every block: 16 million blocks from 7.6 KB of xz
                    raise TraceError(
                        f"{bwhere} is {first.removeprefix(what + ': ')} again (a shared reference in the pickle): "
                        "PyTorch writes each block once, and walking it again for every reference would take time "
                        "and memory far beyond the file's size; refusing the snapshot")
                bsize = _size_field(block, "size", bwhere)
                addr = _int_field(block, "address", bwhere, offset) & _U64
                offset = addr + bsize
                if prelude and block.get("state") in _ACTIVE_BLOCK_STATES and addr not in seen:
                    req = block.get("requested_size")
                    pre.append((addr, req if type(req) is int and 0 < req <= MAX_REQUEST else bsize, seg_stream))

    n_pre = len(pre)
    if unknown:
        notes.append(
            f"{unknown} frees of addresses the trace never allocated: the history (a ring buffer) "
            "begins mid-run"
        )
    if n_pre:
        notes.append(f"{n_pre} allocations made before the history began were reconstructed at its start")
    if replaced:
        notes.append(f"{replaced} allocations of an address still live in the trace (a lost free)")
    if other_actions:
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(other_actions.items()))
        notes.append(f"ignored actions: {listed}")

    events = np.zeros(n_pre + len(kinds), dtype=EVENT_DTYPE)
    if n_pre:
        pre_arr = np.array(pre, dtype=np.uint64).reshape(-1, 3)
        events["kind"][:n_pre] = ALLOC
        events["addr"][:n_pre] = pre_arr[:, 0]
        events["size"][:n_pre] = pre_arr[:, 1]
        events["stream"][:n_pre] = pre_arr[:, 2]
    if kinds:
        events["kind"][n_pre:] = np.array(kinds, dtype=np.uint8)
        events["addr"][n_pre:] = np.array(addrs, dtype=np.uint64)
        events["size"][n_pre:] = np.array(sizes, dtype=np.uint64)
        events["stream"][n_pre:] = np.array(streams, dtype=np.uint64)

    peak_req, peak_rounded = live_peaks(events)

    trace = Trace(
        events=events,
        source="pytorch-snapshot",
        device=dev,
        peak_requested=peak_req,
        peak_rounded=peak_rounded,
        unknown_frees=unknown,
        replaced_allocs=replaced,
        prelude=n_pre,
        native_ooms=ooms,
        notes=notes,
    )
    _native_curve(trace, native_pos, native_delta, n_pre, end_reserved, bool(unknown or n_pre))
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, dict) and settings.get("torchalloc") is True:  # `torchalloc export` writes this
        trace.native_label = "recorded (torchalloc, exported)"
    else:
        trace.native_label = "recorded (PyTorch)"
    return trace


def _native_curve(
    trace: Trace,
    native_pos: list[int],
    native_delta: list[int],
    n_pre: int,
    end_reserved: int | None,
    mid_run: bool,
) -> None:
    """PyTorch's reserved bytes over the trace, from its segment events (see the module docstring)."""
    if not native_pos and end_reserved is None:
        trace.notes.append("no segment events and no segments list: PyTorch's own reserved memory is unknown")
        return
    pos = np.array(native_pos, dtype=np.int64) + n_pre
    delta = np.array(native_delta, dtype=np.int64)
    net = int(delta.sum()) if len(delta) else 0
    if end_reserved is not None:
        initial = end_reserved - net
        if initial < 0:
            trace.notes.append(
                f"segments at the end hold {fmt_bytes(end_reserved, 2)} but the trace grew by {fmt_bytes(net, 2)}: "
                "inconsistent snapshot, initial reserved taken as 0"
            )
            initial = 0
        elif initial > 0:
            trace.notes.append(
                f"PyTorch held {fmt_bytes(initial, 2)} reserved before the history began (estimated: reserved at the end, "
                "from the snapshot's segments, minus the growth the trace records)"
            )
    else:
        initial = 0
        if mid_run:
            trace.notes.append(
                "the history begins mid-run and the snapshot has no segments list: PyTorch's initial reserved "
                "memory is unknown, taken as 0 (its peak below is a lower bound)"
            )
    trace.native_initial_reserved = initial
    trace.native_pos = pos
    trace.native_delta = delta
    prefix = np.cumsum(delta, dtype=np.int64)
    trace.native_peak_reserved = initial + max(0, int(prefix.max()) if len(prefix) else 0)
