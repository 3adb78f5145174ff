"""The C++ bridge: build it, find it, load it.

The bridge (bridge/torchalloc_bridge.cpp) is one small C++ file compiled
against the installed torch's own headers. Installed through it, torchalloc
is PyTorch's allocator in full: an out-of-memory raises
``torch.OutOfMemoryError``, CUDA graphs, ``torch.compile(mode=
"reduce-overhead")``, ``cudnn.benchmark``, ``torch.cuda.memory_*`` and
``torch.cuda.MemPool`` work. Without it (no C++ compiler, torch without
CUDA) install() falls back to the plain CUDAPluggableAllocator route.

Where the built bridge comes from, first found wins:

1. ``$TORCHALLOC_BRIDGE`` (a path to a built bridge, or ``0`` to never use one);
2. the copy ``pip install`` built next to this file when torch was
   importable then (kept only if built for this very torch);
3. the per-user cache, ``$TORCHALLOC_CACHE`` or ``~/.cache/torchalloc``,
   keyed by torchalloc's version, torch's version, its CUDA version and the
   source's hash: built there on first use (once; later starts load it), under
   a file lock so parallel ranks build it once.

Runtime module: it imports torch only inside the functions that need it,
and no numpy.
"""
from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import _lib

BRIDGE_NAME = "libtorchalloc_bridge.so"
ENV_BRIDGE = "TORCHALLOC_BRIDGE"
ENV_CACHE = "TORCHALLOC_CACHE"
SOURCE_RELATIVE = Path("bridge") / "torchalloc_bridge.cpp"
HEADER_RELATIVE = Path("include") / "torchalloc.h"
# Headers only the bridge includes (beside it in bridge/): part of its source and of the cache key.
BRIDGE_HEADERS = tuple(Path("bridge") / name for name in ("bridge_core.h", "bridge_foreign.h", "bridge_history.h"))

_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_ROOT = _PACKAGE_DIR.parent.parent


class BridgeUnavailable(RuntimeError):
    """The bridge cannot be used here; the message says why in one line."""


@dataclasses.dataclass(frozen=True)
class Bridge:
    """A loaded bridge: its path, and whether it was built just now (and how long that took)."""

    path: Path
    handle: ctypes.CDLL
    built_now: bool = False
    build_seconds: float = 0.0


# ---------------------------------------------------------------------------
# Where things are
# ---------------------------------------------------------------------------


def source_root() -> Path:
    """The directory holding bridge/torchalloc_bridge.cpp and include/torchalloc.h.

    In a checkout, the repository; in an installed package, the copy
    setup.py put in the package (bridge_src/).
    """
    for root in (_PACKAGE_DIR / "bridge_src", _REPO_ROOT):
        if (root / SOURCE_RELATIVE).is_file() and (root / HEADER_RELATIVE).is_file():
            return root
    raise BridgeUnavailable(f"the bridge's source ({SOURCE_RELATIVE}) is not in this installation")


def source_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for relative in (SOURCE_RELATIVE, HEADER_RELATIVE, *BRIDGE_HEADERS):
        digest.update((root / relative).read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchalloc"


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise BridgeUnavailable(f"torch is not importable ({e})") from None
    if not torch.version.cuda:
        raise BridgeUnavailable(f"torch {torch.__version__} is built without CUDA")
    return torch


def cache_key(torch: Any, root: Path) -> str:
    from . import __version__

    return f"torchalloc{__version__}-torch{torch.__version__}-cuda{torch.version.cuda}-{source_hash(root)}"


def cached_path(torch: Any) -> Path:
    return cache_dir() / cache_key(torch, source_root()) / BRIDGE_NAME


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------


def compiler() -> str:
    """The C++ compiler to use ($CXX, else c++ or g++), or BridgeUnavailable."""
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return str(shutil.which(name))
    raise BridgeUnavailable("no C++ compiler (set $CXX, or install g++)")


def build_command(torch: Any, out: Path) -> list[str]:
    """The compiler command that builds the bridge against this torch."""
    from torch.utils import cpp_extension

    root = source_root()
    cuda_home = cpp_extension.CUDA_HOME
    if not cuda_home or not (Path(cuda_home) / "include" / "cuda_runtime_api.h").is_file():
        raise BridgeUnavailable("the CUDA toolkit's headers are not found (set $CUDA_HOME)")
    includes = [*cpp_extension.include_paths(), str(Path(cuda_home) / "include")]
    torch_lib = str(Path(torch.__file__).resolve().parent / "lib")
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    command = [compiler(), "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f'-DTORCHALLOC_BRIDGE_TORCH_VERSION="{torch.__version__}"']
    for include in includes:
        command += ["-isystem", include]
    command += [str(root / SOURCE_RELATIVE), "-o", str(out), f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}",
                "-ltorch_cuda", "-lc10_cuda", "-lc10", "-ltorch_cpu"]
    return command


def build(out: Path, *, quiet: bool = False) -> float:
    """Compile the bridge to `out` (atomically: a half-written file is never seen). Returns the seconds taken."""
    torch = _torch()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        partial = Path(tmp) / BRIDGE_NAME
        command = build_command(torch, partial)
        if not quiet:
            print(f"torchalloc: building the C++ bridge for torch {torch.__version__} (once; later starts reuse "
                  f"{out.parent})", file=sys.stderr, flush=True)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise BridgeUnavailable(f"building the bridge failed ({command[0]} exit {done.returncode}):\n{tail}")
        os.replace(partial, out)
    if not quiet:
        print(f"torchalloc: built the C++ bridge in {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


# ---------------------------------------------------------------------------
# Finding and loading
# ---------------------------------------------------------------------------


def _load(path: Path, torch: Any) -> ctypes.CDLL:
    try:
        handle = ctypes.CDLL(str(path))
    except OSError as e:
        raise BridgeUnavailable(f"cannot load {path}: {e}") from None
    handle.torchalloc_bridge_torch_version.restype = ctypes.c_char_p
    built_for = handle.torchalloc_bridge_torch_version().decode()
    if built_for != torch.__version__:
        raise BridgeUnavailable(f"{path} was built for torch {built_for}, this is torch {torch.__version__}")
    handle.torchalloc_bridge_install.restype = ctypes.c_int
    handle.torchalloc_bridge_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    return handle


def _packaged() -> Path | None:
    path = _PACKAGE_DIR / BRIDGE_NAME
    return path if path.is_file() else None


def find_or_build(*, build_if_missing: bool = True) -> Bridge:
    """The bridge for this torch, loaded; built into the cache first if needed."""
    env = os.environ.get(ENV_BRIDGE, "").strip()
    if env == "0":
        raise BridgeUnavailable(f"${ENV_BRIDGE}=0 turns the bridge off")
    torch = _torch()
    if env and env != "1":
        return Bridge(Path(env), _load(Path(env), torch))
    packaged = _packaged()
    if packaged is not None:
        try:
            return Bridge(packaged, _load(packaged, torch))
        except BridgeUnavailable:
            pass  # built for another torch: fall through to the cache
    path = cached_path(torch)
    if path.is_file():
        return Bridge(path, _load(path, torch))
    if not build_if_missing:
        raise BridgeUnavailable(f"not built yet for torch {torch.__version__} (it would be built in {path.parent})")
    compiler()  # say "no compiler" before taking the lock
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:  # parallel ranks: one builds, the others wait and load
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return Bridge(path, _load(path, torch))
        seconds = build(path)
    return Bridge(path, _load(path, torch), built_now=True, build_seconds=seconds)


def install(bridge: Bridge) -> None:
    """Make the bridge PyTorch's CUDA allocator, backed by the library _lib loaded (must precede CUDA init)."""
    err = ctypes.create_string_buffer(1024)
    core = os.fsencode(str(_lib.library_path()))
    if bridge.handle.torchalloc_bridge_install(core, err, len(err)) != 0:
        raise RuntimeError(f"torchalloc: the C++ bridge could not be installed: {err.value.decode(errors='replace')}")


def describe() -> dict[str, Any]:
    """What install() would do about the bridge here, for `torchalloc info` (builds nothing)."""
    try:
        found = find_or_build(build_if_missing=False)
        return {"bridge": "available", "bridge_path": str(found.path)}
    except BridgeUnavailable as e:
        reason = str(e)
    try:
        torch = _torch()
        compiler()
        source_root()
        return {"bridge": "will be built on first install()", "bridge_path": str(cached_path(torch)),
                "bridge_reason": reason}
    except BridgeUnavailable as e:
        return {"bridge": "unavailable", "bridge_reason": str(e)}
