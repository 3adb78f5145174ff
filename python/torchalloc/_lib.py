"""Find, load and describe libtorchalloc.so through ctypes.

This is the only module that knows the C ABI (include/): every function's
argument and return types and the layout of the structs, those of the stats,
phase stats, replay result and OOM facts as the library lists their fields
(`layout()`). The rest of the package calls `lib()` (or `replay()`) and works
with Python values. The one mirror of a C struct elsewhere is
trace.EVENT_DTYPE, the numpy view of torchalloc_replay_event, whose size is
checked against REPLAY_EVENT_SIZE, which `replay()` checks against the
library's.

The library is looked up in this order:

1. ``$TORCHALLOC_LIB`` (an explicit choice wins, e.g. a sanitizer build),
2. the copy that ``pip install`` placed next to this file,
3. ``build/libtorchalloc.so`` and ``build-py/libtorchalloc.so`` in the
   source tree this package sits in (running from a checkout).

Loading it does not initialise anything: the library configures itself on
first use (from ``$TORCHALLOC_CONF``) or through ``torchalloc_init``.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, NamedTuple

LIB_NAME = "libtorchalloc.so"
ENV_LIB = "TORCHALLOC_LIB"

# Must equal TORCHALLOC_STATS_VERSION in torchalloc.h; bump both together.
STATS_VERSION = 4

# Mirrors TORCHALLOC_PHASE_NAME_MAX and TORCHALLOC_MAX_PHASES.
PHASE_NAME_MAX = 63
MAX_PHASES = 256

_REPO_ROOT = Path(__file__).resolve().parent.parent.parent


class LibraryError(RuntimeError):
    """libtorchalloc.so is missing, unloadable or does not match these bindings."""


class ReplayError(RuntimeError):
    """The C replay refused its input (the message is the library's)."""


class Stat(ctypes.Structure):
    """torchalloc_stat: one statistic, as torch's c10 Stat."""

    _fields_ = [(name, ctypes.c_int64) for name in ("current", "peak", "allocated", "freed")]


# The kinds of field the library's lists name (TORCHALLOC_STATS_FIELDS and its like) as ctypes; a pooled stat is
# one Stat per pool (TORCHALLOC_NPOOLS: all, small, large).
_FIELD_TYPES: dict[str, Any] = {"version": ctypes.c_int64, "pooled": Stat * 3, "torch": ctypes.c_int64,
                                "misuse": ctypes.c_int64, "torchalloc": ctypes.c_int64, "int64": ctypes.c_int64,
                                "uint64": ctypes.c_uint64, "double": ctypes.c_double}


class Layout(NamedTuple):
    """A C struct as the library lists its fields (name and kind a line): its ctypes mirror, each field's kind."""

    struct: type[ctypes.Structure]
    kinds: dict[str, str]  # field -> kind, in struct order

    def fields(self, *kinds: str) -> tuple[str, ...]:
        """The fields of these kinds in struct order; of torchalloc_stats: "pooled" (the torchalloc_stat arrays),
        "torch", "misuse", "torchalloc" (counters: those torch has too, misuse, the others)."""
        return tuple(name for name, kind in self.kinds.items() if kind in kinds)


_REINSTALL = "the library and the Python package come from different versions, reinstall both together"


def _layout(cdll: ctypes.CDLL, path: Path, c_name: str) -> Layout:
    """The mirror of C struct `c_name` built from the library's list of its fields (`{c_name}_fields`),
    checked against the library's `{c_name}_size` where it has one."""
    listing, size = getattr(cdll, f"{c_name}_fields", None), getattr(cdll, f"{c_name}_size", None)
    kinds = dict(line.split("\t") for line in listing().decode().splitlines()) if listing else {}
    if not kinds or not set(kinds.values()) <= set(_FIELD_TYPES):
        raise LibraryError(f"{path} does not list the fields of {c_name} as these bindings read them; {_REINSTALL}")
    struct = type(c_name, (ctypes.Structure,), {"_fields_": [(f, _FIELD_TYPES[k]) for f, k in kinds.items()]})
    if size is not None and size() != ctypes.sizeof(struct):
        raise LibraryError(f"{path}: sizeof({c_name}) is {size()} but its fields make {ctypes.sizeof(struct)} bytes "
                           f"here; {_REINSTALL}")
    return Layout(struct, kinds)


# Replay (allocator/runtime/replay.c). Must equal TORCHALLOC_REPLAY_VERSION in torchalloc_replay.h.
REPLAY_VERSION = 3
# TORCHALLOC_REPLAY_*: what a torchalloc_replay_event does.
REPLAY_ALLOC, REPLAY_FREE, REPLAY_PHASE_BEGIN, REPLAY_PHASE_END = 1, 2, 3, 4
# sizeof(torchalloc_replay_event); its fields are laid out by trace.EVENT_DTYPE (numpy, not runtime).
REPLAY_EVENT_SIZE = 32


# TORCHALLOC_OOM_*: the verdict of an out-of-memory failure.
OOM_VERDICTS = {0: "none", 1: "fragmentation", 2: "capacity", 3: "held elsewhere"}


OOM_OTHER_PHASES = 3  # TORCHALLOC_OOM_OTHER_PHASES
# TORCHALLOC_OOM_PHASE_ARENAS, _FREES_TO_DEVICE, _ROUTING: torchalloc_oom_detail.flags
OOM_PHASE_ARENAS, OOM_FREES_TO_DEVICE, OOM_ROUTING = 1, 2, 4


class OomDetail(ctypes.Structure):
    """torchalloc_oom_detail, field for field (96 bytes): what the advice rests on besides the facts."""

    _fields_ = [
        ("struct_size", ctypes.c_uint64),
        ("granule", ctypes.c_uint64),
        ("free_granules", ctypes.c_uint64),
        ("free_segments", ctypes.c_uint64),
        ("pinned_free", ctypes.c_uint64),
        ("pinning", ctypes.c_uint64),
        ("pinning_other", ctypes.c_uint64),
        ("other_bytes", ctypes.c_uint64 * OOM_OTHER_PHASES),
        ("other_phases", ctypes.c_uint16 * OOM_OTHER_PHASES),
        ("phase", ctypes.c_uint16),
        ("pinned_segments", ctypes.c_uint32),
        ("expandable", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("reserved_", ctypes.c_uint8 * 2),
    ]


OOM_DETAIL_FIELDS = tuple(name for name, _ in OomDetail._fields_ if name not in ("struct_size", "reserved_"))


_c_int, _c_int64, _c_size_t = ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
_c_char_p, _c_void_p, _c_double = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_double
_c_uint64 = ctypes.c_uint64

# name -> (restype, argtypes). cudaStream_t and pointers travel as void*, and so do the structs layout() builds.
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "torchalloc_malloc": (_c_void_p, [_c_size_t, _c_int, _c_void_p]),
    "torchalloc_free": (None, [_c_void_p, _c_size_t, _c_int, _c_void_p]),
    "torchalloc_init": (_c_int, [_c_char_p]),
    "torchalloc_teardown": (None, []),
    "torchalloc_last_error": (_c_char_p, []),
    "torchalloc_config_keys": (_c_char_p, []),
    "torchalloc_device_count": (_c_int, []),
    "torchalloc_set_policy": (_c_int, [_c_char_p]),
    "torchalloc_set_allocator_settings": (_c_int, [_c_char_p]),
    "torchalloc_policy_name": (_c_char_p, []),
    "torchalloc_stats_size": (_c_size_t, []),
    "torchalloc_stats_fields": (_c_char_p, []),
    "torchalloc_get_stats": (_c_int, [_c_int, _c_void_p]),
    "torchalloc_reset_peak_stats": (_c_int, [_c_int]),
    "torchalloc_reset_accumulated_stats": (_c_int, [_c_int]),
    "torchalloc_empty_cache": (_c_int64, [_c_int]),
    "torchalloc_record_stream": (None, [_c_void_p, _c_void_p]),
    "torchalloc_set_memory_fraction": (None, [_c_double, _c_int]),
    "torchalloc_reset": (None, []),
    "torchalloc_init_devices": (None, [_c_int]),
    "torchalloc_check_invariants": (_c_int, [_c_int]),
    "torchalloc_phase_begin": (_c_int, [_c_char_p]),
    "torchalloc_phase_end": (_c_int, [_c_char_p]),
    "torchalloc_phase_current": (_c_int, []),
    "torchalloc_phase_id": (_c_int, [_c_char_p]),
    "torchalloc_phase_name": (_c_char_p, [_c_int]),
    "torchalloc_phase_count": (_c_int, []),
    "torchalloc_get_phase_stats": (_c_int, [_c_int, _c_int, _c_void_p]),
    "torchalloc_phase_stats_fields": (_c_char_p, []),
    "torchalloc_arena_reserved": (_c_int64, [_c_int, _c_int]),
    "torchalloc_arena_trim": (_c_int64, [_c_int, _c_int]),
    "torchalloc_try_malloc": (_c_void_p, [_c_size_t, _c_int, _c_void_p]),
    "torchalloc_free_ptr": (_c_int, [_c_void_p]),
    "torchalloc_policy_names": (_c_char_p, []),
    "torchalloc_get_memory_fraction": (_c_double, [_c_int]),
    "torchalloc_largest_cached_block": (_c_int64, [_c_int]),
    "torchalloc_oom_summary": (_c_int, [_c_int, _c_char_p, _c_size_t]),
    "torchalloc_oom_report": (_c_int, [_c_int, _c_char_p, _c_size_t]),
    "torchalloc_oom_report_path": (_c_char_p, [_c_int]),
    "torchalloc_oom_facts_fields": (_c_char_p, []),
    "torchalloc_oom_verdict": (_c_int, [_c_void_p]),
    "torchalloc_last_oom": (_c_int, [_c_int, _c_void_p, ctypes.POINTER(_c_int)]),
    "torchalloc_last_oom_detail": (_c_int, [_c_int, ctypes.POINTER(OomDetail)]),
    "torchalloc_oom_advice": (_c_int, [_c_void_p, ctypes.POINTER(OomDetail),
                                       ctypes.POINTER(_c_char_p), _c_size_t, _c_char_p, _c_size_t]),
    # private pools: device, id0, id1 (PyTorch's MempoolId_t)
    "torchalloc_pool_retain": (_c_int, [_c_int, _c_uint64, _c_uint64]),
    "torchalloc_pool_release": (_c_int, [_c_int, _c_uint64, _c_uint64]),
    "torchalloc_pool_use_count": (_c_int, [_c_int, _c_uint64, _c_uint64]),
    "torchalloc_pool_flags": (_c_int, [_c_int, _c_uint64, _c_uint64, ctypes.c_uint, ctypes.c_uint]),
    "torchalloc_pool_malloc": (_c_void_p, [_c_size_t, _c_int, _c_void_p, _c_uint64, _c_uint64]),
    "torchalloc_pool_live_blocks": (_c_int64, [_c_int, _c_uint64, _c_uint64, _c_void_p, _c_size_t]),
    "torchalloc_pool_empty": (_c_int64, [_c_int, _c_uint64, _c_uint64]),
    "torchalloc_routing_begin": (_c_int, [_c_int]),
    "torchalloc_routing_end": (_c_int, [_c_int]),
    "torchalloc_sim_capture": (_c_int, [_c_int, _c_void_p, _c_int]),
    "torchalloc_sim_capture_violations": (_c_int64, [_c_int, _c_char_p, _c_size_t]),
    "torchalloc_sim_use": (_c_int, [_c_int, _c_void_p, _c_void_p, _c_size_t]),
    "torchalloc_sim_advance": (_c_int, [_c_int, _c_uint64]),
    "torchalloc_sim_physical": (_c_int, [_c_int, _c_void_p, ctypes.POINTER(_c_uint64)]),
    "torchalloc_segment_mode": (_c_int, [_c_int, ctypes.POINTER(_c_int)]),
    # memory shared beyond one device: peers and CUDA IPC
    "torchalloc_enable_peer_access": (_c_int, [_c_int, _c_int]),
    "torchalloc_peer_access": (_c_int, [_c_int, _c_int]),
    "torchalloc_ipc_share": (_c_int, [_c_void_p, _c_void_p, _c_size_t, ctypes.POINTER(_c_size_t),
                                      ctypes.POINTER(_c_size_t)]),
    "torchalloc_ipc_open": (_c_int, [_c_int, _c_char_p, _c_size_t, ctypes.POINTER(_c_void_p)]),
    "torchalloc_ipc_close": (_c_int, [_c_void_p]),
    "torchalloc_ipc_open_count": (_c_int64, [_c_int]),
    "torchalloc_sim_peer_use": (_c_int, [_c_int, _c_int, _c_void_p, _c_size_t]),
}

# Functions that newer builds have (the event log, the keys' description); bound when present, so
# this package works against a library built before they landed.
_OPTIONAL_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "torchalloc_mark": (_c_int, [_c_char_p]),
    "torchalloc_config_help": (_c_char_p, []),
    "torchalloc_phase_enter": (_c_int64, [_c_char_p, _c_size_t]),
    "torchalloc_phase_leave": (_c_int, [_c_int64]),
    "torchalloc_log_open": (_c_int, [_c_char_p]),
    "torchalloc_log_close": (None, []),
    "torchalloc_log_path": (_c_char_p, []),
    "torchalloc_module_name": (_c_int, [ctypes.c_uint32, _c_char_p]),
    "torchalloc_module_set": (None, [ctypes.c_uint32]),
    "torchalloc_module_tag": (_c_int, [_c_void_p, ctypes.c_uint32, _c_int]),
    "torchalloc_replay_event_size": (_c_size_t, []),
    "torchalloc_replay_result_size": (_c_size_t, []),
    "torchalloc_replay_result_fields": (_c_char_p, []),
    # events, n, policy, capacity, result, reserved series (or NULL), series length
    "torchalloc_replay": (_c_int, [_c_void_p, _c_size_t, _c_char_p, ctypes.c_uint64, _c_void_p, _c_void_p, _c_size_t]),
    # the same fed in pieces: begin(policy, capacity, n_total, series, series length) -> run; feed(run, events,
    # n) -> 0 go on, 1 stopped at an OOM, -1 error; end(run, result) -> 0 or -1, and the run freed
    "torchalloc_replay_begin": (_c_void_p, [_c_char_p, ctypes.c_uint64, _c_size_t, _c_void_p, _c_size_t]),
    "torchalloc_replay_feed": (_c_int, [_c_void_p, _c_void_p, _c_size_t]),
    "torchalloc_replay_end": (_c_int, [_c_void_p, _c_void_p]),
}

_lock = threading.Lock()
_loaded: tuple[ctypes.CDLL, Path] | None = None
_layouts: dict[str, Layout] = {}


def candidate_paths() -> list[Path]:
    """Where the library may be, most specific first (see the module docstring)."""
    paths = []
    env = os.environ.get(ENV_LIB)
    if env:
        paths.append(Path(env))
    paths.append(Path(__file__).resolve().parent / LIB_NAME)
    paths.append(_REPO_ROOT / "build" / LIB_NAME)
    paths.append(_REPO_ROOT / "build-py" / LIB_NAME)
    return paths


def find_library() -> Path:
    """The path of the library to load; LibraryError naming every place tried."""
    env = os.environ.get(ENV_LIB)
    if env and not Path(env).is_file():
        # An explicit choice that is wrong must not silently fall back.
        raise LibraryError(f"${ENV_LIB} is set to {env!r}, which is not a file")
    for path in candidate_paths():
        if path.is_file():
            return path.resolve()
    tried = "\n  ".join(str(p) for p in candidate_paths())
    raise LibraryError(
        f"cannot find {LIB_NAME}; looked in:\n  {tried}\n"
        "Install the package with `pip install .` from the repository, or build the library "
        "(cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF && cmake --build build) "
        f"or point ${ENV_LIB} at it."
    )


def _declare(cdll: ctypes.CDLL, path: Path) -> None:
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            raise LibraryError(f"{path} does not export {name}; it is not a torchalloc build these bindings match")
        fn.restype, fn.argtypes = restype, argtypes
    for name, (restype, argtypes) in _OPTIONAL_SIGNATURES.items():
        if hasattr(cdll, name):
            fn = getattr(cdll, name)
            fn.restype, fn.argtypes = restype, argtypes


def lib() -> ctypes.CDLL:
    """The loaded library with every prototype declared (loaded once per process)."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                path = find_library()
                try:
                    cdll = ctypes.CDLL(str(path))
                except OSError as e:
                    raise LibraryError(f"cannot load {path}: {e}") from e
                _declare(cdll, path)
                _layouts["torchalloc_stats"] = _layout(cdll, path, "torchalloc_stats")  # refuse a mismatch at once
                _loaded = (cdll, path)
    return _loaded[0]


def layout(c_name: str) -> Layout:
    """C struct `c_name` as the loaded library lists its fields: torchalloc_stats, torchalloc_phase_stats,
    torchalloc_replay_result, torchalloc_oom_facts."""
    if c_name not in _layouts:  # a race only builds it twice
        _layouts[c_name] = _layout(lib(), library_path(), c_name)
    return _layouts[c_name]


def is_loaded() -> bool:
    """Whether lib() has loaded the library in this process (without loading it)."""
    return _loaded is not None


def library_path() -> Path:
    """The path the library was loaded from (loading it if needed).

    PyTorch's CUDAPluggableAllocator must dlopen() this very path so that
    torch and these bindings share one copy of the allocator's state.
    """
    lib()
    assert _loaded is not None
    return _loaded[1]


def has(name: str) -> bool:
    """Whether the loaded library exports `name` (for functions newer than some builds)."""
    return hasattr(lib(), name)


def last_error() -> str:
    """Why the last failing control call on this thread failed ("" if none)."""
    raw = lib().torchalloc_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def function_address(name: str) -> int:
    """The address of C function `name`, as the integer PyTorch's set_*_fn hooks take."""
    address = ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value
    if not address:
        raise LibraryError(f"{name} has no address in {library_path()}")
    return address


def get_stats(device: int) -> ctypes.Structure:
    """One device's torchalloc_stats (layout()'s fields); ValueError for a device the library does not have."""
    out = layout("torchalloc_stats").struct()
    if lib().torchalloc_get_stats(device, ctypes.byref(out)) != 0:
        raise ValueError(last_error() or f"cannot read the stats of device {device}")
    if out.version != STATS_VERSION:
        raise LibraryError(f"{library_path()}: stats version {out.version}, these bindings read {STATS_VERSION}; "
                           f"{_REINSTALL}")
    return out


def get_phase_stats(device: int, phase: int) -> ctypes.Structure:
    """One phase's torchalloc_phase_stats on `device` (layout()'s fields); ValueError with the library's reason."""
    out = layout("torchalloc_phase_stats").struct()
    if lib().torchalloc_get_phase_stats(device, phase, ctypes.byref(out)) != 0:
        raise ValueError(last_error())
    return out


def init(conf: str | None) -> None:
    """torchalloc_init(conf); ValueError with the library's reason (it names the bad key)."""
    if lib().torchalloc_init(None if conf is None else conf.encode()) != 0:
        raise ValueError(last_error() or f"torchalloc_init({conf!r}) failed")


def set_allocator_settings(settings: str) -> None:
    """torchalloc_set_allocator_settings: a PyTorch settings string (roundup_power2_divisions is honoured);
    ValueError with the library's reason."""
    if lib().torchalloc_set_allocator_settings(settings.encode()) != 0:
        raise ValueError(last_error() or f"torchalloc_set_allocator_settings({settings!r}) failed")


def teardown() -> None:
    """Forget every block and segment (tests and tools only: torch must hold none of ours)."""
    lib().torchalloc_teardown()


# TORCHALLOC_CONF `expandable`, by number (config.c's names): how caching and phase_arena use the device.
EXPANDABLE_MODES = ("off", "on", "compact", "reclaim")


def segment_mode(device: int) -> tuple[str, str]:
    """(the mode in force, the mode the configuration asked for) on `device`, by name: they differ
    where the device has no virtual memory management (ordinary segments, "off", then)."""
    asked = ctypes.c_int(-1)
    mode = lib().torchalloc_segment_mode(device, ctypes.byref(asked))
    if mode < 0:
        raise ValueError(last_error() or f"no device {device}")
    return EXPANDABLE_MODES[mode], EXPANDABLE_MODES[asked.value]


def config_keys() -> list[str]:
    """The keys TORCHALLOC_CONF accepts."""
    keys: bytes = lib().torchalloc_config_keys()
    return keys.decode().split()


def config_help() -> list[dict[str, str]]:
    """Each TORCHALLOC_CONF key as the parser's table describes it (config.c), in torchalloc_config_keys' order:
    key, values (worded as its error message words them), default ("none": off) and a line of help."""
    if not has("torchalloc_config_help"):
        raise LibraryError(f"{library_path()} does not describe its keys: it was built before torchalloc_config_help")
    text: bytes = lib().torchalloc_config_help()
    return [dict(zip(("key", "values", "default", "help"), line.split("\t"))) for line in text.decode().splitlines()]


def _replay_result(cdll: ctypes.CDLL) -> ctypes.Structure:
    """A torchalloc_replay_result to fill; LibraryError for a library without replay, or whose replay event
    differs from trace.EVENT_DTYPE's."""
    if not hasattr(cdll, "torchalloc_replay"):
        raise LibraryError(f"{library_path()} has no torchalloc_replay: it was built before replay; rebuild it")
    if cdll.torchalloc_replay_event_size() != REPLAY_EVENT_SIZE:
        raise LibraryError(f"{library_path()}: torchalloc_replay_event differs from these bindings'; {_REINSTALL}")
    return layout("torchalloc_replay_result").struct()


def _replay_result_dict(out: ctypes.Structure) -> dict[str, Any]:
    result = {name: getattr(out, name) for name, _ in out._fields_}
    if result["version"] != REPLAY_VERSION:
        raise LibraryError(f"replay result version {result['version']}, these bindings read {REPLAY_VERSION}")
    return result


def replay(
    events: int | None, count: int, policy: str, capacity: int, series: int | None = None, series_len: int = 0
) -> dict[str, Any]:
    """torchalloc_replay: `count` torchalloc_replay_event structs at address `events` through `policy`
    on a simulated device of `capacity` bytes (0: unlimited). With `series` (the address of
    `series_len` int64s), the library fills in the highest reserved bytes per bucket of events.

    Returns the torchalloc_replay_result as a dict; ReplayError with the library's reason when it
    refuses the input. ctypes releases the GIL for the call, so replays on threads run in parallel.
    """
    cdll = lib()
    out = _replay_result(cdll)
    if cdll.torchalloc_replay(events, count, policy.encode(), capacity, ctypes.byref(out), series,
                              series_len if series is not None else 0) != 0:
        raise ReplayError(last_error() or f"torchalloc_replay({policy!r}) failed")
    return _replay_result_dict(out)


class ReplayRun:
    """torchalloc_replay_begin / _feed / _end: a replay fed in pieces (a trace larger than memory).

        run = ReplayRun("caching", capacity, n_total)     # n_total: events that will be fed (for a series)
        for piece in pieces: 
            if run.feed(address, count): break           # True: stopped at an OOM, later events are ignored
        result = run.end()                                # the torchalloc_replay_result as a dict

    `feed` releases the GIL (ctypes), so runs on threads go on in parallel;
    each run is used from one thread at a time. ReplayError with the
    library's reason for a malformed event or an unknown policy.
    """

    def __init__(self, policy: str, capacity: int, n_total: int = 0, series: int | None = None,
                 series_len: int = 0) -> None:
        cdll = lib()
        _replay_result(cdll)  # refuses a library whose replay differs before anything runs
        if not hasattr(cdll, "torchalloc_replay_begin"):
            raise LibraryError(f"{library_path()} has no torchalloc_replay_begin: rebuild the library")
        self._cdll = cdll
        self._policy = policy
        self._run = cdll.torchalloc_replay_begin(policy.encode(), capacity, n_total, series,
                                                 series_len if series is not None else 0)
        if not self._run:
            raise ReplayError(last_error() or f"torchalloc_replay_begin({policy!r}) failed")

    def feed(self, events: int | None, count: int) -> bool:
        """Replay `count` events at address `events`; True once the replay stopped at an OOM."""
        status = self._cdll.torchalloc_replay_feed(self._run, events, count)
        if status < 0:
            self.close()
            raise ReplayError(last_error() or f"torchalloc_replay_feed({self._policy!r}) failed")
        return status == 1

    def end(self) -> dict[str, Any]:
        out = _replay_result(self._cdll)
        run, self._run = self._run, None
        if run is None or self._cdll.torchalloc_replay_end(run, ctypes.byref(out)) != 0:
            raise ReplayError(last_error() or f"torchalloc_replay_end({self._policy!r}) failed")
        return _replay_result_dict(out)

    def close(self) -> None:
        """Free the run without its result (after an error, or when abandoned)."""
        run, self._run = self._run, None
        if run is not None:
            self._cdll.torchalloc_replay_end(run, None)

    def __del__(self) -> None:
        self.close()


def policy_names() -> list[str]:
    """Every policy's name in id order: the registry the C library was built with."""
    names: bytes = lib().torchalloc_policy_names()
    return names.decode().split()


def _text(function: Any, device: int) -> str:
    """A text the library writes with snprintf's convention (returns the length it needed)."""
    n = function(device, None, 0)
    if n < 0:
        raise ValueError(last_error() or f"no device {device}")
    buf = ctypes.create_string_buffer(n + 1)
    function(device, buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def oom_summary(device: int) -> str:
    """The last out-of-memory failure on `device` in one paragraph, "" when there was none."""
    return _text(lib().torchalloc_oom_summary, device)


def oom_report(device: int) -> str:
    """The full report of that failure, "" when there was none."""
    return _text(lib().torchalloc_oom_report, device)


def oom_report_path(device: int) -> str:
    """Where that report was written ("" when nowhere)."""
    raw = lib().torchalloc_oom_report_path(device)
    return raw.decode("utf-8", "replace") if raw else ""


def last_oom(device: int) -> tuple[dict[str, int], str] | None:
    """The last failure's numbers and verdict name, None when there was none."""
    facts, verdict = _oom_facts({}), _c_int(0)
    if lib().torchalloc_last_oom(device, ctypes.byref(facts), ctypes.byref(verdict)) != 0:
        raise ValueError(last_error() or f"no device {device}")
    if verdict.value == 0:
        return None
    return {name: int(getattr(facts, name)) for name, _ in facts._fields_}, OOM_VERDICTS[verdict.value]


def _oom_facts(facts: dict[str, int]) -> ctypes.Structure:
    """A torchalloc_oom_facts holding these numbers (its fields: layout("torchalloc_oom_facts"); missing ones 0)."""
    struct = layout("torchalloc_oom_facts").struct
    unknown = set(facts) - {name for name, _ in struct._fields_}
    if unknown:
        raise TypeError(f"unknown OOM facts {sorted(unknown)}")
    return struct(**{k: int(v) for k, v in facts.items()})


def _detail_dict(d: OomDetail) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in OOM_DETAIL_FIELDS:
        value = getattr(d, name)
        out[name] = [int(v) for v in value] if name in ("other_bytes", "other_phases") else int(value)
    return out


def last_oom_detail(device: int) -> dict[str, Any] | None:
    """The last failure's detail (OOM_DETAIL_FIELDS), None when there was none."""
    d = OomDetail(struct_size=ctypes.sizeof(OomDetail))
    if lib().torchalloc_last_oom_detail(device, ctypes.byref(d)) != 0:
        raise ValueError(last_error() or f"no device {device}")
    return _detail_dict(d) if d.struct_size == ctypes.sizeof(OomDetail) and last_oom(device) else None


def oom_advice(facts: dict[str, int], detail: dict[str, Any] | None = None,
               phase_names: dict[int, str] | None = None) -> str:
    """The advice the library gives these numbers, one "N. ..." line each, as the failure's summary has
    them: `facts` as torchalloc_oom_facts' fields, `detail` as OOM_DETAIL_FIELDS (missing ones 0), phase
    names by id."""
    f = _oom_facts(facts)
    d = None
    if detail is not None:
        unknown = set(detail) - set(OOM_DETAIL_FIELDS)
        if unknown:
            raise TypeError(f"unknown OOM detail fields {sorted(unknown)}")
        d = OomDetail(struct_size=ctypes.sizeof(OomDetail))
        for name, value in detail.items():
            if name in ("other_bytes", "other_phases"):
                getattr(d, name)[:] = [int(v) for v in value][:OOM_OTHER_PHASES] + [0] * (OOM_OTHER_PHASES - len(value))
            else:
                setattr(d, name, int(value))
    names_by_id = phase_names or {}
    n = max(names_by_id, default=-1) + 1
    names = (_c_char_p * max(n, 1))(*[names_by_id[i].encode() if i in names_by_id else None for i in range(n)])
    cdll = lib()
    args = (ctypes.byref(f), ctypes.byref(d) if d is not None else None, names, n)
    size = cdll.torchalloc_oom_advice(*args, None, 0)
    if size < 0:
        raise LibraryError("torchalloc_oom_advice refused its arguments")
    buf = ctypes.create_string_buffer(size + 1)
    cdll.torchalloc_oom_advice(*args, buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def oom_verdict(**facts: int) -> str:
    """The verdict name the library gives these numbers (torchalloc_oom_facts' fields; missing ones are 0:
    unknown)."""
    code = lib().torchalloc_oom_verdict(ctypes.byref(_oom_facts(facts)))
    return OOM_VERDICTS.get(code, f"verdict {code}")
