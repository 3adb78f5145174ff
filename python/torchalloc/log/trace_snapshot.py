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
from typing import Any, BinaryIO, NoReturn

import numpy as np

from .trace_events import ALLOC, EVENT_DTYPE, FREE, MAX_REQUEST, Trace, TraceError, live_peaks
from ..units import fmt_bytes

# First bytes a pickle can start with: PROTO (protocol 2+), or an opcode that
# can open a protocol 0/1 pickle. Anything else is not tried as a pickle.
_PICKLE_STARTS = frozenset(b"\x80(}])cINLSVFGJKMXUTB")
_U64 = (1 << 64) - 1  # addresses and streams are unsigned 64-bit in the replay events


def looks_like_pickle(data: bytes) -> bool:
    """Whether `data` starts the way a pickle can (so it is worth unpickling, safely)."""
    return bool(data) and data[0] in _PICKLE_STARTS


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


def safe_unpickle(data: bytes | BinaryIO, what: str = "trace") -> Any:
    """Unpickle `data` admitting only builtin containers and scalars; TraceError otherwise."""
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        return _RestrictedUnpickler(stream).load()
    except TraceError:
        raise
    except RecursionError:
        raise TraceError(f"{what}: malformed pickle (nested too deeply)") from None
    except MemoryError:
        raise TraceError(f"{what}: malformed pickle (asks for more memory than there is)") from None
    except EOFError:
        raise TraceError(f"{what}: truncated pickle (ends before its STOP opcode)") from None
    except Exception as e:  # UnpicklingError, ValueError, KeyError, TypeError, ... from bad opcodes
        raise TraceError(f"{what}: malformed pickle ({type(e).__name__}: {e})") from None


def load_snapshot(data: bytes, what: str, *, device: int | None, prelude: bool) -> Trace:
    """The trace in a snapshot's pickled bytes; `what` names the source in errors and is the trace's path."""
    trace = from_snapshot(safe_unpickle(data, what), device=device, prelude=prelude, what=what)
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
        elif action in _SEGMENT_SIGN:
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
        for s, seg in enumerate(segments):
            if not isinstance(seg, dict):
                raise TraceError(f"{what}: segments[{s}] is a {type(seg).__name__}, not a dict")
            if seg.get("device", dev) != dev:
                continue
            where = f"{what}: segments[{s}]"
            end_reserved += _size_field(seg, "total_size", where)
            offset = _int_field(seg, "address", where, 0)
            seg_stream = _int_field(seg, "stream", where, 0) & _U64
            blocks = seg.get("blocks", [])
            if not isinstance(blocks, list):
                raise TraceError(f"{where}: 'blocks' is not a list")
            for b, block in enumerate(blocks):
                bwhere = f"{where}.blocks[{b}]"
                if not isinstance(block, dict):
                    raise TraceError(f"{bwhere} is a {type(block).__name__}, not a dict")
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
