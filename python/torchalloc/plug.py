"""Make torchalloc PyTorch's CUDA allocator: install(), pool(), patch_torch().

PyTorch can swap its allocator only before CUDA is initialised
(change_current_allocator raises "Can't swap an already initialized
allocator" afterwards). So:

- install() first thing in the program: every CUDA allocation goes through
  torchalloc, including the autograd engine's threads. It takes one of two
  routes (Installation.route says which, and why):
    "bridge": the C++ bridge (torchalloc.bridge) is PyTorch's allocator in
      full: OOM raises torch.OutOfMemoryError, CUDA graphs, torch.compile
      (reduce-overhead), cudnn.benchmark, torch.cuda.memory_* and MemPool
      work. The default wherever torch has CUDA and a C++ compiler exists.
    "plain": torch.cuda.memory.CUDAPluggableAllocator with our C entry
      points and hooks. Eager training works; an OOM stops the process with
      the reason (PyTorch cannot raise it on this route); torch.cuda.memory_*
      need patch_torch=True; graphs and the rest fail as under any
      pluggable allocator.
- pool() when CUDA is already up: a context in which this thread's
  allocations go to a torch.cuda.MemPool backed by torchalloc. Inside it the
  native caching allocator stays in charge and asks torchalloc only for
  whole segments, so torchalloc's statistics count segments there.

PyTorch keeps raw pointers into objects created here (the pluggable
allocator, the function pointers of our hooks, the MemPool); module-level
state keeps them alive for the life of the process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

from . import _cuda_init, _lib, stats
from ._device import DeviceLike, device_index

_CUDA_ALREADY_INITIALISED = (
    "torchalloc.install() must run before CUDA is initialised, and CUDA already is "
    "(something used it first: a tensor on 'cuda', .cuda(), torch.cuda.* queries, "
    "a library that touched the GPU at import). PyTorch cannot swap the allocator of "
    "an initialised CUDA runtime. Either call torchalloc.install() first thing in the "
    "program, before any CUDA use, or, for code that runs after CUDA init, route its "
    "allocations with `with torchalloc.pool(): ...`."
)

# The optional hooks of CUDAPluggableAllocator, each wired to the C function
# with the signature torch casts to:
#   set_init_fn             void(int)           CUDA init, with the device count
#   set_reset_fn            void(void)          torch.cuda.empty_cache()
#   set_memory_fraction_fn  void(double, int)   torch.cuda.set_per_process_memory_fraction()
#   set_record_stream_fn    void(void*, stream) tensor.record_stream(s)
_HOOKS = (
    ("set_init_fn", "torchalloc_init_devices"),
    ("set_reset_fn", "torchalloc_reset"),
    ("set_memory_fraction_fn", "torchalloc_set_memory_fraction"),
    ("set_record_stream_fn", "torchalloc_record_stream"),
)


@dataclasses.dataclass
class Installation:
    """What install() did; keeps alive what PyTorch points into."""

    library: Path
    conf: str
    route: str  # "bridge" or "plain"
    route_reason: str  # why this route was taken
    allocator: Any  # plain: torch.cuda.memory.CUDAPluggableAllocator; bridge: None (the bridge keeps its own)
    hooks: dict[str, str]  # plain: torch hook setter -> C function wired to it
    log: str | None = None
    patched_torch: bool = False
    bridge_path: Path | None = None
    bridge_build_seconds: float | None = None  # set when this install() built the bridge


_lock = threading.RLock()
_installed: Installation | None = None
_pool_allocator: Any = None  # CUDAPluggableAllocator behind pool()
_pool_mempool: Any = None  # the torch.cuda.MemPool shared by every pool()


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "1" if value else "0"
    elif isinstance(value, (int, str, os.PathLike)):
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    else:
        raise TypeError(f"torchalloc option {key!r}: expected a str, int or bool, got {type(value).__name__}")
    # A bracketed list (roundup_power2_divisions:[256:1,>:8]) keeps its commas: the library splits items outside
    # brackets only.
    listed = text.startswith("[") and text.endswith("]") and text.count("[") == 1 and text.count("]") == 1
    if ("," in text and not listed) or not text.strip():
        raise ValueError(f"torchalloc option {key!r}: value {text!r} cannot be written in TORCHALLOC_CONF")
    return text


def conf_string(**options: Any) -> str:
    """The TORCHALLOC_CONF text for `options` (None values left out), after $TORCHALLOC_CONF.

    The library reads key:value pairs in order and the last one wins, so the
    environment supplies defaults and keyword arguments override them.
    """
    parts = [os.environ.get("TORCHALLOC_CONF", "").strip(" ,")]
    for key, value in options.items():
        if value is None:
            continue
        if not key or ":" in key or "," in key:
            raise ValueError(f"invalid torchalloc option name {key!r}")
        parts.append(f"{key}:{_format_value(key, value)}")
    return ",".join(p for p in parts if p)


def configure(**options: Any) -> str:
    """(Re)initialise the library with `options` (TORCHALLOC_CONF keys); returns the conf used.

    Raises ValueError naming the key for an unknown key or a bad value, and
    when blocks are still live. Usable without torch, e.g.
    configure(backend="sim", sim_capacity="8GiB").
    """
    text = conf_string(**options)
    _lib.init(text)
    return text


def _for_route(text: str, route: str) -> str:
    """The conf with what the route decides and the user left unsaid.

    peers: the bridge hears PyTorch ask for peer access (enablePeerAccess,
    before the first copy between two GPUs) and grants just that pair; the
    plain route never hears it, so the library's default (peers:all) grants
    every GPU with a peer-to-peer path that the process allocates on.
    """
    keys = {item.split(":", 1)[0].strip() for item in text.split(",") if ":" in item}
    if route == "bridge" and "peers" not in keys:
        return ",".join(p for p in (text, "peers:asked") if p)
    return text


def _cuda_already_initialised() -> str:
    site = _cuda_init.first_init_site()
    if site is None:
        return _CUDA_ALREADY_INITIALISED
    return f"{_CUDA_ALREADY_INITIALISED}\nCUDA was first initialised here (innermost last):\n{site}"


# ---------------------------------------------------------------------------
# install()
# ---------------------------------------------------------------------------


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "torchalloc.install() and torchalloc.pool() need PyTorch with CUDA, which is not "
            "installed here. The statistics on the sim backend and the log analysis tools "
            "work without it."
        ) from e
    if not hasattr(torch.cuda, "memory") or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.cuda.memory.CUDAPluggableAllocator")
    return torch


def _make_allocator(torch: Any, malloc_function: str = "torchalloc_malloc") -> tuple[Any, dict[str, str]]:
    """A CUDAPluggableAllocator on our library with every hook this torch offers wired.

    torchalloc_malloc stops the process when it cannot allocate (as the only
    allocator, a NULL would become a tensor); behind a MemPool, where the
    native allocator asks us for segments and raises its own OutOfMemoryError
    on NULL, torchalloc_try_malloc is the one to use.
    """
    path = str(_lib.library_path())  # the very file our ctypes handle has open: one shared state
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, malloc_function, "torchalloc_free")
    raw = allocator.allocator()
    wired = {}
    for setter, c_function in _HOOKS:
        if hasattr(raw, setter):
            getattr(raw, setter)(_lib.function_address(c_function))
            wired[setter] = c_function
    return allocator, wired


def _open_log(path: str) -> None:
    if _lib.lib().torchalloc_log_open(os.fsencode(path)) != 0:
        raise RuntimeError(f"cannot open the torchalloc log {path!r}: {_lib.last_error()}")


def _choose_bridge(want: bool | None) -> tuple[Any, str]:
    """The loaded bridge (or None for the plain route) and why."""
    from . import bridge

    if want is False:
        return None, "install(bridge=False)"
    try:
        found = bridge.find_or_build()
    except bridge.BridgeUnavailable as e:
        if want:
            raise RuntimeError(f"torchalloc: install(bridge=True) but the C++ bridge is unavailable: {e}") from None
        return None, f"the C++ bridge is unavailable: {e}"
    how = f"built in {found.build_seconds:.1f} s" if found.built_now else f"loaded from {found.path}"
    return found, f"C++ bridge {how}"


def install(
    policy: str | None = None,
    log: str | os.PathLike[str] | None = None,
    stacks: bool | None = None,
    *,
    patch_torch: bool = False,
    bridge: bool | None = None,
    **conf: Any,
) -> Installation:
    """Load libtorchalloc and make it PyTorch's CUDA allocator. Call before any CUDA use.

    policy: "caching" (the default), "exact" or "phase_arena".
    Memory: where the driver has virtual memory management, caching and
    phase_arena run expandable:"reclaim" (the default: free granules move
    to where memory is needed, never waiting for the device); pass
    expandable="off" for PyTorch's segments byte for byte (`torchalloc info`
    says which mode is in force).
    log: write the event log to this file. stacks: record allocation stacks.
    conf: any other TORCHALLOC_CONF key (warn=0, log_max="1GiB", ...).
    Keyword arguments override $TORCHALLOC_CONF, which supplies the rest.
    bridge: None (default) uses the C++ bridge when it can be built or found
    and says in one line why not otherwise; True insists on it; False takes
    the plain route. $TORCHALLOC_BRIDGE=0 turns it off too.
    patch_torch: on the plain route, make torch.cuda.memory_allocated(),
    memory_stats() and friends answer from torchalloc (there they raise);
    the bridge answers them itself, so it is not needed there.

    Raises RuntimeError if CUDA is already initialised (see pool()),
    ValueError naming the key for a bad option. Calling it again with the
    same options returns the existing installation.
    """
    global _installed
    torch = _import_torch()
    log_path = None if log is None else os.fspath(log)
    log_via_api = log_path is not None and _lib.has("torchalloc_log_open")
    text = conf_string(
        policy=policy,
        stacks=stacks,
        log=None if log_via_api else log_path,
        **conf,
    )
    with _lock:
        if _installed is not None:
            if _installed.conf != _for_route(text, _installed.route) or _installed.log != log_path:
                raise RuntimeError(
                    f"torchalloc is already installed with {_installed.conf!r}; "
                    "a process's CUDA allocator can be chosen only once"
                )
            if patch_torch and _installed.route == "plain":
                _apply_torch_patch()
            return _installed
        if not torch.cuda.is_available():  # asks the driver; does not initialise torch's CUDA
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA GPU; torchalloc has nothing to manage")
        if torch.cuda.is_initialized():
            raise RuntimeError(_cuda_already_initialised())
        found, why = _choose_bridge(bridge)
        text = _for_route(text, "bridge" if found is not None else "plain")
        _lib.init(text)
        _follow_pytorch_settings(torch, text)
        if log_via_api:
            assert log_path is not None
            _open_log(log_path)
        if found is not None:
            from . import bridge as bridge_module

            bridge_module.install(found)
            _installed = Installation(_lib.library_path(), text, "bridge", why, None, {}, log_path,
                                      bridge_path=found.path,
                                      bridge_build_seconds=found.build_seconds if found.built_now else None)
            return _installed
        print(f"torchalloc: plain pluggable route ({why}); an out-of-memory stops the process, CUDA graphs, "
              "torch.compile(mode='reduce-overhead') and cudnn.benchmark do not work", file=sys.stderr)
        allocator, wired = _make_allocator(torch)
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise RuntimeError(f"{_cuda_already_initialised()} (torch said: {e})") from e
        _installed = Installation(_lib.library_path(), text, "plain", why, allocator, wired, log_path)
    if patch_torch:
        _apply_torch_patch()
    return _installed


# PyTorch's settings strings, newest name first (torch 2.11 reads the first one set).
PYTORCH_SETTINGS_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
ROUNDUP_KEY = "roundup_power2_divisions"


def _follow_pytorch_settings(torch: Any, conf: str) -> None:
    """Give torchalloc the PyTorch allocator settings it honours (roundup_power2_divisions).

    PyTorch parses its settings string (the environment's at start, then each
    torch.cuda.memory._set_allocator_settings call) into its own allocator's
    configuration and tells an installed allocator nothing, so: the
    environment's string now, unless TORCHALLOC_CONF or install() set the
    option (torchalloc's own configuration wins), and each string
    _set_allocator_settings accepts from now on (PyTorch checks it first: a
    string it refuses changes nothing here either).
    """
    if f"{ROUNDUP_KEY}:" not in conf.replace(" ", ""):
        for name in PYTORCH_SETTINGS_ENV:
            if os.environ.get(name) is not None:
                try:  # PyTorch reads it at CUDA's start and says what it refuses; install() must not fail first
                    _lib.set_allocator_settings(os.environ[name])
                except ValueError as e:
                    print(f"torchalloc: warning: ${name} not followed: {e}", file=sys.stderr)
                break
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    original = getattr(memory, "_set_allocator_settings", None)
    if original is None or getattr(original, "_torchalloc_follows", False):
        return

    def _set_allocator_settings(env: str) -> Any:
        result = original(env)
        _lib.set_allocator_settings(env)
        return result

    _set_allocator_settings._torchalloc_follows = True  # type: ignore[attr-defined]
    _set_allocator_settings.__doc__ = original.__doc__
    memory._set_allocator_settings = _set_allocator_settings


def installed() -> Installation | None:
    """The current installation, or None if install() has not run in this process."""
    return _installed


# ---------------------------------------------------------------------------
# pool()
# ---------------------------------------------------------------------------


def _shared_mempool(torch: Any) -> Any:
    global _pool_allocator, _pool_mempool
    with _lock:
        if _pool_mempool is None:
            allocator, _ = _make_allocator(torch, "torchalloc_try_malloc")
            _pool_allocator = allocator  # MemPool holds the C++ allocator; keep the wrapper too
            _pool_mempool = torch.cuda.MemPool(allocator.allocator())
    return _pool_mempool


@contextlib.contextmanager
def pool(device: DeviceLike = None) -> Iterator[Any]:
    """Route this thread's CUDA allocations through torchalloc, after CUDA init.

    Yields the torch.cuda.MemPool used (one per process, shared by every
    pool()). Tensors allocated inside stay valid after the block. Only the
    calling thread is routed: backward passes run on autograd's threads and
    allocate outside the pool. Under install() everything already goes
    through torchalloc and this is a no-op.
    """
    torch = _import_torch()
    if _installed is not None:
        yield None
        return
    mempool = _shared_mempool(torch)
    index = None if device is None else device_index(device)
    with torch.cuda.use_mem_pool(mempool, index):
        yield mempool


# ---------------------------------------------------------------------------
# patch_torch()
# ---------------------------------------------------------------------------

# torch.cuda.memory functions answered by ours, in both torch.cuda and
# torch.cuda.memory (torch.cuda re-exports them, so each name is bound twice).
_PATCHED_FUNCTIONS = {
    "memory_allocated": stats.memory_allocated,
    "max_memory_allocated": stats.max_memory_allocated,
    "memory_reserved": stats.memory_reserved,
    "max_memory_reserved": stats.max_memory_reserved,
    "memory_stats": stats.memory_stats,
    "memory_stats_as_nested_dict": stats.memory_stats_as_nested_dict,
    "reset_peak_memory_stats": stats.reset_peak_memory_stats,
    "reset_max_memory_allocated": stats.reset_max_memory_allocated,
    "reset_max_memory_cached": stats.reset_max_memory_cached,
    "reset_accumulated_memory_stats": stats.reset_accumulated_memory_stats,
    "memory_summary": stats.memory_summary,
}

# The torch._C entry points those functions end in, for callers that took a
# reference to torch's functions before the patch (from torch.cuda import
# memory_allocated): they look these up at call time. Each takes an int device.
_PATCHED_C_ENTRIES = {
    "_cuda_memoryStats": stats.memory_stats_as_nested_dict,
    "_cuda_resetPeakMemoryStats": stats.reset_peak_memory_stats,
    "_cuda_resetAccumulatedMemoryStats": stats.reset_accumulated_memory_stats,
    "_accelerator_getDeviceStats": stats.memory_stats_as_nested_dict,
    "_accelerator_resetPeakStats": stats.reset_peak_memory_stats,
    "_accelerator_resetAccumulatedStats": stats.reset_accumulated_memory_stats,
}

_originals: list[tuple[Any, str, Any]] = []  # (namespace, name, original) to undo
_fractions: dict[int, float] = {}  # device -> fraction last set through torch


def _fraction_functions(original_set: Any) -> dict[str, Any]:
    """set/get_per_process_memory_fraction that remember the fraction.

    torch forwards the setter to our hook, but its getter raises under a
    pluggable allocator ("does not yet support getMemoryFraction"), and the
    C library has no getter: remember what was set, 1.0 until then.
    """

    def set_per_process_memory_fraction(fraction: float, device: DeviceLike = None) -> None:
        original_set(fraction, device)
        _fractions[device_index(device)] = float(fraction)

    def get_per_process_memory_fraction(device: DeviceLike = None) -> float:
        return _fractions.get(device_index(device), 1.0)

    return {
        "set_per_process_memory_fraction": set_per_process_memory_fraction,
        "get_per_process_memory_fraction": get_per_process_memory_fraction,
    }


def patch_torch() -> None:
    """Make torch's memory statistics functions answer from torchalloc (idempotent).

    Under a pluggable allocator torch.cuda.memory_allocated(), memory_stats(),
    max_memory_allocated(), reset_peak_memory_stats() and memory_summary()
    raise "CUDAPluggableAllocator does not yet support getDeviceStats"; after
    this they return torchalloc's numbers with torch's keys, and accept the
    same device arguments (None, int, torch.device, "cuda:1").
    get_per_process_memory_fraction() (which raises too) returns the fraction
    last set with set_per_process_memory_fraction().
    """
    _apply_torch_patch()


def _apply_torch_patch() -> None:
    torch = _import_torch()
    with _lock:
        if _originals:
            return
        replacements = dict(_PATCHED_FUNCTIONS)
        if hasattr(torch.cuda.memory, "set_per_process_memory_fraction"):
            replacements.update(_fraction_functions(torch.cuda.memory.set_per_process_memory_fraction))
        for namespace in (torch.cuda, torch.cuda.memory):
            for name, ours in replacements.items():
                if hasattr(namespace, name):
                    _originals.append((namespace, name, getattr(namespace, name)))
                    setattr(namespace, name, ours)
        for name, ours in _PATCHED_C_ENTRIES.items():
            if hasattr(torch._C, name):
                _originals.append((torch._C, name, getattr(torch._C, name)))
                setattr(torch._C, name, ours)
        if _installed is not None:
            _installed.patched_torch = True


def unpatch_torch() -> None:
    """Restore every function patch_torch() replaced."""
    with _lock:
        while _originals:
            namespace, name, original = _originals.pop()
            setattr(namespace, name, original)
        if _installed is not None:
            _installed.patched_torch = False
