"""Configuration and install() checks that need neither torch nor a GPU."""
from __future__ import annotations

import ctypes
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchalloc
from torchalloc import _lib, plug


def test_conf_string_formats_and_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHALLOC_CONF", "policy:exact,warn:0")
    text = plug.conf_string(policy="caching", stacks=True, log=None, sim_capacity="2GiB", stack_depth=8)
    # The environment first, keyword arguments after: the library's last key wins.
    assert text == "policy:exact,warn:0,policy:caching,stacks:1,sim_capacity:2GiB,stack_depth:8"
    monkeypatch.delenv("TORCHALLOC_CONF")
    assert plug.conf_string(stacks=False) == "stacks:0"
    assert plug.conf_string(log=Path("/tmp/a.log")) == "log:/tmp/a.log"


def test_conf_string_rejects_unrepresentable_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHALLOC_CONF", raising=False)
    with pytest.raises(ValueError, match="'log'"):
        plug.conf_string(log="/tmp/a,b.log")
    with pytest.raises(TypeError, match="'warn'"):
        plug.conf_string(warn=1.5)


def test_configure_bad_key_names_the_key(sim: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHALLOC_CONF", raising=False)
    with pytest.raises(ValueError, match="unknown key 'polcy'"):
        torchalloc.configure(backend="sim", polcy="caching")
    with pytest.raises(ValueError, match="key 'policy'"):
        torchalloc.configure(backend="sim", policy="best")
    with pytest.raises(ValueError, match="key 'sim_capacity'"):
        torchalloc.configure(backend="sim", sim_capacity="lots")
    # A rejected configuration leaves the working one in place.
    assert sim.torchalloc_malloc(4096, 0, None)


def test_configure_switches_policy(sim: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHALLOC_CONF", raising=False)
    torchalloc.configure(backend="sim", policy="exact", sim_capacity="1GiB")
    assert sim.torchalloc_policy_name() == b"exact"


def test_configure_refuses_while_blocks_are_live(sim: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHALLOC_CONF", raising=False)
    assert sim.torchalloc_malloc(4096, 0, None)
    with pytest.raises(ValueError, match="still allocated"):
        torchalloc.configure(backend="sim")


def test_install_without_torch_says_what_is_missing(library_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(ImportError, match="need PyTorch with CUDA"):
        torchalloc.install()
    with pytest.raises(ImportError, match="need PyTorch with CUDA"):
        with torchalloc.pool():
            pass


def test_import_never_imports_torch_nor_loads_the_library() -> None:
    code = (
        "import sys, torchalloc; torchalloc.memory_stats; torchalloc.install; torchalloc.track; "
        "import torchalloc._lib as L; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert L._loaded is None, 'library loaded'"
    )
    python_dir = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=python_dir)


def test_lazy_exports_resolve_to_functions() -> None:
    for name in ("install", "pool", "track", "phase", "memory_stats"):
        assert callable(getattr(torchalloc, name)), name
    # Loading a submodule must not shadow a function of the same package namespace.
    importlib.import_module("torchalloc.plug")
    importlib.import_module("torchalloc.tracking")
    assert torchalloc.install is plug.install
    with pytest.raises(AttributeError):
        torchalloc.no_such_thing  # noqa: B018


def test_library_path_and_function_addresses(library_path: Path) -> None:
    assert _lib.library_path() == library_path.resolve()
    for name in ("torchalloc_reset", "torchalloc_record_stream", "torchalloc_set_memory_fraction"):
        assert _lib.function_address(name) > 0


def test_wrong_env_library_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHALLOC_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(_lib.LibraryError, match="not a file"):
        _lib.find_library()


def test_the_bridge_route_grants_peer_access_as_pytorch_asks() -> None:
    """peers:asked on the bridge (it hears enablePeerAccess), the library's default on the plain route; a value
    the user gave is kept on either."""
    from torchalloc import plug

    assert plug._for_route("policy:caching", "bridge") == "policy:caching,peers:asked"
    assert plug._for_route("", "bridge") == "peers:asked"
    assert plug._for_route("policy:caching", "plain") == "policy:caching"
    assert plug._for_route("peers:all,warn:0", "bridge") == "peers:all,warn:0"


def _allocated_for(lib: ctypes.CDLL, size: int) -> int:
    """The block bytes a request of `size` gets on device 0 (freed again)."""
    before = _lib.get_stats(0).allocated_bytes[0].current
    ptr = lib.torchalloc_malloc(size, 0, None)
    assert ptr
    got = _lib.get_stats(0).allocated_bytes[0].current - before
    lib.torchalloc_free(ptr, size, 0, None)
    return got


class _FakeMemory:
    """torch.cuda.memory's _set_allocator_settings as PyTorch has it: it parses (here: refuses "bad") and
    tells no installed allocator."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def _set_allocator_settings(self, env: str) -> None:
        if env == "bad":
            raise RuntimeError("Unrecognized key 'bad' in CUDA allocator config.")
        self.seen.append(env)


def _fake_torch() -> Any:
    import types

    memory = _FakeMemory()
    return types.SimpleNamespace(cuda=types.SimpleNamespace(memory=memory))


def test_pytorch_settings_reach_torchalloc(sim: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,roundup_power2_divisions:4")
    torch = _fake_torch()
    memory = torch.cuda.memory
    plug._follow_pytorch_settings(torch, "backend:sim")
    assert _allocated_for(sim, 9000) == 10240  # 4 divisions: steps of 2 KiB between 8 KiB and 16 KiB
    assert _allocated_for(sim, 88080384) == 100663296  # 84 MiB -> 96 MiB, as test_allocator_settings expects
    memory._set_allocator_settings("roundup_power2_divisions:[2:4,>:16]")
    assert memory.seen == ["roundup_power2_divisions:[2:4,>:16]"]  # PyTorch's own parser still runs first
    assert _allocated_for(sim, 629145600) == 637534208  # 600 MiB in 16 steps between 512 MiB and 1 GiB
    with pytest.raises(RuntimeError, match="Unrecognized key"):
        memory._set_allocator_settings("bad")
    assert _allocated_for(sim, 629145600) == 637534208  # what PyTorch refused changed nothing
    memory._set_allocator_settings("")  # PyTorch resets the option on each string
    assert _allocated_for(sim, 9000) == 9216 and _allocated_for(sim, 629145600) == 629145600
    plug._follow_pytorch_settings(torch, "backend:sim")  # a second install() does not wrap the wrapper
    memory._set_allocator_settings("roundup_power2_divisions:8")
    assert memory.seen[-1] == "roundup_power2_divisions:8" and len(memory.seen) == 3


def test_torchalloc_conf_wins_over_the_environment(sim: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "roundup_power2_divisions:4")
    conf = plug.conf_string(roundup_power2_divisions="[256:1,>:2]")
    assert conf.endswith("roundup_power2_divisions:[256:1,>:2]")
    torchalloc.configure(backend="sim", warn=0, expandable="off", roundup_power2_divisions="[256:1,>:2]")
    plug._follow_pytorch_settings(_fake_torch(), conf)
    assert _allocated_for(sim, 9000) == 9216  # 512 B rounding below 256 MiB: not the environment's 4
    assert _allocated_for(sim, 629145600) == 805306368  # 2 divisions from 256 MiB up
