"""Load an allocation trace into the event array `torchalloc replay` feeds to C.

Two sources:

- a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``), a
  pickle, possibly gzip/xz/bz2-compressed. It is read with a restricted
  unpickler that admits only builtin containers and scalars: a pickle that
  names any class or function (the way a hostile pickle runs code) is
  refused with `TraceError` before anything is called.
- a torchalloc event log (docs/LOG_FORMAT.md), decoded by `torchalloc.log`.

The result is a `Trace`: a numpy structured array with the layout of
``torchalloc_replay_event`` (allocator/torchalloc.h), plus what the trace
says about itself (how PyTorch's own allocator reserved memory, for a
snapshot; frees of addresses it never saw allocated, and so on).

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

import dataclasses
import io
import os
import pickle
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np

from . import _lib
from . import _records as records
from ._compressed import decompress
from .units import fmt_bytes

# Mirrors torchalloc_replay_event field for field, naturally aligned; its size is the C ABI's
# (_lib checks the library's against it before the first replay).
EVENT_DTYPE = np.dtype(
    {
        "names": ["addr", "size", "stream", "phase", "kind"],
        "formats": ["<u8", "<u8", "<u8", "<u2", "u1"],
        "offsets": [0, 8, 16, 24, 26],
        "itemsize": _lib.REPLAY_EVENT_SIZE,
    }
)
# The kinds of replay events (TORCHALLOC_REPLAY_*).
ALLOC, FREE, PHASE_BEGIN, PHASE_END = _lib.REPLAY_ALLOC, _lib.REPLAY_FREE, _lib.REPLAY_PHASE_BEGIN, _lib.REPLAY_PHASE_END
MAX_PHASES = _lib.MAX_PHASES
MAX_REQUEST = (1 << 40) - (2 << 20)  # larger requests are malformed (replay.c refuses them too)
_U64 = (1 << 64) - 1

# First bytes a pickle can start with: PROTO (protocol 2+), or an opcode that
# can open a protocol 0/1 pickle. Anything else is not tried as a pickle.
_PICKLE_STARTS = frozenset(b"\x80(}])cINLSVFGJKMXUTB")


class TraceError(ValueError):
    """The trace cannot be read: missing, truncated, malformed, or refused as unsafe."""


@dataclasses.dataclass
class Trace:
    """An allocation trace ready to replay."""

    events: np.ndarray  # EVENT_DTYPE
    source: str  # "pytorch-snapshot" | "torchalloc-log" | "synthetic"
    path: str = ""
    device: int = 0
    peak_requested: int = 0  # peak of the bytes live in the trace, as requested
    peak_rounded: int = 0  # the same with every size rounded up to 512 B: no policy can need less
    unknown_frees: int = 0  # frees of addresses the trace never saw allocated
    replaced_allocs: int = 0  # allocations of an address that was still live in the trace
    prelude: int = 0  # allocations reconstructed at the start (see the module docstring)
    phase_names: dict[int, str] = dataclasses.field(default_factory=dict)
    # PyTorch's own reserved bytes (snapshot with segment events), else None.
    native_peak_reserved: int | None = None
    native_initial_reserved: int | None = None
    # native_pos[i]: replay events before the i-th segment event; native_delta[i]: its bytes (+/-).
    native_pos: np.ndarray | None = None
    native_delta: np.ndarray | None = None
    native_ooms: int = 0
    native_label: str = "native (PyTorch)"  # a log: "recorded (<policy>)", what torchalloc reserved in the run
    notes: list[str] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return int(self.events.shape[0])

    def native_reserved_series(self, buckets: int) -> np.ndarray | None:
        """PyTorch's reserved bytes, highest per bucket of events (as torchalloc_replay's series)."""
        if self.native_pos is None or self.native_delta is None or self.native_initial_reserved is None:
            return None
        n = len(self)
        if n == 0 or buckets <= 0:
            return None
        after = self.native_initial_reserved + np.cumsum(self.native_delta, dtype=np.int64)
        # Reserved in force after each replay event k: the sum of the deltas with pos <= k.
        idx = np.searchsorted(self.native_pos, np.arange(n), side="right")
        level = np.concatenate(([self.native_initial_reserved], after))[idx]
        # A segment that was reserved and released between two replay events
        # still counts toward that bucket's high: fold each delta's level in.
        edges = -(-np.arange(buckets + 1, dtype=np.int64) * n // buckets)  # ceil(b * n / buckets)
        bucket_of_event = np.searchsorted(edges, np.arange(n), side="right") - 1
        out = np.full(buckets, -1, dtype=np.int64)
        np.maximum.at(out, bucket_of_event, level)
        if len(after):
            pos = np.minimum(self.native_pos, n - 1)
            np.maximum.at(out, np.searchsorted(edges, pos, side="right") - 1, after)
        empty = out < 0
        if empty.any():  # buckets with no event (more buckets than events): the level in force
            out[empty] = level[np.minimum(edges[:-1][empty], n - 1)]
        return out


# ---------------------------------------------------------------------------
# Reading bytes: compression, restricted unpickling
# ---------------------------------------------------------------------------


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


def _decompress(raw: bytes, what: str) -> bytes:
    try:
        return decompress(raw)
    except ValueError as e:
        raise TraceError(f"{what}: {e}") from None


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes, decompressed if it is gzip, xz or bz2."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{p}: is a directory, not a trace") from None
    except OSError as e:
        raise TraceError(f"{p}: cannot read ({e.strerror or e})") from None
    if not raw:
        raise TraceError(f"{p}: empty file")
    return _decompress(raw, str(p))


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def load_trace(path: str | os.PathLike[str], *, device: int | None = None, prelude: bool = True) -> Trace:
    """Load a PyTorch memory snapshot or a torchalloc log (recognised by content, not by name)."""
    p = Path(path)
    data = read_bytes(p)
    if data.startswith(records.LOG_MAGIC):
        return _from_log(p, data, device=device, prelude=prelude)
    if data[0] not in _PICKLE_STARTS:
        raise TraceError(
            f"{p}: neither a PyTorch memory snapshot (a pickle, optionally .gz/.xz) nor a torchalloc log "
            f"(starts with {data[:8]!r})"
        )
    snapshot = safe_unpickle(data, str(p))
    trace = from_snapshot(snapshot, device=device, prelude=prelude, what=str(p))
    trace.path = str(p)
    return trace


def _from_log(path: Path, data: bytes, *, device: int | None, prelude: bool) -> Trace:
    try:
        from . import log as _log  # the decoder of docs/LOG_FORMAT.md
    except ImportError as e:
        raise TraceError(f"{path}: a torchalloc log, but torchalloc.log cannot be imported ({e})") from None
    try:
        decoded = _log.read_log(data, warn=False)
    except _log.LogFormatError as e:
        raise TraceError(str(e).replace("<bytes>", str(path))) from None
    decoded.path = str(path)
    decoded.warnings[:] = [w.replace("<bytes>", str(path)) for w in decoded.warnings]
    return from_log(decoded, device=device, prelude=prelude, path=str(path))


def _int_field(entry: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None:
            raise TraceError(f"{where}: no '{key}'")
        raise TraceError(f"{where}: '{key}' is {type(value).__name__} {value!r}, not an integer")
    return value


def _bad_entry(entry: dict[str, Any], keys: tuple[str, ...], where: str) -> NoReturn:
    """Raise TraceError naming the first of `keys` that is missing or not a sane integer."""
    for key in keys:
        value = entry.get(key, 0 if key == "stream" else None)
        if value is None:
            raise TraceError(f"{where}: no '{key}'")
        if type(value) is not int:
            raise TraceError(f"{where}: '{key}' is {type(value).__name__} {value!r}, not an integer")
        if key == "size" and not 0 <= value <= MAX_REQUEST:
            raise TraceError(f"{where}: size {value} is negative or larger than any device")
    raise TraceError(f"{where}: malformed entry")


_SEGMENT_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_ACTIVE_BLOCK_STATES = ("active_allocated", "active_awaiting_free", "active_pending_free")


def _pick_device(traces: list[Any], device: int | None, what: str) -> int:
    if device is not None:
        if not 0 <= device < len(traces):
            raise TraceError(f"{what}: no device {device} (the snapshot has traces for {len(traces)} devices)")
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
            if type(size) is not int or size < 0:
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
            end_reserved += _int_field(seg, "total_size", where)
            offset = _int_field(seg, "address", where, 0)
            seg_stream = _int_field(seg, "stream", where, 0) & _U64
            blocks = seg.get("blocks", [])
            if not isinstance(blocks, list):
                raise TraceError(f"{where}: 'blocks' is not a list")
            for b, block in enumerate(blocks):
                bwhere = f"{where}.blocks[{b}]"
                if not isinstance(block, dict):
                    raise TraceError(f"{bwhere} is a {type(block).__name__}, not a dict")
                bsize = _int_field(block, "size", bwhere)
                addr = _int_field(block, "address", bwhere, offset) & _U64
                offset = addr + bsize
                if prelude and block.get("state") in _ACTIVE_BLOCK_STATES and addr not in seen:
                    req = block.get("requested_size")
                    pre.append((addr, req if isinstance(req, int) and req > 0 else bsize, seg_stream))

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
    return trace


def live_peaks(events: np.ndarray) -> tuple[int, int]:
    """Peak bytes live in the trace: as requested, and with every size rounded up to 512 B."""
    size = events["size"].astype(np.int64)
    requested = int(np.cumsum(_live_deltas(events, size), dtype=np.int64).max(initial=0))
    rounded_sizes = np.maximum((size + 511) // 512 * 512, 512)
    rounded = int(np.cumsum(_live_deltas(events, rounded_sizes), dtype=np.int64).max(initial=0))
    return requested, rounded


def _live_deltas(events: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Change of live bytes at each event: +amount at an alloc, -amount of its alloc at a free.

    Matches replay.c: a free of an address that is not live changes nothing;
    an alloc of an address still live frees the old block first; a size-0
    alloc is no allocation. Vectorised: sort the events by (address, index);
    an event's predecessor in that order is the previous event on its address.
    """
    kind = events["kind"]
    out = np.zeros(len(events), dtype=np.int64)
    is_alloc = (kind == ALLOC) & (events["size"] > 0)
    out[is_alloc] = amount[is_alloc]
    rel = np.flatnonzero(is_alloc | (kind == FREE))
    if len(rel) < 2:
        return out
    addr = events["addr"][rel]
    order = rel[np.lexsort((rel, addr))]
    prev = order[:-1]
    cur = order[1:]
    closes = (events["addr"][cur] == events["addr"][prev]) & is_alloc[prev]  # prev is the live alloc
    out[cur[closes]] -= amount[prev[closes]]
    return out


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


# Log record kind -> replay event kind; 0: not an event.
_LOG_TO_EVENT = np.zeros(256, dtype=np.uint8)
_LOG_TO_EVENT[[records.ALLOC, records.FREE, records.PHASE_BEGIN, records.PHASE_END]] = [ALLOC, FREE, PHASE_BEGIN,
                                                                                      PHASE_END]


def from_log(log: Any, *, device: int | None = None, prelude: bool = True, path: str = "") -> Trace:
    """The trace in a decoded torchalloc log (`torchalloc.log.read_log`), vectorised.

    alloc/free records of one device become events with their stream and
    phase; phase_begin/phase_end records (process-wide) become phase events,
    so phase_arena sees the phases the run had. segment_alloc/segment_free
    give the reserved curve of the policy that recorded the run (reported
    beside the replayed ones as "recorded"). A log opened mid-run frees
    blocks it never saw allocated: with `prelude`, those are reconstructed
    as allocations at the start, from the free records' sizes.
    """
    what = path or getattr(log, "path", "") or "log"
    r = log.records
    kind = r["kind"]
    dev_of = r["device"]
    is_block = (kind == records.ALLOC) | (kind == records.FREE)
    if device is None:
        devices, counts = np.unique(dev_of[is_block], return_counts=True)
        device = int(devices[np.argmax(counts)]) if len(devices) else 0
    elif not (dev_of[is_block] == device).any():
        raise TraceError(f"{what}: no allocations on device {device}")
    on_dev = dev_of == device
    sel = (is_block & on_dev) | (kind == records.PHASE_BEGIN) | (kind == records.PHASE_END)
    picked = r[sel]
    if (picked["phase"] >= MAX_PHASES).any():
        raise TraceError(f"{what}: phase ids above {MAX_PHASES - 1}: not a log this version wrote")
    events = np.zeros(len(picked), dtype=EVENT_DTYPE)
    events["kind"] = _LOG_TO_EVENT[picked["kind"]]
    events["addr"] = np.where(events["kind"] <= FREE, picked["addr"], 0)
    events["size"] = np.where(events["kind"] == ALLOC, picked["size"], 0)
    events["stream"] = picked["stream"]
    events["phase"] = picked["phase"]
    if (events["size"] > MAX_REQUEST).any():
        raise TraceError(f"{what}: an allocation of more than {MAX_REQUEST} bytes: damaged log")

    # Frees of addresses the log never saw before: allocated before it was opened.
    first_free = _first_event_is_free(events)
    unknown = int(_unknown_frees(events))
    notes = [w for w in getattr(log, "warnings", [])]
    n_pre = 0
    if prelude and first_free.any():
        free_sizes = picked["size"][first_free]
        keep = (free_sizes > 0) & (free_sizes <= MAX_REQUEST)
        pre = np.zeros(int(keep.sum()), dtype=EVENT_DTYPE)
        pre["kind"] = ALLOC
        pre["addr"] = events["addr"][first_free][keep]
        pre["size"] = free_sizes[keep]
        pre["stream"] = events["stream"][first_free][keep]
        pre["phase"] = events["phase"][first_free][keep]
        n_pre = len(pre)
        events = np.concatenate((pre, events))
    if unknown:
        notes.append(f"{unknown} frees of addresses the log never saw allocated: it was opened mid-run")
    if n_pre:
        notes.append(f"{n_pre} allocations made before the log was opened were reconstructed at its start")
    if getattr(log, "truncated", False):
        notes.append("the log was cut short by its writer (log_max or a full disk): the trace ends early")
    peak_req, peak_rounded = live_peaks(events)
    trace = Trace(
        events=events,
        source="torchalloc-log",
        path=what,
        device=device,
        peak_requested=peak_req,
        peak_rounded=peak_rounded,
        unknown_frees=unknown,
        replaced_allocs=int(_replaced_allocs(events)),
        prelude=n_pre,
        phase_names=dict(getattr(log, "phase_names", {})),
        native_ooms=int(((kind == records.OOM) & on_dev).sum()),
        notes=notes,
    )
    # What the recording policy reserved: its segment records on this device.
    is_seg = ((kind == records.SEGMENT_ALLOC) | (kind == records.SEGMENT_FREE)) & on_dev
    if is_seg.any():
        before = np.cumsum(sel) - sel  # replay events before each record
        trace.native_pos = before[is_seg].astype(np.int64) + n_pre
        trace.native_delta = np.where(kind[is_seg] == records.SEGMENT_ALLOC, 1, -1) * r["size"][is_seg].astype(np.int64)
        trace.native_initial_reserved = 0
        trace.native_peak_reserved = max(0, int(np.cumsum(trace.native_delta).max()))
        policies = sorted({int(p) for p in r["policy"][is_seg]})
        names = ", ".join(records.POLICY_NAMES.get(p, f"policy {p}") for p in policies)
        trace.native_label = f"recorded ({names})"
        if unknown:
            trace.notes.append("the recorded reserved curve starts from 0 at the log's opening")
    return trace



def _address_order(events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the allocs (size > 0) and frees sorted by (address, index), and whether each
    follows an event on the same address."""
    kind = events["kind"]
    rel = np.flatnonzero(((kind == ALLOC) & (events["size"] > 0)) | (kind == FREE))
    order = rel[np.lexsort((rel, events["addr"][rel]))]
    same = np.zeros(len(order), dtype=bool)
    same[1:] = events["addr"][order[1:]] == events["addr"][order[:-1]]
    return order, same


def _first_event_is_free(events: np.ndarray) -> np.ndarray:
    """Mask over events: frees that are the first event on their address."""
    order, same = _address_order(events)
    out = np.zeros(len(events), dtype=bool)
    out[order[~same & (events["kind"][order] == FREE)]] = True
    return out


def _unknown_frees(events: np.ndarray) -> int:
    """Frees whose address is not live (as replay.c counts them)."""
    order, same = _address_order(events)
    if len(order) == 0:
        return 0
    kind = events["kind"][order]
    prev_alloc = np.zeros(len(order), dtype=bool)
    prev_alloc[1:] = same[1:] & (kind[:-1] == ALLOC)
    return int(((kind == FREE) & ~prev_alloc).sum())


def _replaced_allocs(events: np.ndarray) -> int:
    order, same = _address_order(events)
    if len(order) == 0:
        return 0
    kind = events["kind"][order]
    return int((same[1:] & (kind[1:] == ALLOC) & (kind[:-1] == ALLOC)).sum())


def from_arrays(
    kind: Any,
    addr: Any,
    size: Any,
    stream: Any = 0,
    phase: Any = 0,
    *,
    source: str = "synthetic",
) -> Trace:
    """A trace from parallel arrays (tests, benchmarks, other tools)."""
    kinds = np.asarray(kind, dtype=np.uint8)
    n = len(kinds)
    events = np.zeros(n, dtype=EVENT_DTYPE)
    events["kind"] = kinds
    events["addr"] = np.asarray(addr, dtype=np.uint64)
    events["size"] = np.asarray(size, dtype=np.uint64)
    events["stream"] = np.broadcast_to(np.asarray(stream, dtype=np.uint64), (n,))
    events["phase"] = np.broadcast_to(np.asarray(phase, dtype=np.uint16), (n,))
    bad = ~np.isin(kinds, (ALLOC, FREE, PHASE_BEGIN, PHASE_END))
    if bad.any():
        raise TraceError(f"event {int(np.flatnonzero(bad)[0])}: unknown kind {int(kinds[bad][0])}")
    if (events["phase"] >= MAX_PHASES).any():
        raise TraceError(f"phase ids must be below {MAX_PHASES}")
    peak_req, peak_rounded = live_peaks(events)
    return Trace(events=events, source=source, peak_requested=peak_req, peak_rounded=peak_rounded)
